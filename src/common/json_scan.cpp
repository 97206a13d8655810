#include "sluice/common/json_scan.hpp"

#include <cstdio>
#include <cstring>
#include <string>

namespace sluice {
namespace {

class Scanner {
 public:
  explicit Scanner(std::string_view text, std::size_t pos = 0) : text_(text), pos_(pos) {}

  void skip_whitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool consume(char c) {
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool at(char c) {
    skip_whitespace();
    return pos_ < text_.size() && text_[pos_] == c;
  }

  // On success pos_ is just past the closing quote.
  // A quote ends the string unless an odd run of backslashes precedes it;
  // memchr finds the quotes faster than a loop looks at every byte.
  bool skip_string() {
    if (pos_ >= text_.size() || text_[pos_] != '"') return false;
    const char* const begin = text_.data();
    const char* const end = begin + text_.size();
    const char* from = begin + pos_ + 1;
    while (const auto* quote = static_cast<const char*>(std::memchr(from, '"', end - from))) {
      const char* escape = quote;
      while (escape > from && escape[-1] == '\\') --escape;
      if ((quote - escape) % 2 == 0) {
        pos_ = static_cast<std::size_t>(quote + 1 - begin);
        return true;
      }
      from = quote + 1;
    }
    pos_ = text_.size();
    return false;
  }

  // Skips any value; nesting is tracked with a counter because only brackets
  // and strings matter for finding where the value ends.
  bool skip_value() {
    skip_whitespace();
    if (pos_ >= text_.size()) return false;
    char c = text_[pos_];
    if (c == '"') return skip_string();
    if (c == '{' || c == '[') {
      std::size_t depth = 0;
      while (pos_ < text_.size()) {
        char d = text_[pos_];
        if (d == '"') {
          if (!skip_string()) return false;
          continue;
        }
        if (d == '{' || d == '[') ++depth;
        if (d == '}' || d == ']') {
          if (--depth == 0) {
            ++pos_;
            return true;
          }
        }
        ++pos_;
      }
      return false;
    }
    // number, true, false, null
    std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '}' && text_[pos_] != ']' &&
           text_[pos_] != ' ' && text_[pos_] != '\n' && text_[pos_] != '\r' &&
           text_[pos_] != '\t') {
      ++pos_;
    }
    return pos_ > start;
  }

  std::size_t pos() const { return pos_; }
  std::string_view text() const { return text_; }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

// A key spelled with escapes ("mod\u0065l") names the same member for every
// JSON parser upstream, so it must match too.
bool key_equals(std::string_view written, std::string_view key) {
  if (written.find('\\') == std::string_view::npos) return written == key;
  std::string decoded;
  return decode_json_string(written, decoded) && decoded == key;
}

void append_utf8(std::string& out, unsigned long code_point) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

}  // namespace

bool TopLevelMembers::next(std::string_view& key, ValueSpan& value) {
  Scanner scanner(json_, pos_);
  switch (state_) {
    case State::before_object:
      if (!scanner.consume('{')) return fail();
      if (scanner.consume('}')) {
        state_ = State::done;
        pos_ = scanner.pos();
        return false;
      }
      state_ = State::in_object;
      break;
    case State::in_object:
      if (scanner.consume('}')) {
        state_ = State::done;
        pos_ = scanner.pos();
        return false;
      }
      if (!scanner.consume(',')) return fail();
      break;
    case State::done:
    case State::broken:
      return false;
  }
  if (!scanner.at('"')) return fail();
  const std::size_t key_begin = scanner.pos() + 1;
  if (!scanner.skip_string()) return fail();
  key = json_.substr(key_begin, scanner.pos() - 1 - key_begin);
  if (!scanner.consume(':')) return fail();
  scanner.skip_whitespace();
  const std::size_t value_begin = scanner.pos();
  if (!scanner.skip_value()) return fail();
  value = ValueSpan{value_begin, scanner.pos()};
  pos_ = scanner.pos();
  return true;
}

std::optional<ValueSpan> find_top_level_value(std::string_view json, std::string_view key) {
  std::optional<ValueSpan> found;
  bool well_formed =
      for_each_top_level_member(json, [&](std::string_view this_key, ValueSpan value) {
        if (key_equals(this_key, key)) found = value;
      });
  if (!well_formed) return std::nullopt;
  return found;
}

long json_hex4(std::string_view text, std::size_t at) {
  if (at + 4 > text.size()) return -1;
  long unit = 0;
  for (std::size_t i = at; i < at + 4; ++i) {
    const char c = text[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return -1;
    }
    unit = unit * 16 + digit;
  }
  return unit;
}

bool decode_json_string(std::string_view literal, std::string& out) {
  std::size_t at = 0;
  while (at < literal.size()) {
    const auto backslash = literal.find('\\', at);
    out.append(literal.substr(at, backslash - at));
    if (backslash == std::string_view::npos) break;
    at = backslash + 1;
    if (at == literal.size()) return false;
    const char kind = literal[at++];
    switch (kind) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        long unit = json_hex4(literal, at);
        if (unit < 0) return false;
        at += 4;
        if (unit >= 0xD800 && unit <= 0xDBFF) {
          long low = at + 1 < literal.size() && literal[at] == '\\' && literal[at + 1] == 'u'
                         ? json_hex4(literal, at + 2)
                         : -1;
          if (low < 0xDC00 || low > 0xDFFF) return false;
          at += 6;
          unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
        } else if (unit >= 0xDC00 && unit <= 0xDFFF) {
          return false;
        }
        append_utf8(out, static_cast<unsigned long>(unit));
        break;
      }
      default:
        return false;
    }
  }
  return true;
}

void append_json_string(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t i = 0;
  while (i < text.size()) {
    // Copy runs of bytes that need no escaping in one go.
    std::size_t run = i;
    while (run < text.size()) {
      const auto c = static_cast<unsigned char>(text[run]);
      if (c < 0x20 || c == '"' || c == '\\' || c >= 0x80) break;
      ++run;
    }
    out.append(text.data() + i, run - i);
    i = run;
    if (i == text.size()) break;

    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const std::size_t length = utf8_sequence_length(text, i);
      if (length == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(text.data() + i, length);
        i += length;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 0x0f];
    }
    ++i;
  }
  out += '"';
}

}  // namespace sluice

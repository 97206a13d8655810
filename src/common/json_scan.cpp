#include "sluice/common/json_scan.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace sluice {
namespace {

class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

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
  bool skip_string() {
    if (pos_ >= text_.size() || text_[pos_] != '"') return false;
    for (++pos_; pos_ < text_.size(); ++pos_) {
      if (text_[pos_] == '\\') {
        ++pos_;
      } else if (text_[pos_] == '"') {
        ++pos_;
        return true;
      }
    }
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
  std::string quoted;
  quoted.reserve(written.size() + 2);
  quoted.append(1, '"').append(written).append(1, '"');
  const auto decoded = nlohmann::json::parse(quoted, nullptr, /*allow_exceptions=*/false);
  return decoded.is_string() && decoded.get_ref<const std::string&>() == key;
}

}  // namespace

bool for_each_top_level_member(std::string_view json,
                               const std::function<void(std::string_view, ValueSpan)>& visit) {
  Scanner scanner(json);
  if (!scanner.consume('{')) return false;
  if (scanner.consume('}')) return true;
  for (;;) {
    if (!scanner.at('"')) return false;
    std::size_t key_begin = scanner.pos() + 1;
    if (!scanner.skip_string()) return false;
    std::string_view key = json.substr(key_begin, scanner.pos() - 1 - key_begin);
    if (!scanner.consume(':')) return false;
    scanner.skip_whitespace();
    std::size_t value_begin = scanner.pos();
    if (!scanner.skip_value()) return false;
    visit(key, ValueSpan{value_begin, scanner.pos()});
    if (scanner.consume(',')) continue;
    return scanner.consume('}');
  }
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

void append_json_string(std::string& out, std::string_view text) {
  out.push_back('"');
  for (char c : text) {
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
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
          out += escaped;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

}  // namespace sluice

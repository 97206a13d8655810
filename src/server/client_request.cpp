#include "sluice/server/client_request.hpp"

#include <array>
#include <boost/beast/http/error.hpp>
#include <cstring>
#include <optional>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sluice::server {

namespace http = boost::beast::http;
using boost::beast::error_code;

namespace {

// Room for a typical SDK request's forwarded lines at once, within the
// largest block the thread's block cache recycles (the string adds a byte
// for its terminator).
constexpr std::size_t kTypicalForwardedBytes = BlockCache::kLargestBlock - 1;
constexpr std::size_t kTypicalWithheldBytes = 192;

// RFC 9110's tchar, the bytes of a field name, as Beast's parser has them.
constexpr std::array<bool, 256> kTokenBytes = [] {
  std::array<bool, 256> table{};
  for (int c = '0'; c <= '9'; ++c) table[c] = true;
  for (int c = 'A'; c <= 'Z'; ++c) table[c] = table[c - 'A' + 'a'] = true;
  for (unsigned char c : std::string_view("!#$%&'*+-.^_`|~")) table[c] = true;
  return table;
}();

// The first byte from `p` on that is a control below `lowest`, DEL or above
// 0x7f (Beast also takes those, which send the head to it), or `last`. Field
// values and targets are most of a head's bytes: 16 are tested at a time.
const char* skip_visible(const char* p, const char* last, signed char lowest) {
#if defined(__SSE2__)
  const __m128i floor = _mm_set1_epi8(lowest);
  const __m128i del = _mm_set1_epi8(0x7f);
  while (last - p >= 16) {
    const __m128i block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Signed: bytes above 0x7f are negative, so below the floor too.
    const int stops =
        _mm_movemask_epi8(_mm_or_si128(_mm_cmplt_epi8(block, floor), _mm_cmpeq_epi8(block, del)));
    if (stops != 0) return p + __builtin_ctz(static_cast<unsigned>(stops));
    p += 16;
  }
#endif
  while (p < last && static_cast<signed char>(*p) >= lowest && *p != 0x7f) ++p;
  return p;
}

constexpr bool is_whitespace(char c) { return c == ' ' || c == '\t'; }

// What the framing fields say, as far as the plain reader follows them.
struct PlainFraming {
  std::optional<std::uint64_t> content_length;
  bool close = false;
  bool keep_alive = false;

  // Takes one withheld field; false for one the plain reader leaves to
  // Beast: a second or non-decimal Content-Length, any other Connection
  // value (an upgrade among them), Transfer-Encoding, Proxy-Connection.
  bool take(std::string_view name, std::string_view value) {
    switch (name.size()) {
      case 10:
        if (!field_name_is(name, "connection")) return true;
        close = close || iequals(value, "close");
        keep_alive = keep_alive || iequals(value, "keep-alive");
        return iequals(value, "close") || iequals(value, "keep-alive");
      case 14:
        return !field_name_is(name, "content-length") || take_content_length(value);
      case 16:
        return !field_name_is(name, "proxy-connection");
      case 17:
        return !field_name_is(name, "transfer-encoding");
      default:
        return true;
    }
  }

  bool take_content_length(std::string_view value) {
    // 18 digits cannot overflow; longer lengths are Beast's to judge.
    if (content_length || value.empty() || value.size() > 18) return false;
    std::uint64_t length = 0;
    for (char c : value) {
      if (c < '0' || c > '9') return false;
      length = length * 10 + static_cast<std::uint64_t>(c - '0');
    }
    content_length = length;
    return true;
  }
};

}  // namespace

bool is_withheld_from_upstream(std::string_view name) {
  if (is_hop_by_hop_header(name)) return true;
  switch (name.size()) {
    case 6:
      return field_name_is(name, "expect");
    case 7:
      return field_name_is(name, "api-key");
    case 9:
      return field_name_is(name, "x-api-key");
    case 11:
      return field_name_is(name, "traceparent");
    case 12:
      return field_name_is(name, "x-request-id");
    case 13:
      return field_name_is(name, "authorization");
    case 15:
      return field_name_is(name, "accept-encoding");
    default:
      return false;
  }
}

std::string_view ClientRequest::name_of(const FieldEntry& entry) const {
  const Text& lines = entry.withheld ? withheld_ : forwarded_;
  return {lines.data() + entry.at, entry.name_size};
}

std::string_view ClientRequest::value_of(const FieldEntry& entry) const {
  const Text& lines = entry.withheld ? withheld_ : forwarded_;
  return {lines.data() + entry.at + entry.name_size + 2, entry.value_size};
}

std::string_view ClientRequest::operator[](std::string_view name) const {
  for (const auto& entry : fields_) {
    if (entry.name_size == name.size() && iequals(name_of(entry), name)) return value_of(entry);
  }
  return {};
}

std::size_t ClientRequest::put(boost::asio::const_buffer buffer, error_code& ec) {
  const std::string_view bytes(static_cast<const char*>(buffer.data()), buffer.size());
  switch (route_) {
    case Route::plain:
      ec = {};
      return take_plain_body(bytes);
    case Route::undecided:
      if (bytes.empty()) {
        ec = http::error::need_more;
        return 0;
      }
      if (const std::size_t head = read_plain_head(bytes)) {
        route_ = Route::plain;
        ec = {};
        return head + take_plain_body(bytes.substr(head));
      }
      route_ = Route::beast;
      break;
    case Route::beast:
      break;
  }
  return basic_parser::put(buffer, ec);
}

void ClientRequest::put_eof(error_code& ec) {
  if (route_ == Route::beast) return basic_parser::put_eof(ec);
  ec = is_done() ? error_code{} : error_code{http::error::partial_message};
}

std::size_t ClientRequest::read_plain_head(std::string_view bytes) {
  const char* p = bytes.data();
  // A head longer than the limit is Beast's to refuse.
  const char* const last = p + std::min<std::size_t>(bytes.size(), header_limit_bytes_);

  const char* const method_first = p;
  while (p < last && *p >= 'A' && *p <= 'Z') ++p;
  if (p == method_first || p == last || *p != ' ') return 0;
  const std::string_view method(method_first, static_cast<std::size_t>(p - method_first));
  const char* const target_first = ++p;
  p = skip_visible(p, last, 0x21);
  constexpr std::size_t kVersionLine = 10;  // "HTTP/1.1\r\n"
  if (p == target_first || static_cast<std::size_t>(last - p) <= kVersionLine || *p != ' ') {
    return 0;
  }
  const std::string_view target(target_first, static_cast<std::size_t>(p - target_first));
  ++p;
  unsigned version = 11;
  if (std::memcmp(p, "HTTP/1.1\r\n", kVersionLine) != 0) {
    if (std::memcmp(p, "HTTP/1.0\r\n", kVersionLine) != 0) return 0;
    version = 10;
  }
  p += kVersionLine;
  begin_head(http::string_to_verb(method), method, target, version);

  PlainFraming framing;
  const auto leave_to_beast = [this] {
    start_line_.clear();
    forwarded_.clear();
    withheld_.clear();
    fields_.clear();
    return std::size_t{0};
  };
  for (;;) {
    if (last - p < 2) return leave_to_beast();
    if (p[0] == '\r') {
      if (p[1] != '\n') return leave_to_beast();
      p += 2;
      break;
    }
    // A line that starts with whitespace continues the last one (obs-fold):
    // it has no name, which leaves it to Beast.
    const char* const name_first = p;
    while (p < last && kTokenBytes[static_cast<unsigned char>(*p)]) ++p;
    if (p == name_first || p == last || *p != ':') return leave_to_beast();
    const std::string_view name(name_first, static_cast<std::size_t>(p - name_first));
    ++p;
    while (p < last && is_whitespace(*p)) ++p;
    const char* const value_first = p;
    // Visible bytes, spaces and tabs.
    p = skip_visible(p, last, 0x20);
    while (p < last && *p == '\t') p = skip_visible(p + 1, last, 0x20);
    if (last - p < 2 || p[0] != '\r' || p[1] != '\n') return leave_to_beast();
    const char* value_last = p;
    while (value_last > value_first && is_whitespace(value_last[-1])) --value_last;
    p += 2;
    const std::string_view value(value_first, static_cast<std::size_t>(value_last - value_first));
    // Every framing field is hop-by-hop, so withheld.
    const bool withheld = is_withheld_from_upstream(name);
    if (withheld && !framing.take(name, value)) return leave_to_beast();
    add_field(name, value, withheld);
  }
  // Beast refuses a length over the limit with its own error.
  if (framing.content_length && *framing.content_length > body_limit_bytes_) {
    return leave_to_beast();
  }
  plain_keep_alive_ = version == 11 ? !framing.close : framing.keep_alive;
  body_remaining_ = framing.content_length.value_or(0);
  if (body_remaining_ > 0) body_.reserve(static_cast<std::size_t>(body_remaining_));
  return static_cast<std::size_t>(p - bytes.data());
}

std::size_t ClientRequest::take_plain_body(std::string_view bytes) {
  const auto taken =
      static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), body_remaining_));
  body_.append(bytes.data(), taken);
  body_remaining_ -= taken;
  return taken;
}

void ClientRequest::begin_head(http::verb method, std::string_view method_text,
                               std::string_view target, unsigned version) {
  method_ = method;
  method_size_ = method_text.size();
  version_ = version;
  start_line_.reserve(method_text.size() + target.size());
  start_line_.append(method_text);
  start_line_.append(target);
  forwarded_.reserve(kTypicalForwardedBytes);
  withheld_.reserve(kTypicalWithheldBytes);
}

void ClientRequest::on_request_impl(http::verb method, boost::beast::string_view method_text,
                                    boost::beast::string_view target, int version, error_code&) {
  begin_head(method, {method_text.data(), method_text.size()}, {target.data(), target.size()},
             static_cast<unsigned>(version));
}

void ClientRequest::on_response_impl(int, boost::beast::string_view, int, error_code& ec) {
  ec = http::error::bad_version;  // a request parser never sees a status line
}

bool is_withheld_from_upstream(http::field name, std::string_view name_text) {
  switch (name) {
    case http::field::unknown:
      // Names Beast does not know, among them the gateway's own.
      return is_withheld_from_upstream(name_text);
    case http::field::expect:
    case http::field::authorization:
    case http::field::accept_encoding:
      return true;
    default:
      return is_hop_by_hop_field(name);
  }
}

void ClientRequest::on_field_impl(http::field name, boost::beast::string_view name_text,
                                  boost::beast::string_view value, error_code&) {
  const std::string_view name_view(name_text.data(), name_text.size());
  add_field(name_view, {value.data(), value.size()}, is_withheld_from_upstream(name, name_view));
}

void ClientRequest::add_field(std::string_view name, std::string_view value, bool withheld) {
  Text& lines = withheld ? withheld_ : forwarded_;
  const std::size_t at = lines.size();
  fields_.push_back(FieldEntry{withheld, static_cast<std::uint32_t>(name.size()),
                               static_cast<std::uint32_t>(at),
                               static_cast<std::uint32_t>(value.size())});
  // One resize and two copies: appending the four pieces cost twice as much.
  lines.resize(at + name.size() + value.size() + 4);
  char* out = lines.data() + at;
  std::memcpy(out, name.data(), name.size());
  out += name.size();
  *out++ = ':';
  *out++ = ' ';
  std::memcpy(out, value.data(), value.size());
  out += value.size();
  *out++ = '\r';
  *out = '\n';
}

void ClientRequest::on_header_impl(error_code&) {}

void ClientRequest::on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                                      error_code&) {
  // The parser has checked the length against the body limit already.
  if (content_length) body_.reserve(static_cast<std::size_t>(*content_length));
}

std::size_t ClientRequest::on_body_impl(boost::beast::string_view body, error_code&) {
  body_.append(body.data(), body.size());
  return body.size();
}

void ClientRequest::on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) {}

std::size_t ClientRequest::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                              error_code&) {
  body_.append(body.data(), body.size());
  return body.size();
}

void ClientRequest::on_finish_impl(error_code&) {}

}  // namespace sluice::server

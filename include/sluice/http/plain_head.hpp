#pragma once

#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/optional/optional.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sluice {

// HTTP/1.x heads in the plain shape clients and upstreams send -- printable
// ASCII, CRLF lines, one decimal Content-Length (or, for responses, a lone
// chunked Transfer-Encoding), Connection close or keep-alive, no folded
// lines -- are read by a scanner of our own, which skips the work Beast's
// parser does for every field (a lookup in its field table, the token lists
// of Content-Length and Connection). Every head outside that shape, or not
// whole in the first buffer, goes to Beast's parser, so the plain reader
// only ever takes what Beast takes, and reads it the same way (tests compare
// the two on thousands of altered heads).

// Beast's parser asks for more input (need_more) or more room (need_buffer)
// through error codes, and the plain reader answers the same way. A stream
// meets them with every piece it relays, so they are set from these and
// tested by parser_waits rather than built from the enum each time (a call
// and a guarded static, then a comparison of categories).
namespace parse_wait {
inline const boost::beast::error_code need_more = boost::beast::http::error::need_more;
inline const boost::beast::error_code need_buffer = boost::beast::http::error::need_buffer;
}  // namespace parse_wait

// Whether `ec` is need_more or need_buffer: the parser waits, nothing failed.
inline bool parser_waits(const boost::beast::error_code& ec) {
  const int value = ec.value();
  return (value == parse_wait::need_more.value() || value == parse_wait::need_buffer.value()) &&
         ec.category() == parse_wait::need_more.category();
}

// RFC 9110's tchar, the bytes of a field name, as Beast's parser has them.
inline constexpr std::array<bool, 256> kTokenBytes = [] {
  std::array<bool, 256> table{};
  for (int c = '0'; c <= '9'; ++c) table[c] = true;
  for (int c = 'A'; c <= 'Z'; ++c) table[c] = table[c - 'A' + 'a'] = true;
  for (unsigned char c : std::string_view("!#$%&'*+-.^_`|~")) table[c] = true;
  return table;
}();

// The first byte from `p` on that is a control below `lowest`, DEL or above
// 0x7f (Beast also takes those, which send the head to it), or `last`.
const char* skip_visible(const char* p, const char* last, signed char lowest);

// What the framing fields of a plain head say.
struct PlainFraming {
  // Whether the reader follows a chunked body itself (responses, when no
  // body limit applies); a request's chunked body is Beast's to frame.
  bool chunked_allowed = false;
  std::optional<std::uint64_t> content_length;
  bool chunked = false;
  bool close = false;
  bool keep_alive = false;

  // Takes one hop-by-hop field; false for one the plain reader leaves to
  // Beast: a second or non-decimal Content-Length, any other Connection
  // value (an upgrade among them), a Transfer-Encoding other than a lone
  // "chunked" where that is allowed, or with a Content-Length,
  // Proxy-Connection.
  bool take(std::string_view name, std::string_view value);
  // Beast's keep-alive rule: HTTP/1.1 unless "close", HTTP/1.0 only with
  // "keep-alive".
  bool keeps_alive(unsigned version) const { return version == 11 ? !close : keep_alive; }
};

// The first byte from `p` on that is neither visible ASCII, a space nor a
// tab (field values, reason phrases), or `last`.
inline const char* skip_text(const char* p, const char* last) {
  p = skip_visible(p, last, 0x20);
  while (p < last && *p == '\t') p = skip_visible(p + 1, last, 0x20);
  return p;
}

// Reads the field lines of a plain head from `p` through the blank line that
// ends it, calling take(name, value) for each, the value without the
// whitespace around it. Returns where the body starts; nullptr when a line
// is not plain, the head does not end before `last`, or take returned false.
template <class Take>
const char* scan_plain_fields(const char* p, const char* last, Take&& take) {
  const auto is_whitespace = [](char c) { return c == ' ' || c == '\t'; };
  for (;;) {
    if (last - p < 2) return nullptr;
    if (p[0] == '\r') return p[1] == '\n' ? p + 2 : nullptr;
    // A line that starts with whitespace continues the last one (obs-fold):
    // it has no name, which leaves it to Beast.
    const char* const line = p;
    while (p < last && kTokenBytes[static_cast<unsigned char>(*p)]) ++p;
    if (p == line || p == last || *p != ':') return nullptr;
    const std::string_view name(line, static_cast<std::size_t>(p - line));
    ++p;
    while (p < last && is_whitespace(*p)) ++p;
    const char* const value_first = p;
    p = skip_text(p, last);
    if (last - p < 2 || p[0] != '\r' || p[1] != '\n') return nullptr;
    const char* value_last = p;
    while (value_last > value_first && is_whitespace(value_last[-1])) --value_last;
    const std::string_view value(value_first, static_cast<std::size_t>(value_last - value_first));
    if (!take(name, value)) return nullptr;
    p += 2;
  }
}

// Beast's parser behind the plain reader: the part of its interface the
// gateway's reads use, answered by whichever reader took the head. Beast's
// parser is a protected base, so nothing reads its own view of the framing
// when the plain reader took the head. `Derived` provides the plain reader:
//   std::size_t read_plain_head(std::string_view bytes): the head's size
//     when it took the head (then it called take_plain_head), 0 when the
//     head is not plain or not whole there (and it kept nothing);
//   std::size_t take_plain_body(std::string_view bytes, error_code& ec).
template <bool isRequest, class Derived>
class PlainFirstParser : protected boost::beast::http::basic_parser<isRequest> {
  using Beast = boost::beast::http::basic_parser<isRequest>;

 public:
  enum class Reading : std::uint8_t { plain_when_possible, beast_only };

  std::size_t put(boost::asio::const_buffer buffer, boost::beast::error_code& ec) {
    const std::string_view bytes(static_cast<const char*>(buffer.data()), buffer.size());
    auto& derived = static_cast<Derived&>(*this);
    switch (route_) {
      case Route::plain:
        return derived.take_plain_body(bytes, ec);
      case Route::undecided:
        if (bytes.empty()) {
          ec = parse_wait::need_more;
          return 0;
        }
        // As with Beast's parser, the body waits for the next put.
        if (const std::size_t head = derived.read_plain_head(bytes)) {
          ec = {};
          return head;
        }
        route_ = Route::beast;
        break;
      case Route::beast:
      case Route::beast_body:
        break;
    }
    return Beast::put(buffer, ec);
  }

  bool got_some() const {
    return route_ == Route::beast ? Beast::got_some() : route_ != Route::undecided;
  }
  bool is_header_done() const {
    return route_ == Route::beast ? Beast::is_header_done() : route_ != Route::undecided;
  }
  bool is_done() const {
    switch (route_) {
      case Route::plain:
        return plain_body_ended_;
      case Route::beast:
      case Route::beast_body:
        return Beast::is_done();
      default:
        return false;
    }
  }
  bool keep_alive() const {
    return route_ == Route::beast ? Beast::keep_alive() : plain_keep_alive_;
  }
  boost::optional<std::uint64_t> content_length() const {
    if (route_ == Route::beast) return Beast::content_length();
    return plain_content_length_ ? boost::optional<std::uint64_t>(*plain_content_length_)
                                 : boost::none;
  }
  bool chunked() const { return route_ == Route::beast ? Beast::chunked() : plain_chunked_; }
  // Bytes of a Content-Length body still to come, as far as the plain reader
  // knows: 0 for a chunked body, or one Beast's parser reads.
  std::uint64_t body_bytes_to_come() const {
    return route_ == Route::plain && !plain_chunked_ ? body_remaining_ : 0;
  }
  void put_eof(boost::beast::error_code& ec) {
    if (route_ == Route::beast || route_ == Route::beast_body) return Beast::put_eof(ec);
    ec = is_done() ? boost::beast::error_code{}
                   : boost::beast::error_code{boost::beast::http::error::partial_message};
  }
  void header_limit(std::uint32_t bytes) {
    header_limit_bytes_ = bytes;
    Beast::header_limit(bytes);
  }
  void body_limit(boost::optional<std::uint64_t> bytes) {
    body_limit_bytes_ = bytes;
    Beast::body_limit(bytes);
  }
  // Whether the head was read by the plain reader (tests and benchmarks).
  bool read_plainly() const { return route_ == Route::plain || route_ == Route::beast_body; }
  // Beast's parser itself, for Beast's own reads (TLS streams): the plain
  // reader is out of the way from here on.
  Beast& beast_parser() {
    route_ = Route::beast;
    return *this;
  }

 protected:
  // beast_body: the plain reader took the head, Beast's parser frames the
  // rest of a chunked body (hand_chunks_to_beast).
  enum class Route : std::uint8_t { undecided, plain, beast, beast_body };

  explicit PlainFirstParser(Reading reading)
      : route_(reading == Reading::beast_only ? Route::beast : Route::undecided) {}

  void take_plain_head(const PlainFraming& framing, unsigned version) {
    route_ = Route::plain;
    plain_keep_alive_ = framing.keeps_alive(version);
    plain_content_length_ = framing.content_length;
    plain_chunked_ = framing.chunked;
    body_remaining_ = framing.content_length.value_or(0);
    plain_body_ended_ = !framing.chunked && body_remaining_ == 0;
  }
  void end_plain_body() { plain_body_ended_ = true; }

  // Hands a chunked body to Beast's parser at the start of a chunk line the
  // plain reader does not follow (with `after_data`, at the CRLF that ends
  // the last chunk's data). Beast's parser is brought to the same point by a
  // head and, after data, a chunk of its own -- while `priming()`, the
  // derived parser keeps nothing of them -- then reads `rest`.
  std::size_t hand_chunks_to_beast(bool after_data, std::string_view rest,
                                   boost::beast::error_code& ec) {
    static constexpr std::string_view kChunkedHeadAndChunk =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nX";
    const std::size_t priming_size = kChunkedHeadAndChunk.size() - (after_data ? 0 : 4);
    priming_ = true;
    for (std::size_t primed = 0; primed < priming_size;) {
      const std::size_t taken = Beast::put(
          boost::asio::const_buffer(kChunkedHeadAndChunk.data() + primed, priming_size - primed),
          ec);
      if (ec || taken == 0) break;
      primed += taken;
    }
    priming_ = false;
    route_ = Route::beast_body;
    if (ec) return 0;
    return Beast::put(boost::asio::const_buffer(rest.data(), rest.size()), ec);
  }
  bool priming() const { return priming_; }

  // A plain head up to this size is one Beast's parser would take.
  std::size_t plain_head_room(std::size_t available) const {
    return available < header_limit_bytes_ ? available : header_limit_bytes_;
  }
  bool has_body_limit() const { return body_limit_bytes_.has_value(); }
  bool within_body_limit(std::uint64_t length) const {
    return !body_limit_bytes_ || length <= *body_limit_bytes_;
  }

  // What is left of the body, or of the current chunk.
  std::uint64_t body_remaining_ = 0;

 private:
  Route route_;
  bool plain_keep_alive_ = false;
  bool plain_chunked_ = false;
  bool plain_body_ended_ = false;
  bool priming_ = false;
  std::optional<std::uint64_t> plain_content_length_;
  // Beast's defaults, which its parser does not let us read back.
  std::uint32_t header_limit_bytes_ = 8192;
  boost::optional<std::uint64_t> body_limit_bytes_ = std::uint64_t{isRequest ? 1 : 8} * 1024 * 1024;
};

}  // namespace sluice

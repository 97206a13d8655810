#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>
#include <boost/container/small_vector.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/common/http_head.hpp"
#include "sluice/common/recycling_allocator.hpp"

namespace sluice::server {

// A client's request, parsed in place without Beast's field container,
// which allocated a block per field and was walked by name for every lookup.
// The fields are kept as the lines they arrived as, in two runs: the ones
// that travel upstream, forwarded as one piece, and the ones the gateway
// withholds (framing, hop-by-hop, credentials, Expect, encodings). A small
// index finds the few the stages read.
//
// Two readers fill it. A head that arrives whole in the first buffer and
// keeps to the plain shape SDKs send (an upper-case method, printable ASCII,
// HTTP/1.0 or 1.1, CRLF lines, at most one decimal Content-Length, Connection
// close or keep-alive, no Transfer-Encoding or folded lines, within
// the limits) is read by a scanner of its own, which skips the work Beast's
// parser does for every field (a name lookup, the token lists of
// Content-Length and Connection). Anything else -- a head in pieces, chunked
// framing, any byte or field outside that shape -- goes to Beast's parser
// (same grammar, framing, limits and keep-alive rules), so the plain reader
// only ever accepts what Beast accepts, and reads it the same way; a test
// compares the two on thousands of altered heads. Beast's parser is a
// private base: its own view of the framing is not the request's when the
// plain reader took the head.
class ClientRequest final : private boost::beast::http::basic_parser<true> {
 public:
  enum class Reading : std::uint8_t { plain_when_possible, beast_only };

  explicit ClientRequest(Reading reading = Reading::plain_when_possible)
      : route_(reading == Reading::beast_only ? Route::beast : Route::undecided) {}

  // Beast's parser interface, over whichever reader took the head.
  std::size_t put(boost::asio::const_buffer buffer, boost::beast::error_code& ec);
  void put_eof(boost::beast::error_code& ec);
  bool got_some() const {
    return route_ == Route::beast ? basic_parser::got_some() : route_ == Route::plain;
  }
  bool is_header_done() const {
    return route_ == Route::beast ? basic_parser::is_header_done() : route_ == Route::plain;
  }
  bool is_done() const {
    return route_ == Route::beast ? basic_parser::is_done()
                                  : route_ == Route::plain && body_remaining_ == 0;
  }
  bool keep_alive() const {
    return route_ == Route::beast ? basic_parser::keep_alive() : plain_keep_alive_;
  }
  void header_limit(std::uint32_t bytes) {
    header_limit_bytes_ = bytes;
    basic_parser::header_limit(bytes);
  }
  void body_limit(std::uint64_t bytes) {
    body_limit_bytes_ = bytes;
    basic_parser::body_limit(bytes);
  }
  // Whether the head was read by the plain reader (tests and benchmarks).
  bool read_plainly() const { return route_ == Route::plain; }

  boost::beast::http::verb method() const { return method_; }
  std::string_view method_string() const { return start_line().substr(0, method_size_); }
  std::string_view target() const { return start_line().substr(method_size_); }
  // 10 for HTTP/1.0, 11 for HTTP/1.1.
  unsigned version() const { return version_; }

  // The value of the first field of this name (case-insensitive); empty
  // when there is none.
  std::string_view operator[](std::string_view name) const;
  // Calls visit(value) for every field of this name, in order.
  template <typename Visit>
  void for_each_value(std::string_view name, Visit&& visit) const {
    for (const auto& entry : fields_) {
      if (entry.name_size == name.size() && iequals(name_of(entry), name)) visit(value_of(entry));
    }
  }

  // "Name: value\r\n" for every field that travels upstream, as received.
  std::string_view forwarded_fields() const { return {forwarded_.data(), forwarded_.size()}; }
  // The same for the fields the gateway keeps to itself.
  std::string_view withheld_fields() const { return {withheld_.data(), withheld_.size()}; }

  const std::string& body() const { return body_; }

 private:
  using Text = std::basic_string<char, std::char_traits<char>, RecyclingAllocator<char>>;

  enum class Route : std::uint8_t { undecided, plain, beast };

  struct FieldEntry {
    bool withheld;  // in withheld_, else in forwarded_
    // The header limit is a 32-bit count, so these cannot overflow.
    std::uint32_t name_size;
    std::uint32_t at;  // where the line starts
    std::uint32_t value_size;
  };

  std::string_view start_line() const { return {start_line_.data(), start_line_.size()}; }
  std::string_view name_of(const FieldEntry& entry) const;
  std::string_view value_of(const FieldEntry& entry) const;

  void begin_head(boost::beast::http::verb method, std::string_view method_text,
                  std::string_view target, unsigned version);
  void add_field(std::string_view name, std::string_view value, bool withheld);
  // The plain reader: the head's size when it read the head from `bytes`,
  // 0 when the head is not of the plain shape or not whole there (nothing is
  // kept then).
  std::size_t read_plain_head(std::string_view bytes);
  std::size_t take_plain_body(std::string_view bytes);

  void on_request_impl(boost::beast::http::verb method, boost::beast::string_view method_text,
                       boost::beast::string_view target, int version,
                       boost::beast::error_code& ec) override;
  void on_response_impl(int code, boost::beast::string_view reason, int version,
                        boost::beast::error_code& ec) override;
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_text,
                     boost::beast::string_view value, boost::beast::error_code& ec) override;
  void on_header_impl(boost::beast::error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         boost::beast::error_code& ec) override;
  std::size_t on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t size, boost::beast::string_view extensions,
                            boost::beast::error_code& ec) override;
  std::size_t on_chunk_body_impl(std::uint64_t remain, boost::beast::string_view body,
                                 boost::beast::error_code& ec) override;
  void on_finish_impl(boost::beast::error_code& ec) override;

  Text start_line_;  // the method, then the target
  Text forwarded_;
  Text withheld_;
  boost::container::small_vector<FieldEntry, 16> fields_;
  std::string body_;
  boost::beast::http::verb method_ = boost::beast::http::verb::unknown;
  std::size_t method_size_ = 0;
  unsigned version_ = 11;
  Route route_;
  bool plain_keep_alive_ = false;
  std::uint64_t body_remaining_ = 0;
  // Beast's defaults, which its parser does not let us read back.
  std::uint32_t header_limit_bytes_ = 8192;
  std::uint64_t body_limit_bytes_ = std::uint64_t{1024} * 1024;
};

// Client fields that must not travel upstream: framing and hop-by-hop
// fields, the client's own credentials, Expect, and encodings the relay
// could not inspect.
bool is_withheld_from_upstream(std::string_view name);
// The same, for a name the parser has looked up already (unknown names are
// compared by their text).
bool is_withheld_from_upstream(boost::beast::http::field name, std::string_view name_text);

}  // namespace sluice::server

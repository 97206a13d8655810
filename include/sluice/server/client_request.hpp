#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>
#include <boost/container/small_vector.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/common/recycling_allocator.hpp"
#include "sluice/http/http_head.hpp"
#include "sluice/http/plain_head.hpp"

namespace sluice::server {

// A client's request, parsed in place without Beast's field container,
// which allocated a block per field and was walked by name for every lookup.
// The fields are kept as the lines they arrived as, in two runs: the ones
// that travel upstream, forwarded as one piece, and the ones the gateway
// withholds (framing, hop-by-hop, credentials, Expect, encodings). A small
// index finds the few the stages read. A plain head is read by the plain
// reader (plain_head.hpp), with an upper-case method and a printable target;
// any other by Beast's parser.
class ClientRequest final : public PlainFirstParser<true, ClientRequest> {
 public:
  explicit ClientRequest(Reading reading = Reading::plain_when_possible)
      : PlainFirstParser(reading) {}

  boost::beast::http::verb method() const { return method_; }
  std::string_view method_string() const { return start_line().substr(0, method_size_); }
  std::string_view target() const { return start_line().substr(method_size_); }
  // 10 for HTTP/1.0, 11 for HTTP/1.1.
  unsigned version() const { return version_; }

  // The value of the first field of this name (case-insensitive); empty
  // when there is none.
  std::string_view operator[](std::string_view name) const;
  // The first Content-Type, noted while the head is read: every proxied
  // request's body is read by it.
  std::string_view content_type() const {
    return content_type_field_ < 0
               ? std::string_view()
               : value_of(fields_[static_cast<std::size_t>(content_type_field_)]);
  }
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

  std::string_view body() const {
    return {static_cast<const char*>(body_.cdata().data()), body_.size()};
  }

  // Where the rest of a Content-Length body may be read straight from the
  // socket, once the connection's buffer holds none of it: a prompt of
  // many kilobytes then takes no copy from that buffer, which would also
  // have to grow for it. Empty when nothing is to come this way (a body
  // that is whole, chunked, or read by Beast's parser).
  boost::asio::mutable_buffer body_read_space() {
    const std::uint64_t to_come = body_bytes_to_come();
    if (to_come == 0) return {};
    return body_.prepare(static_cast<std::size_t>(to_come));
  }
  // Takes `bytes` read into body_read_space().
  void commit_body_read(std::size_t bytes);

 private:
  using Text = std::basic_string<char, std::char_traits<char>, RecyclingAllocator<char>>;

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
  // Moves the forwarded fields that a Connection field names to the
  // withheld ones: they are hop-by-hop too (RFC 9110 §7.6.1).
  void withhold_connection_options();
  friend PlainFirstParser;
  std::size_t read_plain_head(std::string_view bytes);
  std::size_t take_plain_body(std::string_view bytes, boost::beast::error_code& ec);
  void forget_head();
  void append_body(std::string_view bytes);

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
  // Grows without setting the bytes it adds, which a read then fills.
  // Recycled per thread: most bodies are small, and every request has one.
  boost::beast::basic_flat_buffer<RecyclingAllocator<char>> body_;
  boost::beast::http::verb method_ = boost::beast::http::verb::unknown;
  std::size_t method_size_ = 0;
  int content_type_field_ = -1;  // its index in fields_
  // One bit per field name's length and first letter, case folded: a name
  // whose bit is clear is not among the fields.
  static std::uint64_t name_mark(std::string_view name) {
    if (name.empty()) return 1;
    const auto first = static_cast<unsigned char>(name.front()) | 0x20u;
    return std::uint64_t{1} << ((name.size() * 7 + first) & 63);
  }
  std::uint64_t name_marks_ = 0;
  unsigned version_ = 11;
  // Seen by Beast's parser; the plain reader leaves every head with either
  // to it, save a Connection of close or keep-alive alone.
  bool saw_connection_ = false;
  bool saw_transfer_encoding_ = false;
};

// Client fields that must not travel upstream: framing and hop-by-hop
// fields, the client's own credentials, Expect, and encodings the relay
// could not inspect.
bool is_withheld_from_upstream(std::string_view name);
// The same, for a name the parser has looked up already (unknown names are
// compared by their text).
bool is_withheld_from_upstream(boost::beast::http::field name, std::string_view name_text);

}  // namespace sluice::server

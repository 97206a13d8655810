#pragma once

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/recycling_allocator.hpp"
#include "sluice/http/plain_head.hpp"

namespace sluice::upstream {

// What the upstream's x-request-id and x-ratelimit-* lines are renamed to
// (kRenamedPrefix + name): the gateway's answer gives those names its own
// values.
inline constexpr std::string_view kRenamedPrefix = "upstream-";
bool is_renamed_from_upstream(std::string_view name);

// Parses an upstream's response with Beast's parser, but builds no field
// container: the gateway needs only the status, the framing (which Beast
// tracks itself), the content type, Retry-After (or retry-after-ms), and
// the end-to-end fields as the lines it forwards to the client. Those lines
// are kept as received, once, instead of one allocated field each that the
// relay then walked and wrote out again.
//
// The body goes into the caller's buffer, as with Beast's buffer_body: a
// full buffer stops the parse with need_buffer. Or, where the caller keeps
// the bytes it puts in place until it has used the body, the body is handed
// over as views of those bytes: a stream's events leave as they came in,
// never copied.
//
// A plain head with a Content-Length or a chunked body is read by the plain
// reader (plain_head.hpp), and so are chunks of the plain shape (a size alone
// on its line, no trailers); at any other chunk line the rest of the body goes
// to Beast's parser. Any other head -- close-delimited, a status whose body
// the status decides (1xx, 204, 304) -- is Beast's parser's.
class ResponseParser final : public PlainFirstParser<false, ResponseParser> {
 public:
  explicit ResponseParser(Reading reading = Reading::plain_when_possible)
      : PlainFirstParser(reading) {}

  unsigned status() const { return status_; }
  // "Name: value\r\n" for every field except the hop-by-hop and framing ones
  // (is_hop_by_hop_header, and those a Connection field names), in the
  // order and spelling received. The upstream's x-request-id and
  // x-ratelimit-* fields are renamed upstream-x-request-id and so on: the
  // gateway's answer has its own, for the client's request and key.
  std::string_view forwarded_fields() const { return {lines_.data(), lines_.size()}; }
  // The Content-Type value; empty when there is none.
  std::string_view content_type() const {
    return forwarded_fields().substr(content_type_at_, content_type_size_);
  }
  bool is_event_stream() const;
  // How long the upstream asks to be left alone: retry-after-ms (Azure
  // OpenAI's, the more precise) when it sent one, else Retry-After in
  // delta-seconds; nullopt when neither came or Retry-After is a date.
  std::optional<std::chrono::milliseconds> retry_after() const {
    return retry_after_ms_ ? retry_after_ms_ : retry_after_;
  }

  // Where the next body bytes go; what is left of it after a put.
  void set_body_buffer(char* data, std::size_t capacity) {
    body_views_ = nullptr;
    body_data_ = data;
    body_space_ = capacity;
    body_taken_ = 0;
  }
  std::size_t body_space_left() const { return body_space_; }
  // Whether a put would stop for want of room: the buffer is full.
  bool body_buffer_full() const { return body_views_ == nullptr && body_space_ == 0; }
  // Body bytes taken since the buffer or the views were set.
  std::size_t body_taken() const { return body_taken_; }
  // Instead of a buffer: the body's bytes are appended to `views` as views
  // of the bytes given to put(), with no limit on how many are taken.
  // Adjacent bytes (a Content-Length body put in pieces) extend one view.
  void set_body_views(std::vector<std::string_view>& views) {
    body_views_ = &views;
    body_data_ = nullptr;
    body_space_ = 0;
    body_taken_ = 0;
  }

 private:
  using Lines = std::basic_string<char, std::char_traits<char>, RecyclingAllocator<char>>;

  friend PlainFirstParser;
  std::size_t read_plain_head(std::string_view bytes);
  std::size_t take_plain_body(std::string_view bytes, boost::beast::error_code& ec);
  // Takes body bytes into the buffer or the views; what does not fit in the
  // buffer waits (need_buffer).
  std::size_t take_body(std::string_view body, boost::beast::error_code& ec);
  std::size_t take_plain_chunks(std::string_view bytes, boost::beast::error_code& ec);
  std::size_t hand_over_chunks(std::string_view bytes, std::size_t used,
                               boost::beast::error_code& ec);
  void begin_head(unsigned status);
  // Keeps an end-to-end field.
  void keep_field(std::string_view name, std::string_view value);
  // Drops the kept fields that a Connection field names.
  void drop_connection_options();

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

  Lines lines_;
  // The Connection values that name more than close or keep-alive, joined
  // by commas; only Beast's parser reads those.
  Lines connection_options_;
  std::size_t content_type_at_ = 0;
  std::size_t content_type_size_ = 0;
  std::optional<std::chrono::milliseconds> retry_after_;     // from Retry-After
  std::optional<std::chrono::milliseconds> retry_after_ms_;  // from retry-after-ms
  char* body_data_ = nullptr;
  std::size_t body_space_ = 0;
  std::vector<std::string_view>* body_views_ = nullptr;
  std::size_t body_taken_ = 0;
  unsigned status_ = 0;
  // Past a chunk's data, before the CRLF that ends it.
  bool chunk_data_ended_ = false;
};

}  // namespace sluice::upstream

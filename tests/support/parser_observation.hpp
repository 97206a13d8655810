#pragma once

// What a reading of an HTTP message leaves observable in the gateway's two
// parsers, so that the plain reader can be compared with Beast's parser on
// the same bytes (unit tests and the http_head fuzz target).

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/server/client_request.hpp"
#include "sluice/upstream/response_parser.hpp"

namespace sluice::testing {

// Feeds `text` to `parser` as a connection would deliver it: the first
// `first_piece` bytes, then all of it once the parser wants more. Stops at
// the end of the message (Beast's parser must not be fed after it), at an
// error other than `tolerated`, or when nothing more is taken.
template <class Parser>
std::size_t feed_in_two_pieces(Parser& parser, std::string_view text, std::size_t first_piece,
                               boost::system::error_code& ec, boost::beast::http::error tolerated) {
  std::size_t used = 0;
  std::size_t available = first_piece < text.size() ? first_piece : text.size();
  while (used < text.size() && !parser.is_done()) {
    ec = {};
    const auto taken = parser.put(boost::asio::buffer(text.data() + used, available - used), ec);
    used += taken;
    if (ec && ec != tolerated && ec != boost::beast::http::error::need_more) break;
    if (taken == 0 || ec == boost::beast::http::error::need_more) {
      if (available == text.size()) break;
      available = text.size();
      continue;
    }
    if (ec) break;
  }
  return used;
}

struct RequestReading {
  boost::system::error_code ec;
  std::size_t used = 0;
  bool plain = false;
  bool header_done = false;
  bool done = false;
  std::optional<bool> keep_alive;
  boost::beast::http::verb method = boost::beast::http::verb::unknown;
  std::string method_text, target, forwarded, withheld, body;
  unsigned version = 0;

  bool operator==(const RequestReading&) const = default;

  std::string describe() const {
    return "ec=" + ec.message() + " used=" + std::to_string(used) +
           " header_done=" + std::to_string(header_done) + " done=" + std::to_string(done) +
           " keep_alive=" + (keep_alive ? std::to_string(*keep_alive) : "-") +
           " method=" + method_text + " target=" + target + " version=" + std::to_string(version) +
           "\nforwarded=" + forwarded + "withheld=" + withheld + "body=" + body;
  }
};

inline RequestReading read_request(server::ClientRequest::Reading reader, std::string_view text,
                                   std::uint32_t header_limit, std::uint64_t body_limit,
                                   std::size_t first_piece = std::string_view::npos) {
  server::ClientRequest request(reader);
  request.header_limit(header_limit);
  request.body_limit(body_limit);
  RequestReading result;
  result.used = feed_in_two_pieces(request, text, first_piece, result.ec,
                                   boost::beast::http::error::need_more);
  result.plain = request.read_plainly();
  result.header_done = request.is_header_done();
  result.done = request.is_done();
  if (result.header_done) result.keep_alive = request.keep_alive();
  result.method = request.method();
  result.method_text = request.method_string();
  result.target = request.target();
  result.forwarded = request.forwarded_fields();
  result.withheld = request.withheld_fields();
  result.body = request.body();
  result.version = request.version();
  return result;
}

struct ResponseReading {
  boost::system::error_code ec;
  // The outcome of ending the connection there, when the message was not done.
  std::optional<boost::system::error_code> eof_ec;
  std::size_t used = 0;
  bool plain = false;
  bool header_done = false;
  bool done = false;
  std::optional<bool> keep_alive;
  std::optional<std::uint64_t> content_length;
  unsigned status = 0;
  std::string forwarded, content_type, body;
  std::optional<long> retry_after;

  bool operator==(const ResponseReading&) const = default;

  std::string describe() const {
    return "ec=" + ec.message() + " eof=" + (eof_ec ? eof_ec->message() : "-") +
           " used=" + std::to_string(used) + " header_done=" + std::to_string(header_done) +
           " done=" + std::to_string(done) +
           " keep_alive=" + (keep_alive ? std::to_string(*keep_alive) : "-") +
           " length=" + (content_length ? std::to_string(*content_length) : "-") +
           " status=" + std::to_string(status) + " type=" + content_type +
           " retry_after=" + (retry_after ? std::to_string(*retry_after) : "-") +
           "\nforwarded=" + forwarded + "body=" + body;
  }
};

// With a body buffer in place from the start, so the body follows the head.
inline ResponseReading read_response(upstream::ResponseParser::Reading reader,
                                     std::string_view text, std::uint32_t header_limit,
                                     std::size_t first_piece = std::string_view::npos) {
  upstream::ResponseParser parser(reader);
  parser.header_limit(header_limit);
  parser.body_limit(boost::none);
  char body[256];
  parser.set_body_buffer(body, sizeof body);
  ResponseReading result;
  result.used = feed_in_two_pieces(parser, text, first_piece, result.ec,
                                   boost::beast::http::error::need_buffer);
  const bool failed = result.ec && result.ec != boost::beast::http::error::need_more &&
                      result.ec != boost::beast::http::error::need_buffer;
  if (parser.got_some() && !parser.is_done() && !failed) {
    boost::system::error_code eof_ec;
    parser.put_eof(eof_ec);
    result.eof_ec = eof_ec;
  }
  result.plain = parser.read_plainly();
  result.header_done = parser.is_header_done();
  result.done = parser.is_done();
  if (result.header_done) {
    result.keep_alive = parser.keep_alive();
    if (auto length = parser.content_length()) result.content_length = *length;
  }
  result.status = parser.status();
  result.forwarded = parser.forwarded_fields();
  result.content_type = parser.content_type();
  result.body.assign(body, sizeof body - parser.body_space_left());
  if (auto seconds = parser.retry_after()) result.retry_after = seconds->count();
  return result;
}

}  // namespace sluice::testing

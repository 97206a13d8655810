// The upstream response parser: what it keeps of a head, and the body it
// hands over into the caller's buffer.
#include "sluice/upstream/response_parser.hpp"

#include <gtest/gtest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/http_head.hpp"
#include "support/feed_parser.hpp"

namespace sluice::upstream {
namespace {

namespace http = boost::beast::http;
using boost::beast::error_code;

using sluice::testing::feed_parser;

TEST(ResponseParser, KeepsEndToEndFieldsAsReceivedAndDropsHopByHopOnes) {
  const std::string head =
      "HTTP/1.1 429 Too Many Requests\r\n"
      "Server: upstream\r\n"
      "Connection: keep-alive\r\n"
      "Keep-Alive: timeout=5\r\n"
      "content-type: application/json; charset=utf-8\r\n"
      "Proxy-Authenticate: Basic\r\n"
      "Trailer: x-checksum\r\n"
      "X-RateLimit-Remaining-Requests: 0\r\n"
      "Retry-After: 7\r\n"
      "Content-Length: 2\r\n"
      "\r\n"
      "{}";
  ResponseParser parser;
  char body[16];
  parser.set_body_buffer(body, sizeof body);
  error_code ec;
  EXPECT_EQ(feed_parser(parser, head, ec), head.size());
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(parser.is_done());
  EXPECT_EQ(parser.status(), 429u);
  EXPECT_EQ(parser.forwarded_fields(),
            "Server: upstream\r\n"
            "content-type: application/json; charset=utf-8\r\n"
            "X-RateLimit-Remaining-Requests: 0\r\n"
            "Retry-After: 7\r\n");
  EXPECT_EQ(parser.content_type(), "application/json; charset=utf-8");
  EXPECT_FALSE(parser.is_event_stream());
  ASSERT_TRUE(parser.retry_after().has_value());
  EXPECT_EQ(parser.retry_after()->count(), 7);
  EXPECT_TRUE(parser.keep_alive());
  EXPECT_EQ(sizeof body - parser.body_space_left(), 2u);
  EXPECT_EQ(std::string_view(body, 2), "{}");
}

TEST(ResponseParser, EventStreamWithoutLengthAndADatedRetryAfter) {
  const std::string head =
      "HTTP/1.1 200 OK\r\n"
      "Content-Type: Text/Event-Stream; charset=utf-8\r\n"
      "Retry-After: Wed, 21 Oct 2026 07:28:00 GMT\r\n"
      "Transfer-Encoding: chunked\r\n"
      "\r\n";
  ResponseParser parser;
  error_code ec;
  feed_parser(parser, head, ec);
  ASSERT_TRUE(parser.is_header_done());
  EXPECT_TRUE(parser.is_event_stream());
  EXPECT_FALSE(parser.retry_after().has_value());
  EXPECT_TRUE(parser.chunked());
  EXPECT_EQ(parser.forwarded_fields(),
            "Content-Type: Text/Event-Stream; charset=utf-8\r\n"
            "Retry-After: Wed, 21 Oct 2026 07:28:00 GMT\r\n");
}

// A line written "Name: value" is kept as it came; any other spacing, an
// empty value and a folded value are written out as "Name: value" too, so
// what is forwarded is the same whichever way the upstream spelled it.
TEST(ResponseParser, FieldsWithOtherSpacingAreForwardedNormalised) {
  const std::string head =
      "HTTP/1.1 200 OK\r\n"
      "Content-Type:\t application/json \r\n"
      "X-Plain: one\r\n"
      "X-Tight:two\r\n"
      "X-Empty:\r\n"
      "X-Space-Only: \r\n"
      "X-Folded: first\r\n"
      " second\r\n"
      "X-Tab:\tfour\r\n"
      "X-Trailing: five \r\n"
      "X-Last: three\r\n"
      "Content-Length: 0\r\n"
      "\r\n";
  ResponseParser parser;
  error_code ec;
  feed_parser(parser, head, ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(parser.is_done());
  EXPECT_EQ(parser.forwarded_fields(),
            "Content-Type: application/json\r\n"
            "X-Plain: one\r\n"
            "X-Tight: two\r\n"
            "X-Empty: \r\n"
            "X-Space-Only: \r\n"
            "X-Folded: first second\r\n"
            "X-Tab: four\r\n"
            "X-Trailing: five\r\n"
            "X-Last: three\r\n");
  EXPECT_EQ(parser.content_type(), "application/json");
}

TEST(ResponseParser, NoContentTypeIsEmpty) {
  ResponseParser parser;
  error_code ec;
  feed_parser(parser, "HTTP/1.1 204 No Content\r\nServer: x\r\n\r\n", ec);
  ASSERT_TRUE(parser.is_done());
  EXPECT_EQ(parser.status(), 204u);
  EXPECT_EQ(parser.content_type(), "");
  EXPECT_FALSE(parser.is_event_stream());
}

// A chunked body larger than the buffer arrives over several buffers, with
// need_buffer whenever the current one is full, and nothing lost or repeated.
TEST(ResponseParser, ChunkedBodyFillsOneBufferAfterAnother) {
  std::string payload;
  for (int i = 0; i < 40; ++i) payload += "data: event " + std::to_string(i) + "\n\n";
  std::string wire =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  for (std::size_t at = 0; at < payload.size(); at += 100) {
    auto piece = payload.substr(at, 100);
    char size[16];
    std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
    wire += size + piece + "\r\n";
  }
  wire += "0\r\n\r\n";

  ResponseParser parser;
  parser.header_limit(8192);
  error_code ec;
  std::size_t used = feed_parser(parser, wire, ec);
  ASSERT_TRUE(parser.is_header_done());
  // No buffer yet: the body waits.
  EXPECT_EQ(ec, http::error::need_buffer);

  std::string received;
  char buffer[64];
  for (int round = 0; round < 1000 && !parser.is_done(); ++round) {
    parser.set_body_buffer(buffer, sizeof buffer);
    ec = {};
    used += parser.put(boost::asio::buffer(wire.data() + used, wire.size() - used), ec);
    ASSERT_TRUE(!ec || ec == http::error::need_buffer) << ec.message();
    received.append(buffer, sizeof buffer - parser.body_space_left());
  }
  ASSERT_TRUE(parser.is_done());
  EXPECT_EQ(used, wire.size());
  EXPECT_EQ(received, payload);
}

TEST(ResponseParser, ContentLengthBodyStopsWhenTheBufferIsFull) {
  const std::string wire = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789";
  ResponseParser parser;
  error_code ec;
  std::size_t used = feed_parser(parser, wire, ec);
  char first[4];
  parser.set_body_buffer(first, sizeof first);
  ec = {};
  used += parser.put(boost::asio::buffer(wire.data() + used, wire.size() - used), ec);
  EXPECT_EQ(ec, http::error::need_buffer);
  EXPECT_EQ(parser.body_space_left(), 0u);
  EXPECT_EQ(std::string_view(first, 4), "0123");
  char rest[16];
  parser.set_body_buffer(rest, sizeof rest);
  ec = {};
  used += parser.put(boost::asio::buffer(wire.data() + used, wire.size() - used), ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(parser.is_done());
  EXPECT_EQ(std::string_view(rest, sizeof rest - parser.body_space_left()), "456789");
}

TEST(ResponseParser, RefusesSomethingThatIsNotAResponse) {
  ResponseParser parser;
  error_code ec;
  feed_parser(parser, "POST /v1/chat/completions HTTP/1.1\r\n\r\n", ec);
  EXPECT_TRUE(ec);
}

// The parser decides by Beast's lookup of the name, the client side by the
// name itself: both must agree on every name either knows as hop-by-hop.
TEST(ResponseParser, HopByHopFieldsAreTheNamesTheClientSideDrops) {
  const std::vector<std::string_view> names = {"te",
                                               "host",
                                               "trailer",
                                               "upgrade",
                                               "connection",
                                               "keep-alive",
                                               "content-length",
                                               "proxy-connection",
                                               "transfer-encoding",
                                               "proxy-authenticate",
                                               "proxy-authorization",
                                               "content-type",
                                               "server",
                                               "retry-after",
                                               "cache-control",
                                               "x-request-id",
                                               "date",
                                               "set-cookie"};
  for (auto name : names) {
    const auto field = http::string_to_field(name);
    if (is_hop_by_hop_header(name)) {
      EXPECT_NE(field, http::field::unknown) << name;
    }
    EXPECT_EQ(is_hop_by_hop_field(field), is_hop_by_hop_header(name)) << name;
  }
}

}  // namespace
}  // namespace sluice::upstream

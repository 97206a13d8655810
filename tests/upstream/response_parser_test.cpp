// The upstream response parser: what it keeps of a head, and the body it
// hands over into the caller's buffer.
#include "sluice/upstream/response_parser.hpp"

#include <gtest/gtest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/http/http_head.hpp"
#include "support/altered_heads.hpp"
#include "support/feed_parser.hpp"
#include "support/parser_observation.hpp"

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
            "upstream-X-RateLimit-Remaining-Requests: 0\r\n"
            "Retry-After: 7\r\n");
  EXPECT_EQ(parser.content_type(), "application/json; charset=utf-8");
  EXPECT_FALSE(parser.is_event_stream());
  ASSERT_TRUE(parser.retry_after().has_value());
  EXPECT_EQ(*parser.retry_after(), std::chrono::seconds(7));
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

// Azure OpenAI sends retry-after-ms with Retry-After: the milliseconds are
// the more precise, whichever order they come in.
TEST(ResponseParser, RetryAfterMsIsPreferredToRetryAfter) {
  for (const std::string fields : {"Retry-After: 2\r\nretry-after-ms: 1500\r\n",
                                   "Retry-After-Ms: 1500\r\nRetry-After: 2\r\n"}) {
    const std::string head = "HTTP/1.1 429 Too Many Requests\r\n" + fields +
                             "Content-Length: 2\r\n"
                             "\r\n"
                             "{}";
    ResponseParser parser;
    char body[16];
    parser.set_body_buffer(body, sizeof body);
    error_code ec;
    feed_parser(parser, head, ec);
    ASSERT_TRUE(parser.is_done()) << ec.message();
    EXPECT_EQ(parser.retry_after(), std::chrono::milliseconds(1500)) << fields;
    EXPECT_EQ(parser.forwarded_fields(), fields) << "both are forwarded as they came";
  }
}

TEST(ResponseParser, RetryAfterMsAloneOrUnreadable) {
  const auto retry_after_of = [](const std::string& fields) {
    const std::string head = "HTTP/1.1 429 Too Many Requests\r\n" + fields +
                             "Content-Length: 0\r\n"
                             "\r\n";
    ResponseParser parser;
    error_code ec;
    feed_parser(parser, head, ec);
    return parser.retry_after();
  };
  EXPECT_EQ(retry_after_of("retry-after-ms: 250\r\n"), std::chrono::milliseconds(250));
  EXPECT_EQ(retry_after_of("retry-after-ms: 1.5\r\nRetry-After: 3\r\n"), std::chrono::seconds(3))
      << "an unreadable retry-after-ms leaves Retry-After to speak";
  EXPECT_EQ(retry_after_of("retry-after-ms: soon\r\n"), std::nullopt);
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

// Handed over as views, a chunked body is the bytes that were put, never a
// copy: one view per chunk's data, whatever the reader that frames it.
TEST(ResponseParser, BodyViewsPointIntoTheBytesPut) {
  const std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"7\r\ndata: a\r\n9\r\ndata: bcd\r\n0\r\n\r\n", {"data: a", "data: bcd"}},
      // Extensions and a trailer: Beast's parser frames these.
      {"7;x=y\r\ndata: a\r\n9\r\ndata: bcd\r\n0\r\nX-Sum: 1\r\n\r\n", {"data: a", "data: bcd"}},
  };
  for (const auto& [chunks, expected] : cases) {
    SCOPED_TRACE(chunks);
    ResponseParser parser;
    parser.body_limit(boost::none);
    error_code ec;
    ASSERT_EQ(feed_parser(parser, head, ec), head.size());
    std::vector<std::string_view> views;
    std::size_t used = 0;
    for (int round = 0; round < 10 && !parser.is_done(); ++round) {
      parser.set_body_views(views);
      ec = {};
      used += parser.put(boost::asio::buffer(chunks.data() + used, chunks.size() - used), ec);
      ASSERT_TRUE(!ec || ec == http::error::need_more) << ec.message();
    }
    ASSERT_TRUE(parser.is_done());
    EXPECT_EQ(used, chunks.size());
    ASSERT_EQ(views.size(), expected.size());
    for (std::size_t i = 0; i < views.size(); ++i) {
      EXPECT_EQ(views[i], expected[i]);
      EXPECT_GE(views[i].data(), chunks.data());
      EXPECT_LE(views[i].data() + views[i].size(), chunks.data() + chunks.size());
    }
  }

  // A Content-Length body put in two pieces of one buffer is one view, and
  // set_body_views counts what it takes from then on.
  const std::string wire = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789";
  ResponseParser parser;
  error_code ec;
  std::size_t used = feed_parser(parser, wire, ec);
  std::vector<std::string_view> views;
  parser.set_body_views(views);
  for (std::size_t piece : {4, 6}) {
    ec = {};
    used += parser.put(boost::asio::buffer(wire.data() + used, piece), ec);
    EXPECT_FALSE(ec) << ec.message();
  }
  EXPECT_TRUE(parser.is_done());
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0], "0123456789");
  EXPECT_EQ(views[0].data(), wire.data() + wire.size() - 10);
  EXPECT_EQ(parser.body_taken(), 10u);
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

// Plain chunks are followed by the plain reader whatever pieces they arrive
// in; at a chunk line of another shape Beast's parser takes over, the head
// still the plain reader's. Either way the body is the one Beast reads.
TEST(ResponseParser, ChunksArriveWholeInAnyPiecesAndOtherChunkLinesGoToBeast) {
  const std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  const std::pair<std::string, std::string> cases[] = {
      {"7\r\ndata: a\r\n11\r\ndata: {\"b\":12345}\r\n0\r\n\r\n", "data: adata: {\"b\":12345}"},
      {"7\r\ndata: a\r\n3 ; x=\"y\"\r\ncde\r\n0\r\nX-Sum: 9\r\n\r\n", "data: acde"},
  };
  for (const auto& [chunks, body] : cases) {
    for (std::size_t piece : {std::size_t{1}, std::size_t{2}, std::size_t{5}, chunks.size()}) {
      SCOPED_TRACE(chunks + " in pieces of " + std::to_string(piece));
      ResponseParser parser;
      parser.body_limit(boost::none);  // as the gateway reads upstream bodies
      error_code ec;
      EXPECT_EQ(feed_parser(parser, head, ec), head.size());
      ASSERT_TRUE(parser.read_plainly());
      EXPECT_TRUE(parser.chunked());
      EXPECT_FALSE(parser.keep_alive());
      std::string received;
      char buffer[8];
      std::string pending;
      for (std::size_t at = 0; at < chunks.size(); at += piece) {
        pending += chunks.substr(at, piece);
        for (int round = 0; round < 100 && !pending.empty() && !parser.is_done(); ++round) {
          parser.set_body_buffer(buffer, sizeof buffer);
          ec = {};
          const auto taken = parser.put(boost::asio::buffer(pending), ec);
          received.append(buffer, sizeof buffer - parser.body_space_left());
          pending.erase(0, taken);
          if (ec == http::error::need_more) break;
          ASSERT_TRUE(!ec || ec == http::error::need_buffer) << ec.message();
        }
      }
      EXPECT_TRUE(parser.is_done());
      EXPECT_EQ(pending, "");
      EXPECT_EQ(received, body);
      EXPECT_TRUE(parser.read_plainly());
      EXPECT_FALSE(parser.keep_alive());  // the head's Connection: close, not Beast's view
    }
  }
  // A chunk's data must end with CRLF.
  ResponseParser parser;
  parser.body_limit(boost::none);
  error_code ec;
  char buffer[16];
  parser.set_body_buffer(buffer, sizeof buffer);
  feed_parser(parser, head + "2\r\nabXY3\r\n", ec);
  EXPECT_EQ(ec, http::error::bad_chunk);
}

TEST(ResponseParser, APlainHeadIsReadPlainlyAndItsBodyWaitsForABuffer) {
  const std::string wire =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\nabcd";
  ResponseParser parser;
  error_code ec;
  const std::size_t head = feed_parser(parser, wire, ec);
  EXPECT_TRUE(parser.read_plainly());
  EXPECT_EQ(head, wire.size() - 4);
  EXPECT_EQ(ec, http::error::need_buffer);
  EXPECT_EQ(parser.content_length().value_or(0), 4u);
  EXPECT_FALSE(parser.chunked());
  char body[8];
  parser.set_body_buffer(body, sizeof body);
  ec = {};
  EXPECT_EQ(parser.put(boost::asio::buffer(wire.data() + head, 2), ec), 2u);
  EXPECT_FALSE(parser.is_done());
  parser.put_eof(ec);
  EXPECT_EQ(ec, http::error::partial_message);

  // A chunked body under a body limit (Beast's default here), close-delimited
  // bodies and the statuses that decide a body themselves are Beast's to frame.
  for (const std::string text : {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                 "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
                                 "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"}) {
    ResponseParser other;
    feed_parser(other, text, ec);
    EXPECT_TRUE(other.is_header_done()) << text;
    EXPECT_FALSE(other.read_plainly()) << text;
  }
}

// Whatever the plain reader takes, it reads as Beast's parser does; what it
// leaves, Beast's parser reads. True when the plain reader took the head.
bool expect_read_alike(const std::string& text, std::uint32_t header_limit = 8192) {
  using sluice::testing::read_response;
  const auto first =
      read_response(ResponseParser::Reading::plain_when_possible, text, header_limit);
  auto beast = read_response(ResponseParser::Reading::beast_only, text, header_limit);
  beast.plain = first.plain;
  EXPECT_EQ(first, beast) << "head limit " << header_limit << ", text:\n"
                          << text << "\n-- plain reader first: " << first.describe()
                          << "\n-- Beast's reader: " << beast.describe();
  return first.plain;
}

// Each head altered at every position (altered_heads), under the default
// head limit and limits the head or its fields just meet or just exceed.
TEST(ResponseParser, ThePlainReaderAgreesWithBeastOnAlteredHeads) {
  const std::string bases[] = {
      "HTTP/1.1 200 OK\r\n"
      "Content-Type: application/json\r\n"
      "x-request-id: r1\r\n"
      "Retry-After: 7\r\n"
      "Connection: keep-alive\r\n"
      "Content-Length: 2\r\n"
      "\r\n"
      "{}",
      "HTTP/1.0 429 Too Many Requests\r\n"
      "Connection: keep-alive\r\n"
      "Keep-Alive: timeout=5\r\n"
      "Server:  up \t\r\n"
      "Content-Length: 0\r\n"
      "\r\n",
      "HTTP/1.1 503 \r\n"
      "content-type:text/plain\r\n"
      "Connection: close\r\n"
      "Content-Length: 3\r\n"
      "\r\n"
      "bad",
      "HTTP/1.1 200 OK\r\n"
      "Content-Type: text/event-stream\r\n"
      "Transfer-Encoding: chunked\r\n"
      "\r\n"
      "7\r\ndata: a\r\n"
      "0A\r\ndata: bc\n\n\r\n"
      "0\r\n\r\n",
      "HTTP/1.1 200 OK\r\n"
      "Transfer-Encoding: chunked\r\n"
      "\r\n"
      "2\r\nab\r\n"
      "3;x=y\r\ncde\r\n"
      "0\r\nX-Sum: 1\r\n\r\n",
  };
  std::size_t compared = 0;
  std::size_t read_plainly = 0;
  for (const std::string& base : bases) {
    const auto head_size = static_cast<std::uint32_t>(base.find("\r\n\r\n") + 4);
    // Beast's parser holds the status line and the fields to the limit
    // each, not together.
    const auto fields_size = head_size - static_cast<std::uint32_t>(base.find("\r\n") + 2);
    for (const std::string& text : sluice::testing::altered_heads(base)) {
      for (std::uint32_t header_limit : {8192u, head_size, head_size - 1, fields_size - 1}) {
        ++compared;
        if (expect_read_alike(text, header_limit)) ++read_plainly;
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
  // Both readers must have been exercised: a plain reader that took nothing
  // would agree with Beast trivially.
  EXPECT_GT(read_plainly, compared / 16) << read_plainly << " of " << compared;
  EXPECT_LT(read_plainly, compared * 3 / 4) << read_plainly << " of " << compared;
}

// Framing, status and connection edges the alterations above do not reach.
TEST(ResponseParser, ThePlainReaderAgreesWithBeastOnFramingEdges) {
  for (const std::string text : {
           "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
           "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
           "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
           "HTTP/1.1 200 OK\r\n\r\nto the end",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
           "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551616\r\n\r\n{}",
           "HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\n{}",
           "HTTP/1.1 200 OK\r\nProxy-Connection: close\r\nContent-Length: 2\r\n\r\n{}",
           "HTTP/1.0 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\n"
           "Content-Length: 2\r\n\r\n{}",
           "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\n{}",
           "HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\n{}",
           "HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",
           "HTTP/1.1 200 Caf\xc3\xa9\r\nContent-Length: 2\r\n\r\n{}",
           "HTTP/1.1 200 OK\r\nRetry-After: 12abc\r\nContent-Length: 2\r\n\r\n{}",
           "HTTP/1.1 200 OK\r\nContent-Type: a\r\ncontent-type: b\r\nContent-Length: 0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: "
           "chunked\r\n\r\n0000000000000002\r\n{}\r\n0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: "
           "chunked\r\n\r\n000000000000002\r\n{}\r\n00\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: "
           "chunked\r\n\r\nFFFFFFFFFFFFFFFFF\r\n{}\r\n0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}",
           "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXYZ",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0;last\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
       }) {
    expect_read_alike(text);
  }
}

constexpr std::initializer_list<ResponseParser::Reading> kBothReaders = {
    ResponseParser::Reading::plain_when_possible, ResponseParser::Reading::beast_only};

// The upstream's request id and rate limits are renamed out of the way of
// the gateway's own, in any spelling and however the line was written; a
// name that only starts alike is not.
TEST(ResponseParser, TheUpstreamsRequestIdAndRateLimitsAreRenamed) {
  const std::string head =
      "HTTP/1.1 200 OK\r\n"
      "X-Request-ID: req-1\r\n"
      "x-ratelimit-limit-requests:5000\r\n"
      "x-ratelimit-remaining-tokens: 89000\r\n"
      "x-request-ids: not-renamed\r\n"
      "x-ratelimits: not-renamed\r\n"
      "Content-Type: application/json\r\n"
      "Content-Length: 0\r\n"
      "\r\n";
  for (auto reading : kBothReaders) {
    ResponseParser parser(reading);
    error_code ec;
    EXPECT_EQ(feed_parser(parser, head, ec), head.size());
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(parser.forwarded_fields(),
              "upstream-X-Request-ID: req-1\r\n"
              "upstream-x-ratelimit-limit-requests: 5000\r\n"
              "upstream-x-ratelimit-remaining-tokens: 89000\r\n"
              "x-request-ids: not-renamed\r\n"
              "x-ratelimits: not-renamed\r\n"
              "Content-Type: application/json\r\n");
    EXPECT_EQ(parser.content_type(), "application/json");
  }
}

// The fields a Connection field names are hop-by-hop (RFC 9110 §7.6.1):
// dropped wherever they stand, a renamed one by the name the upstream gave
// it, and the content type found where it moved to.
TEST(ResponseParser, FieldsAConnectionFieldNamesAreDropped) {
  const std::string head =
      "HTTP/1.1 200 OK\r\n"
      "X-Hop: 1\r\n"
      "x-request-id: req-1\r\n"
      "Connection: keep-alive, x-hop\r\n"
      "X-Kept: 2\r\n"
      "Content-Type: text/event-stream\r\n"
      "connection: X-Request-Id ,X-Later-Hop\r\n"
      "x-later-hop: 3\r\n"
      "Transfer-Encoding: chunked\r\n"
      "\r\n"
      "2\r\nab\r\n0\r\n\r\n";
  for (auto reading : kBothReaders) {
    ResponseParser parser(reading);
    std::vector<std::string_view> views;
    parser.set_body_views(views);
    error_code ec;
    EXPECT_EQ(feed_parser(parser, head, ec), head.size());
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_TRUE(parser.is_done());
    EXPECT_TRUE(parser.keep_alive());
    EXPECT_EQ(parser.forwarded_fields(), "X-Kept: 2\r\nContent-Type: text/event-stream\r\n");
    EXPECT_EQ(parser.content_type(), "text/event-stream");
    EXPECT_TRUE(parser.is_event_stream());
  }
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

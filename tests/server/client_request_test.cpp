// The client request as the stages read it: what the parser keeps of the
// head, which fields travel upstream, and the body however it was framed --
// the same whichever reader took the head, the plain one or Beast's.
#include "sluice/server/client_request.hpp"

#include <gtest/gtest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/altered_heads.hpp"
#include "support/feed_parser.hpp"
#include "support/parser_observation.hpp"

namespace sluice::server {
namespace {

namespace http = boost::beast::http;
using boost::beast::error_code;

using sluice::testing::feed_parser;
using Reading = ClientRequest::Reading;

constexpr std::initializer_list<Reading> kBothReaders = {Reading::plain_when_possible,
                                                         Reading::beast_only};

const char* name_of(Reading reading) {
  return reading == Reading::beast_only ? "Beast's reader" : "the plain reader first";
}

TEST(ClientRequest, SplitsTheFieldsIntoForwardedAndWithheldLines) {
  const std::string text =
      "POST /v1/chat/completions?x=1 HTTP/1.1\r\n"
      "Host: gateway\r\n"
      "Authorization: Bearer sk-secret\r\n"
      "content-type: application/json\r\n"
      "X-Stainless-Lang: python\r\n"
      "x-api-key: sk-other\r\n"
      "Traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
      "Accept-Encoding: gzip\r\n"
      "X-Request-Id: abc\r\n"
      "Expect: 100-continue\r\n"
      "OpenAI-Beta: assistants=v2\r\n"
      "Content-Length: 2\r\n"
      "\r\n"
      "{}";
  for (Reading reading : kBothReaders) {
    SCOPED_TRACE(name_of(reading));
    ClientRequest request(reading);
    error_code ec;
    EXPECT_EQ(feed_parser(request, text, ec), text.size());
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(request.is_done());
    EXPECT_EQ(request.read_plainly(), reading == Reading::plain_when_possible);
    EXPECT_EQ(request.method(), http::verb::post);
    EXPECT_EQ(request.method_string(), "POST");
    EXPECT_EQ(request.target(), "/v1/chat/completions?x=1");
    EXPECT_EQ(request.version(), 11u);
    EXPECT_TRUE(request.keep_alive());
    EXPECT_EQ(request.body(), "{}");
    // In the order and spelling received; credentials, framing, the trace and
    // request id (the gateway writes its own), Expect and encodings stay.
    EXPECT_EQ(request.forwarded_fields(),
              "content-type: application/json\r\n"
              "X-Stainless-Lang: python\r\n"
              "OpenAI-Beta: assistants=v2\r\n");
    // Every field can be looked up, withheld or not, by any spelling.
    EXPECT_EQ(request.withheld_fields(),
              "Host: gateway\r\n"
              "Authorization: Bearer sk-secret\r\n"
              "x-api-key: sk-other\r\n"
              "Traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
              "Accept-Encoding: gzip\r\n"
              "X-Request-Id: abc\r\n"
              "Expect: 100-continue\r\n"
              "Content-Length: 2\r\n");
    EXPECT_EQ(request["authorization"], "Bearer sk-secret");
    EXPECT_EQ(request["Authorization"], "Bearer sk-secret");
    EXPECT_EQ(request["X-API-KEY"], "sk-other");
    EXPECT_EQ(request["x-request-id"], "abc");
    EXPECT_EQ(request["openai-beta"], "assistants=v2");
    EXPECT_EQ(request["Content-Type"], "application/json");
    EXPECT_EQ(request["expect"], "100-continue");
    EXPECT_EQ(request["x-missing"], "");
    EXPECT_EQ(request["cache-control"], "");
  }
}

TEST(ClientRequest, RepeatedFieldsAreAllKeptAndTheFirstIsLookedUp) {
  const std::string text =
      "GET /v1/models HTTP/1.0\r\n"
      "Cache-Control: max-age=0\r\n"
      "X-Tag: one\r\n"
      "cache-control: no-store\r\n"
      "X-Tag: two\r\n"
      "\r\n";
  for (Reading reading : kBothReaders) {
    SCOPED_TRACE(name_of(reading));
    ClientRequest request(reading);
    error_code ec;
    EXPECT_EQ(feed_parser(request, text, ec), text.size());
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(request.version(), 10u);
    EXPECT_FALSE(request.keep_alive());  // HTTP/1.0 without keep-alive
    EXPECT_EQ(request["x-tag"], "one");
    std::vector<std::string> values;
    request.for_each_value("Cache-Control",
                           [&](std::string_view value) { values.emplace_back(value); });
    EXPECT_EQ(values, (std::vector<std::string>{"max-age=0", "no-store"}));
    EXPECT_EQ(
        request.forwarded_fields(),
        "Cache-Control: max-age=0\r\nX-Tag: one\r\ncache-control: no-store\r\nX-Tag: two\r\n");
  }
}

TEST(ClientRequest, FieldsAreFoundInAnyCaseAndAbsentOnesAreNot) {
  // Names of one length and first letter share a mark: the lookup must still
  // tell them apart; and a name with no mark at all is answered empty.
  const std::string text =
      "POST /v1/chat/completions HTTP/1.1\r\n"
      "Host: a\r\n"
      "X-Request-Id: r-1\r\n"
      "Authorization: Bearer k\r\n"
      "Content-Length: 0\r\n"
      "\r\n";
  for (Reading reading : kBothReaders) {
    SCOPED_TRACE(name_of(reading));
    ClientRequest request(reading);
    error_code ec;
    EXPECT_EQ(feed_parser(request, text, ec), text.size());
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(request["x-request-id"], "r-1");
    EXPECT_EQ(request["X-REQUEST-ID"], "r-1");
    EXPECT_EQ(request["authorization"], "Bearer k");
    EXPECT_EQ(request["x-request-ix"], "");  // same length and first letter
    EXPECT_EQ(request["traceparent"], "");
    EXPECT_EQ(request["expect"], "");
    EXPECT_EQ(request[""], "");
  }
}

TEST(ClientRequest, TheFirstContentTypeIsNotedAsTheHeadIsRead) {
  const std::string plain =
      "POST /v1/audio/transcriptions HTTP/1.1\r\n"
      "X-Request-Id: abc\r\n"
      "content-TYPE: multipart/form-data; boundary=b\r\n"
      "Content-Type: application/json\r\n"
      "Content-Length: 0\r\n"
      "\r\n";
  // The plain reader gives a chunked head to Beast's after reading its
  // fields.
  std::string chunked = plain;
  chunked.replace(chunked.find("Content-Length: 0"), 17, "Transfer-Encoding: chunked");
  chunked += "0\r\n\r\n";
  const std::string without =
      "POST /v1/moderations HTTP/1.1\r\n"
      "X-Request-Id: abc\r\n"
      "Content-Length: 0\r\n"
      "\r\n";
  for (Reading reading : kBothReaders) {
    SCOPED_TRACE(name_of(reading));
    for (const std::string& text : {plain, chunked}) {
      ClientRequest request(reading);
      error_code ec;
      EXPECT_EQ(feed_parser(request, text, ec), text.size());
      ASSERT_FALSE(ec) << ec.message();
      EXPECT_EQ(request.content_type(), "multipart/form-data; boundary=b");
    }
    ClientRequest request(reading);
    error_code ec;
    EXPECT_EQ(feed_parser(request, without, ec), without.size());
    EXPECT_EQ(request.content_type(), "");
  }
}

TEST(ClientRequest, AChunkedBodyArrivesWholeWhateverThePieces) {
  const std::string head =
      "POST /v1/embeddings HTTP/1.1\r\n"
      "Transfer-Encoding: chunked\r\n"
      "Connection: close\r\n"
      "\r\n";
  const std::string body = "5\r\n{\"a\":\r\n3\r\n12}\r\n0\r\n\r\n";
  ClientRequest request;
  error_code ec;
  EXPECT_EQ(feed_parser(request, head, ec), head.size());
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_FALSE(request.is_done());
  EXPECT_FALSE(request.keep_alive());
  EXPECT_EQ(request.forwarded_fields(), "");
  // A byte at a time: the parser asks for more until a chunk line is whole.
  std::string pending;
  for (char c : body) {
    pending.push_back(c);
    auto taken = feed_parser(request, pending, ec);
    if (ec == http::error::need_more) ec = {};
    ASSERT_FALSE(ec) << ec.message();
    pending.erase(0, taken);
  }
  EXPECT_TRUE(request.is_done());
  EXPECT_EQ(request.body(), "{\"a\":12}");
}

TEST(ClientRequest, KeepsAMethodBeastDoesNotKnow) {
  const std::string text = "BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n";
  for (Reading reading : kBothReaders) {
    SCOPED_TRACE(name_of(reading));
    ClientRequest request(reading);
    error_code ec;
    EXPECT_EQ(feed_parser(request, text, ec), text.size());
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(request.method(), http::verb::unknown);
    EXPECT_EQ(request.method_string(), "BREW");
    EXPECT_EQ(request.target(), "/pot");
  }
}

TEST(ClientRequest, LimitsAndBadHeadsAreErrors) {
  for (Reading reading : kBothReaders) {
    SCOPED_TRACE(name_of(reading));
    {
      ClientRequest request(reading);
      request.header_limit(64);
      error_code ec;
      feed_parser(request, "POST / HTTP/1.1\r\nX-Long: " + std::string(100, 'a') + "\r\n\r\n", ec);
      EXPECT_EQ(ec, http::error::header_limit);
    }
    {
      ClientRequest request(reading);
      request.body_limit(4);
      error_code ec;
      feed_parser(request, "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789", ec);
      EXPECT_EQ(ec, http::error::body_limit);
    }
    {
      ClientRequest request(reading);
      error_code ec;
      feed_parser(request, "HTTP/1.1 200 OK\r\n\r\n", ec);
      EXPECT_TRUE(ec);
    }
    {
      ClientRequest request(reading);
      error_code ec;
      feed_parser(request, "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", ec);
      EXPECT_TRUE(ec);
    }
  }
}

// RFC 9112 §6.3: without chunked as its last coding, a request's body has
// no length the gateway could know. Beast's parser alone would read the
// request as one without a body.
TEST(ClientRequest, ATransferCodingOtherThanChunkedLastIsAnError) {
  for (Reading reading : kBothReaders) {
    SCOPED_TRACE(name_of(reading));
    for (const std::string framing :
         {"Transfer-Encoding: gzip\r\n", "Transfer-Encoding: chunked, gzip\r\n",
          "Transfer-Encoding: gzip\r\nContent-Length: 2\r\n",
          "Content-Length: 2\r\nTransfer-Encoding: identity\r\n"}) {
      ClientRequest request(reading);
      error_code ec;
      feed_parser(request, "POST / HTTP/1.1\r\n" + framing + "\r\n{}", ec);
      EXPECT_EQ(ec, http::error::bad_transfer_encoding) << framing;
    }
    ClientRequest request(reading);
    error_code ec;
    const std::string text =
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    EXPECT_EQ(feed_parser(request, text, ec), text.size());
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(request.body(), "{}");
  }
}

// The fields a Connection field names are hop-by-hop (RFC 9110 §7.6.1):
// withheld like the others, wherever they stand, and still looked up.
TEST(ClientRequest, FieldsAConnectionFieldNamesAreWithheld) {
  const std::string text =
      "POST / HTTP/1.1\r\n"
      "X-Hop: 1\r\n"
      "Content-Type: application/json\r\n"
      "Connection: keep-alive, x-hop\r\n"
      "X-Kept: 2\r\n"
      "connection: X-Later-Hop\r\n"
      "x-later-hop: 3\r\n"
      "Content-Length: 2\r\n"
      "\r\n"
      "{}";
  for (Reading reading : kBothReaders) {
    SCOPED_TRACE(name_of(reading));
    ClientRequest request(reading);
    error_code ec;
    EXPECT_EQ(feed_parser(request, text, ec), text.size());
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_TRUE(request.keep_alive());
    EXPECT_EQ(request.forwarded_fields(), "Content-Type: application/json\r\nX-Kept: 2\r\n");
    EXPECT_EQ(request.withheld_fields(),
              "Connection: keep-alive, x-hop\r\nconnection: X-Later-Hop\r\n"
              "Content-Length: 2\r\nX-Hop: 1\r\nx-later-hop: 3\r\n");
    EXPECT_EQ(request["x-hop"], "1");
    EXPECT_EQ(request["X-Later-Hop"], "3");
    EXPECT_EQ(request["x-kept"], "2");
    EXPECT_EQ(request.content_type(), "application/json");
    EXPECT_EQ(request.body(), "{}");
  }
}

TEST(ClientRequest, APlainBodyArrivesWholeWhateverThePieces) {
  const std::string head =
      "POST /v1/embeddings HTTP/1.1\r\n"
      "Content-Length: 8\r\n"
      "Connection: close\r\n"
      "\r\n";
  const std::string body = "{\"a\":12}";
  ClientRequest request;
  error_code ec;
  EXPECT_EQ(feed_parser(request, head + body.substr(0, 3), ec), head.size() + 3);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(request.read_plainly());
  EXPECT_TRUE(request.is_header_done());
  EXPECT_FALSE(request.is_done());
  EXPECT_FALSE(request.keep_alive());
  for (char c : body.substr(3)) {
    EXPECT_EQ(feed_parser(request, std::string(1, c), ec), 1u);
    ASSERT_FALSE(ec) << ec.message();
  }
  EXPECT_TRUE(request.is_done());
  EXPECT_EQ(request.body(), body);
  request.put_eof(ec);
  EXPECT_FALSE(ec);

  // The connection ending before the body is whole is a partial message.
  ClientRequest cut;
  feed_parser(cut, head + "{", ec);
  ASSERT_TRUE(cut.read_plainly());
  cut.put_eof(ec);
  EXPECT_EQ(ec, http::error::partial_message);
}

// Whatever the plain reader takes, it reads as Beast's parser does; what it
// leaves, Beast's parser reads. True when the plain reader took the head.
bool expect_read_alike(const std::string& text, std::uint32_t header_limit = 8192,
                       std::uint64_t body_limit = 1024 * 1024) {
  using sluice::testing::read_request;
  const auto first = read_request(Reading::plain_when_possible, text, header_limit, body_limit);
  auto beast = read_request(Reading::beast_only, text, header_limit, body_limit);
  beast.plain = first.plain;
  EXPECT_EQ(first, beast) << "head limit " << header_limit << ", body limit " << body_limit
                          << ", text:\n"
                          << text << "\n-- plain reader first: " << first.describe()
                          << "\n-- Beast's reader: " << beast.describe();
  return first.plain;
}

// Each head altered at every position (altered_heads), under the default
// limits and under limits the head, its fields or the body just meet or just
// exceed.
TEST(ClientRequest, ThePlainReaderAgreesWithBeastOnAlteredHeads) {
  const std::string bases[] = {
      "POST /v1/chat/completions HTTP/1.1\r\n"
      "Host: 127.0.0.1:8080\r\n"
      "Authorization: Bearer sk-test\r\n"
      "Content-Type: application/json\r\n"
      "X-Stainless-Lang: python\r\n"
      "Content-Length: 17\r\n"
      "\r\n"
      "{\"model\":\"gpt-x\"}",
      "GET /v1/models?limit=2 HTTP/1.0\r\n"
      "Connection: keep-alive\r\n"
      "Cache-Control:  no-cache \t\r\n"
      "Accept:\r\n"
      "\r\n",
      "DELETE /v1/files/f-1 HTTP/1.1\r\n"
      "Connection: close\r\n"
      "Content-Length: 0\r\n"
      "Expect: 100-continue\r\n"
      "x-api-key: k\r\n"
      "\r\n",
  };
  std::size_t compared = 0;
  std::size_t read_plainly = 0;
  for (const std::string& base : bases) {
    const std::size_t head_size = base.find("\r\n\r\n") + 4;
    const std::size_t body_size = base.size() - head_size;
    // Beast's parser holds the request line and the fields to the limit
    // each, not together.
    const std::size_t fields_size = head_size - (base.find("\r\n") + 2);
    const auto texts = sluice::testing::altered_heads(base);
    const std::pair<std::uint32_t, std::uint64_t> limits[] = {
        {8192, 1024 * 1024},
        {static_cast<std::uint32_t>(head_size), body_size},
        {static_cast<std::uint32_t>(head_size - 1), body_size == 0 ? 0 : body_size - 1},
        {static_cast<std::uint32_t>(fields_size - 1), body_size},
    };
    for (const auto& [header_limit, body_limit] : limits) {
      for (const std::string& text : texts) {
        ++compared;
        if (expect_read_alike(text, header_limit, body_limit)) ++read_plainly;
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
  // Both readers must have been exercised: a plain reader that took nothing
  // would agree with Beast trivially.
  EXPECT_GT(read_plainly, compared / 16) << read_plainly << " of " << compared;
  EXPECT_LT(read_plainly, compared * 3 / 4) << read_plainly << " of " << compared;
}

// Framing and connection edges the alterations above do not reach.
TEST(ClientRequest, ThePlainReaderAgreesWithBeastOnFramingEdges) {
  for (const std::string text : {
           "GET / HTTP/1.1\r\nProxy-Connection: close\r\n\r\n",
           "GET / HTTP/1.0\r\nProxy-Connection: keep-alive\r\n\r\n",
           "GET / HTTP/1.0\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n",
           "GET / HTTP/1.1\r\nConnection: keep-alive\r\nconnection: CLOSE\r\n\r\n",
           "GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
           "GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
           "POST / HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n{}",
           "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n{}",
           "POST / HTTP/1.1\r\nContent-Length: 999999999999999999\r\n\r\n{}",
           "POST / HTTP/1.1\r\nContent-Length: 000000000000000000002\r\n\r\n{}",
           "POST / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n{}",
           "POST / HTTP/1.1\r\nContent-Length:2\r\n\r\n{}",
           "POST / HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}",
           "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
           "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}",
           "GET / HTTP/1.1\r\nX:\r\n\r\n",
           "GET / HTTP/1.1\r\nX-A: a\r\n\t b\r\n\r\n",
           "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
           "GET / HTTP/1.1\n\n",
           "GET / HTTP/1.1\r\nHost: a\n\r\n",
           "GET  / HTTP/1.1\r\n\r\n",
           "GET / HTTP/1.1 \r\n\r\n",
           "GET / HTTP/2.0\r\n\r\n",
           "GET / HTTP/1.1\r\n\r",
       }) {
    expect_read_alike(text);
  }
}

TEST(ClientRequest, HeadsOutsideThePlainShapeOrInPiecesGoToBeast) {
  const std::string plain = "POST /v1/x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
  for (const std::string text : {
           "POST /v1/x HTTP/1.1\r\nX-Name: caf\xc3\xa9\r\nContent-Length: 2\r\n\r\n{}",
           "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
           "POST /v1/x HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n{}",
           "POST /v1/x HTTP/1.1\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\n{}",
           "post /v1/x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
           "POST /v1/x HTTP/1.1\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
           "GET /chat HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
       }) {
    SCOPED_TRACE(text);
    ClientRequest request;
    error_code ec;
    feed_parser(request, text, ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(request.is_done());
    EXPECT_FALSE(request.read_plainly());
  }
  // The same head read plainly when whole, by Beast when it arrives in two.
  ClientRequest whole;
  error_code ec;
  feed_parser(whole, plain, ec);
  EXPECT_TRUE(whole.read_plainly());
  ClientRequest split;
  EXPECT_EQ(feed_parser(split, plain.substr(0, 10), ec), 0u);
  EXPECT_EQ(ec, http::error::need_more);
  EXPECT_EQ(feed_parser(split, plain, ec), plain.size());
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(split.read_plainly());
  EXPECT_TRUE(split.is_done());
  EXPECT_EQ(split.body(), whole.body());
  EXPECT_EQ(split.withheld_fields(), whole.withheld_fields());
}

// The parser's lookup of a name decides what is withheld; it must agree with
// the decision by name for every name Beast knows and for the gateway's own.
TEST(ClientRequest, WithheldByLookupAgreesWithWithheldByName) {
  const auto last = static_cast<int>(http::field::xref);
  for (int i = 1; i <= last; ++i) {
    const auto field = static_cast<http::field>(i);
    const auto name = http::to_string(field);
    const std::string_view text(name.data(), name.size());
    EXPECT_EQ(is_withheld_from_upstream(field, text), is_withheld_from_upstream(text)) << text;
  }
  for (std::string_view name : {"api-key", "x-api-key", "traceparent", "x-request-id",
                                "X-Request-Id", "x-stainless-os", "openai-organization"}) {
    EXPECT_EQ(is_withheld_from_upstream(http::string_to_field(name), name),
              is_withheld_from_upstream(name))
        << name;
  }
  EXPECT_TRUE(is_withheld_from_upstream(http::field::unknown, "X-Api-Key"));
  EXPECT_FALSE(is_withheld_from_upstream(http::field::unknown, "x-stainless-os"));
}

}  // namespace
}  // namespace sluice::server

// The client request as the stages read it: what the parser keeps of the
// head, which fields travel upstream, and the body however it was framed.
#include "sluice/server/client_request.hpp"

#include <gtest/gtest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "support/feed_parser.hpp"

namespace sluice::server {
namespace {

namespace http = boost::beast::http;
using boost::beast::error_code;

using sluice::testing::feed_parser;

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
  ClientRequest request;
  error_code ec;
  EXPECT_EQ(feed_parser(request, text, ec), text.size());
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(request.is_done());
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
  EXPECT_EQ(request["authorization"], "Bearer sk-secret");
  EXPECT_EQ(request[http::field::authorization], "Bearer sk-secret");
  EXPECT_EQ(request["X-API-KEY"], "sk-other");
  EXPECT_EQ(request["x-request-id"], "abc");
  EXPECT_EQ(request["openai-beta"], "assistants=v2");
  EXPECT_EQ(request[http::field::content_type], "application/json");
  EXPECT_EQ(request[http::field::expect], "100-continue");
  EXPECT_EQ(request["x-missing"], "");
  EXPECT_EQ(request[http::field::cache_control], "");
}

TEST(ClientRequest, RepeatedFieldsAreAllKeptAndTheFirstIsLookedUp) {
  const std::string text =
      "GET /v1/models HTTP/1.0\r\n"
      "Cache-Control: max-age=0\r\n"
      "X-Tag: one\r\n"
      "cache-control: no-store\r\n"
      "X-Tag: two\r\n"
      "\r\n";
  ClientRequest request;
  error_code ec;
  EXPECT_EQ(feed_parser(request, text, ec), text.size());
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(request.version(), 10u);
  EXPECT_FALSE(request.keep_alive());  // HTTP/1.0 without keep-alive
  EXPECT_EQ(request["x-tag"], "one");
  std::vector<std::string> values;
  request.for_each_value(http::field::cache_control,
                         [&](std::string_view value) { values.emplace_back(value); });
  EXPECT_EQ(values, (std::vector<std::string>{"max-age=0", "no-store"}));
  EXPECT_EQ(request.forwarded_fields(),
            "Cache-Control: max-age=0\r\nX-Tag: one\r\ncache-control: no-store\r\nX-Tag: two\r\n");
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
  ClientRequest request;
  error_code ec;
  EXPECT_EQ(feed_parser(request, text, ec), text.size());
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(request.method(), http::verb::unknown);
  EXPECT_EQ(request.method_string(), "BREW");
  EXPECT_EQ(request.target(), "/pot");
}

TEST(ClientRequest, LimitsAndBadHeadsAreErrors) {
  {
    ClientRequest request;
    request.header_limit(64);
    error_code ec;
    feed_parser(request, "POST / HTTP/1.1\r\nX-Long: " + std::string(100, 'a') + "\r\n\r\n", ec);
    EXPECT_EQ(ec, http::error::header_limit);
  }
  {
    ClientRequest request;
    request.body_limit(4);
    error_code ec;
    feed_parser(request, "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789", ec);
    EXPECT_EQ(ec, http::error::body_limit);
  }
  {
    ClientRequest request;
    error_code ec;
    feed_parser(request, "HTTP/1.1 200 OK\r\n\r\n", ec);
    EXPECT_TRUE(ec);
  }
  {
    ClientRequest request;
    error_code ec;
    feed_parser(request, "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", ec);
    EXPECT_TRUE(ec);
  }
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

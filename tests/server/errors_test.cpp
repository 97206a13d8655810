// Every error the gateway answers itself: OpenAI's error JSON with the right
// status, and the connection stays usable where HTTP allows.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <nlohmann/json.hpp>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/leak_check.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

void expect_openai_error(const HttpResponse& response, unsigned status, const std::string& code,
                         const std::string& param = "") {
  EXPECT_EQ(response.status, status) << response.body;
  EXPECT_EQ(response.header("content-type"), "application/json");
  auto body = json::parse(response.body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << response.body;
  ASSERT_TRUE(body.contains("error")) << response.body;
  auto& error = body["error"];
  EXPECT_TRUE(error["message"].is_string());
  EXPECT_FALSE(error["message"].get<std::string>().empty());
  EXPECT_TRUE(error["type"].is_string());
  EXPECT_TRUE(error.contains("param"));
  EXPECT_TRUE(error.contains("code"));
  if (!code.empty()) {
    EXPECT_EQ(error["code"], code) << response.body;
  }
  if (!param.empty()) {
    EXPECT_EQ(error["param"], param) << response.body;
  }
}

class GatewayErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    upstream_ = start_mock();
    gateway_ = std::make_unique<TestGateway>(
        "server:\n  listen: 127.0.0.1:0\n  threads: 1\n  max_body_bytes: 2048\n"
        "models:\n  - name: chat\n    deployments:\n" +
        deployment_yaml("d1", upstream_->base_url()));
  }
  std::unique_ptr<mock::MockServer> upstream_;
  std::unique_ptr<TestGateway> gateway_;
};

TEST_F(GatewayErrors, InvalidJsonIs400) {
  HttpConnection client(gateway_->port());
  expect_openai_error(client.request("POST", "/v1/chat/completions", "{\"model\": "), 400,
                      "invalid_json");
  // The connection survives a request-level error.
  expect_openai_error(client.request("POST", "/v1/chat/completions", "[1,2]"), 400, "invalid_type");
  EXPECT_EQ(upstream_->stats().requests, 0u);
}

TEST_F(GatewayErrors, InvalidUtf8Is400) {
  std::string body =
      "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}";
  expect_openai_error(http_request(gateway_->port(), "POST", "/v1/chat/completions", body), 400,
                      "invalid_json");
}

TEST_F(GatewayErrors, MissingOrNonStringModelIs400) {
  expect_openai_error(
      http_request(gateway_->port(), "POST", "/v1/chat/completions", R"({"messages":[]})"), 400,
      "missing_required_parameter", "model");
  expect_openai_error(
      http_request(gateway_->port(), "POST", "/v1/chat/completions", R"({"model":42})"), 400,
      "invalid_type", "model");
}

TEST_F(GatewayErrors, UnknownModelIs404) {
  expect_openai_error(http_request(gateway_->port(), "POST", "/v1/chat/completions",
                                   chat_body("no-such-model", false)),
                      404, "model_not_found", "model");
}

TEST_F(GatewayErrors, UnknownPathIs404) {
  expect_openai_error(http_request(gateway_->port(), "POST", "/v1/nothing-here", "{}"), 404,
                      "unknown_url");
  expect_openai_error(http_request(gateway_->port(), "GET", "/"), 404, "unknown_url");
  // A path that is not UTF-8 is quoted with replacement characters.
  auto not_utf8 = http_request(gateway_->port(), "GET", "/v1/\xff\xfe");
  expect_openai_error(not_utf8, 404, "unknown_url");
  EXPECT_NE(not_utf8.body.find("/v1/\xef\xbf\xbd\xef\xbf\xbd"), std::string::npos) << not_utf8.body;
}

TEST_F(GatewayErrors, WrongMethodIs405) {
  auto response = http_request(gateway_->port(), "GET", "/v1/chat/completions");
  expect_openai_error(response, 405, "method_not_allowed");
  EXPECT_EQ(response.header("allow"), "POST");
  expect_openai_error(http_request(gateway_->port(), "DELETE", "/v1/models"), 405,
                      "method_not_allowed");
  auto one_model = http_request(gateway_->port(), "POST", "/v1/models/chat", "{}");
  expect_openai_error(one_model, 405, "method_not_allowed");
  EXPECT_EQ(one_model.header("allow"), "GET, HEAD");
}

TEST_F(GatewayErrors, UnknownOrMalformedModelInThePathIs404) {
  expect_openai_error(http_request(gateway_->port(), "GET", "/v1/models/nothing"), 404,
                      "model_not_found", "model");
  // Not a name at all: no model to speak of.
  expect_openai_error(http_request(gateway_->port(), "GET", "/v1/models/"), 404, "unknown_url");
  expect_openai_error(http_request(gateway_->port(), "GET", "/v1/models/ch%zzat"), 404,
                      "unknown_url");
  expect_openai_error(http_request(gateway_->port(), "GET", "/v1/models/chat%2"), 404,
                      "unknown_url");
  // Bytes that are not UTF-8 are quoted in the message, not a reason to fail.
  expect_openai_error(http_request(gateway_->port(), "GET", "/v1/models/%FF%FE"), 404,
                      "model_not_found");
}

TEST_F(GatewayErrors, BodyOverLimitIs413WithoutReadingIt) {
  HttpConnection client(gateway_->port());
  // Announce a body far over the limit but send none of it: the answer must
  // come from the head alone.
  client.send_raw(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 100000000\r\n\r\n");
  auto head = client.read_head();
  EXPECT_EQ(head.status, 413u);
  auto body = json::parse(client.read_rest_of_body());
  EXPECT_EQ(body["error"]["code"], "request_too_large");
}

TEST_F(GatewayErrors, HeadersOverLimitAre431) {
  HttpConnection client(gateway_->port());
  client.send_raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20 * 1024, 'a') +
                  "\r\n\r\n");
  auto response = client.read_head();
  response.body = client.read_rest_of_body();
  expect_openai_error(response, 431, "headers_too_large");
}

// The request line counts against server.max_header_bytes too: a target
// longer than the whole limit is refused before any header is read.
TEST_F(GatewayErrors, RequestLineOverLimitIs431) {
  const auto limit = gateway_->config()->server.max_header_bytes;
  HttpConnection client(gateway_->port());
  client.send_raw("POST /v1/chat/completions?pad=" + std::string(limit + 1024, 'a') +
                  " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  auto response = client.read_head();
  response.body = client.read_rest_of_body();
  expect_openai_error(response, 431, "headers_too_large");
  EXPECT_EQ(response.header("connection"), "close");
  EXPECT_TRUE(client.closed_by_peer());
  EXPECT_EQ(upstream_->stats().requests, 0u);
}

// Framing two parsers could read differently is refused, never guessed at
// (request smuggling).
TEST_F(GatewayErrors, ConflictingFramingIs400) {
  const std::string body = chat_body("chat", false);
  for (const std::string& framing :
       {"Content-Length: " + std::to_string(body.size()) + "\r\nTransfer-Encoding: chunked\r\n",
        "Content-Length: " + std::to_string(body.size()) +
            "\r\nContent-Length: " + std::to_string(body.size() + 1) + "\r\n"}) {
    HttpConnection client(gateway_->port());
    client.send_raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + framing + "\r\n" + body);
    auto raw = client.read_until_close();
    EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 400") << framing;
  }
  EXPECT_EQ(upstream_->stats().requests, 0u);
}

// A request whose last transfer coding is not chunked has no length the
// gateway could know (RFC 9112 §6.3): it is refused, never read as a request
// without a body whose bytes would then be taken for the next request.
TEST_F(GatewayErrors, ATransferCodingOtherThanChunkedLastIs400) {
  const std::string body = chat_body("chat", false);
  for (const std::string& framing :
       {std::string("Transfer-Encoding: gzip\r\n"),
        std::string("Transfer-Encoding: chunked, gzip\r\n"),
        "Transfer-Encoding: gzip\r\nContent-Length: " + std::to_string(body.size()) + "\r\n"}) {
    SCOPED_TRACE(framing);
    HttpConnection client(gateway_->port(), 3s);
    client.send_raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + framing + "\r\n" + body);
    auto response = client.read_head();
    response.body = client.read_rest_of_body();
    expect_openai_error(response, 400, "bad_request");
    EXPECT_NE(response.body.find("Transfer-Encoding"), std::string::npos) << response.body;
    EXPECT_EQ(response.header("connection"), "close");
    EXPECT_TRUE(client.closed_by_peer());
  }
  EXPECT_EQ(upstream_->stats().requests, 0u);
}

TEST_F(GatewayErrors, Http10RequestIsServedAndClosed) {
  HttpConnection client(gateway_->port());
  const std::string body = chat_body("chat", false);
  client.send_raw("POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body);
  auto raw = client.read_until_close();
  EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 200");
  EXPECT_NE(raw.find("chat.completion"), std::string::npos);
}

TEST_F(GatewayErrors, MalformedRequestIs400AndCloses) {
  HttpConnection client(gateway_->port());
  client.send_raw("THIS IS NOT HTTP\r\n\r\n");
  auto raw = client.read_until_close();
  EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 400");
  EXPECT_NE(raw.find("\"error\""), std::string::npos);
}

TEST(GatewayUpstreamErrors, UnreachableUpstreamIs502) {
  // A port that was just free: nothing listens there.
  boost::asio::io_context context;
  boost::asio::ip::tcp::acceptor probe(context, {boost::asio::ip::make_address("127.0.0.1"), 0});
  auto free_port = probe.local_endpoint().port();
  probe.close();
  TestGateway gateway("router:\n  retries: 0\nmodels:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", "http://127.0.0.1:" + std::to_string(free_port) + "/v1",
                                      kNoWarmConnections));
  LeakCheck leaks(gateway);
  expect_openai_error(
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false)), 502,
      "upstream_unreachable");
  EXPECT_TRUE(leaks.settled());
}

TEST(GatewayUpstreamErrors, UpstreamTimeoutIs504) {
  mock::Behaviour behaviour;
  behaviour.fail = "stall";
  behaviour.stall = 5000ms;
  auto upstream = start_mock(behaviour);
  TestGateway gateway("router:\n  retries: 0\nmodels:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url(),
                                      kNoWarmConnections + "        timeouts: {ttft: 200ms}\n"));
  LeakCheck leaks(gateway);
  auto started = std::chrono::steady_clock::now();
  expect_openai_error(
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true)), 504,
      "upstream_timeout");
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  // The stalled upstream connection is closed, not kept waiting for the
  // answer nobody will read.
  EXPECT_TRUE(leaks.settled());
  EXPECT_EQ(upstream->stats().open_connections, 0u);
}

TEST(GatewayUpstreamErrors, UpstreamClientErrorIsReturnedAsIs) {
  mock::Behaviour behaviour;
  behaviour.fail = "400";
  auto upstream = start_mock(behaviour);
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 400u);
  EXPECT_EQ(json::parse(response.body)["error"]["type"], "invalid_request_error");
  EXPECT_EQ(upstream->stats().requests, 1u);
}

}  // namespace
}  // namespace sluice::testing

// A stream that breaks after its first byte ends with an SSE error event,
// never with a clean end that looks like success.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sluice/stream/relay.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// No warm connections: the connections these tests count are the request's.
std::string model_with(const std::string& base_url, const std::string& timeouts) {
  return "router:\n  retries: 0\nmodels:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("d1", base_url, "        warm_connections: 0\n" + timeouts);
}

json last_event(const std::string& body) {
  auto events = sse_data(body);
  if (events.empty()) return {};
  return json::parse(events.back(), nullptr, false);
}

TEST(RelayFaults, ResetMidStreamEndsWithErrorEvent) {
  mock::Behaviour behaviour;
  behaviour.fail = "reset-mid";
  behaviour.tokens = 8;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(model_with(upstream->base_url(), ""));

  HttpConnection client(gateway.port());
  auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(response.status, 200u);
  EXPECT_NE(response.body.find("tok0"), std::string::npos);
  EXPECT_EQ(response.body.find("[DONE]"), std::string::npos);
  auto error = last_event(response.body);
  ASSERT_TRUE(error.contains("error")) << response.body;
  EXPECT_EQ(error["error"]["code"], "stream_interrupted");
  EXPECT_EQ(gateway.idle_upstream_connections(), 0);
}

TEST(RelayFaults, IdleTimeoutMidStreamEndsWithErrorEvent) {
  mock::Behaviour behaviour;
  behaviour.fail = "stall-mid";
  behaviour.stall = 5000ms;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(model_with(upstream->base_url(), "        timeouts: {idle: 200ms}\n"));

  auto started = std::chrono::steady_clock::now();
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  ASSERT_EQ(response.status, 200u);
  auto error = last_event(response.body);
  ASSERT_TRUE(error.contains("error")) << response.body;
  EXPECT_EQ(error["error"]["code"], "upstream_timeout");
  EXPECT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }, 1s));
}

TEST(RelayFaults, TotalTimeoutEndsEndlessStreamWithErrorEvent) {
  mock::Behaviour behaviour;
  behaviour.fail = "endless";
  behaviour.interval = 10ms;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(model_with(upstream->base_url(), "        timeouts: {total: 400ms}\n"));

  auto started = std::chrono::steady_clock::now();
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  ASSERT_EQ(response.status, 200u);
  EXPECT_GT(sse_data(response.body).size(), 3u);
  auto error = last_event(response.body);
  ASSERT_TRUE(error.contains("error")) << response.body;
  EXPECT_EQ(error["error"]["code"], "upstream_timeout");
}

TEST(RelayFaults, TruncatedChunkedStreamEndsWithErrorEvent) {
  mock::Behaviour behaviour;
  behaviour.fail = "truncate";
  auto upstream = start_mock(behaviour);
  TestGateway gateway(model_with(upstream->base_url(), ""));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(response.status, 200u);
  auto error = last_event(response.body);
  ASSERT_TRUE(error.contains("error")) << response.body;
  EXPECT_EQ(error["error"]["code"], "stream_interrupted");
}

TEST(RelayFaults, SlowDripIsRelayedWhole) {
  mock::Behaviour behaviour;
  behaviour.fail = "drip";
  behaviour.interval = 0ms;
  behaviour.tokens = 3;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(model_with(upstream->base_url(), ""));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(response.status, 200u);
  auto events = sse_data(response.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
}

// A non-streaming body's usage is read from the last bytes the relay kept;
// the tail may start anywhere in the body.
TEST(RelayUsage, ReadFromTheTailOfAJsonBody) {
  const std::string body =
      R"({"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":)"
      R"("the \"usage\": {\"prompt_tokens\": 1} of it"}}],)"
      R"("usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,)"
      R"("completion_tokens_details":{"reasoning_tokens":4}}})";
  for (std::size_t start : {std::size_t{0}, std::size_t{20}, body.find(R"("usage":{)")}) {
    EXPECT_EQ(stream::usage_from_json_tail(std::string_view(body).substr(start)),
              (stream::Usage{9, 12, 21}))
        << start;
  }
  EXPECT_FALSE(stream::usage_from_json_tail(R"({"id":"x","choices":[]})"));
  EXPECT_FALSE(stream::usage_from_json_tail(R"({"usage":{"prompt_tokens":9,)"));
}

}  // namespace
}  // namespace sluice::testing

// `provider: azure` deployments through a real gateway: requests reach
// Azure OpenAI's deployment paths with its key field, answers come back as
// the upstream sent them, and its retry-after-ms is honoured.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/canned_upstream.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/scripted_upstream.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr std::string_view kChatTarget =
    "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21";

// An Azure deployment of model `chat` at `origin` (no path: Azure's paths
// start at /openai).
std::string azure_yaml(const std::string& origin, const std::string& router = "") {
  return router +
         "models:\n  - name: chat\n    deployments:\n"
         "      - id: azure-east\n"
         "        base_url: " +
         origin +
         "\n"
         "        provider: azure\n"
         "        api_version: 2024-10-21\n"
         "        model: gpt-4o-prod\n"
         "        api_key: azure-secret-key\n"
         "        headers: {X-Team: search}\n";
}

std::string origin_of(std::uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

// The request line's target and the head of each request a scripted
// upstream got.
class Recorded {
 public:
  void add(const std::string& head) {
    const std::lock_guard lock(mutex_);
    heads_.push_back(head);
  }
  std::vector<std::string> heads() const {
    const std::lock_guard lock(mutex_);
    return heads_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> heads_;
};

std::string target_of(const std::string& head) {
  const auto start = head.find(' ') + 1;
  return head.substr(start, head.find(' ', start) - start);
}

TEST(Azure, PlainAndStreamedChatReachTheDeploymentWithItsKey) {
  mock::Behaviour behaviour;
  behaviour.tokens = 3;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(azure_yaml(origin_of(upstream->port())));

  auto plain = http_request(gateway.port(), "POST", "/v1/chat/completions",
                            chat_body("chat", false), bearer("client-key-of-the-gateway"));
  ASSERT_EQ(plain.status, 200u) << plain.body;
  EXPECT_EQ(json::parse(plain.body)["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
  EXPECT_EQ(plain.header("x-sluice-deployment"), "azure-east");

  auto streamed = http_request(gateway.port(), "POST", "/v1/chat/completions?trace=on",
                               chat_body("chat", true));
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  auto events = sse_data(streamed.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");

  auto sent = upstream->recent_requests();
  ASSERT_GE(sent.size(), 2u);
  const auto& plain_sent = sent[sent.size() - 2];
  const auto& streamed_sent = sent.back();
  EXPECT_EQ(plain_sent.target, kChatTarget);
  EXPECT_EQ(streamed_sent.target, std::string(kChatTarget) + "&trace=on");
  for (const auto& request : {plain_sent, streamed_sent}) {
    EXPECT_EQ(request.header("api-key"), "azure-secret-key");
    EXPECT_FALSE(request.header("authorization")) << "neither the deployment's nor the client's";
    EXPECT_EQ(request.header("x-team"), "search");
    EXPECT_EQ(json::parse(request.body)["model"], "gpt-4o-prod") << "the body goes as it was";
  }
}

// What the upstream sends is what the client gets, byte for byte: the
// adapter rewrites requests only, so answers are spliced through.
TEST(Azure, AnswersReachTheClientByteForByte) {
  const std::string json_answer =
      R"({"id":"chatcmpl-az1","object":"chat.completion","model":"gpt-4o-2024-08-06",)"
      R"("choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},)"
      R"("finish_reason":"stop"}],"prompt_filter_results":[]})";
  const std::vector<std::string> events = {
      "data: {\"choices\":[],\"prompt_filter_results\":[{\"prompt_index\":0}]}\n\n",
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
      "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
      "data: [DONE]\n\n"};
  std::string stream_answer;
  for (const auto& event : events) stream_answer += event;
  Recorded recorded;
  ScriptedUpstream upstream([&](const std::string& head) {
    recorded.add(head);
    if (target_of(head).find("stream=1") != std::string::npos) {
      std::vector<std::string> parts = {
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
          "Transfer-Encoding: chunked\r\n\r\n"};
      for (const auto& event : events) parts.push_back(chunk(event));
      parts.push_back("0\r\n\r\n");
      return ScriptedUpstream::Reply{parts, 5ms};
    }
    return ScriptedUpstream::Reply{
        {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(json_answer.size()) + "\r\n\r\n" + json_answer}};
  });
  TestGateway gateway(azure_yaml(origin_of(upstream.port()), "router:\n  retries: 0\n"));

  auto plain =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(plain.status, 200u) << plain.body;
  EXPECT_EQ(plain.body, json_answer);

  // The script sees heads only: the query tells it to stream.
  auto streamed = http_request(gateway.port(), "POST", "/v1/chat/completions?stream=1",
                               chat_body("chat", true));
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  EXPECT_EQ(streamed.body, stream_answer);

  auto heads = recorded.heads();
  ASSERT_EQ(heads.size(), 2u);
  EXPECT_EQ(target_of(heads[0]), kChatTarget);
  EXPECT_EQ(target_of(heads[1]), std::string(kChatTarget) + "&stream=1");
  for (const auto& head : heads) {
    EXPECT_EQ(field_value(head, "api-key"), "azure-secret-key") << head;
    EXPECT_EQ(field_value(head, "authorization"), "") << head;
  }
}

std::string too_many_requests(const std::string& fields) {
  const std::string body = R"({"error":{"code":"429","message":"Rate limit is exceeded."}})";
  return "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n" + fields +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST(Azure, A429WithRetryAfterMsCoolsTheDeploymentDownAndTellsTheClientWholeSeconds) {
  ScriptedUpstream upstream([](const std::string&) {
    return ScriptedUpstream::Reply{{too_many_requests("retry-after-ms: 1500\r\n")}};
  });
  TestGateway gateway(azure_yaml(origin_of(upstream.port()),
                                 "router:\n  retries: 0\n"
                                 "  cooldown: {fails: 1, within: 60s, for: 30s}\n"));
  auto limited =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(limited.status, 429u) << limited.body;
  EXPECT_EQ(limited.header("retry-after"), "2") << "1.5 s, rounded up";

  auto routes = http_request(gateway.gateway().admin_port(), "GET", "/admin/routes");
  auto deployment = json::parse(routes.body)["models"][0]["deployments"][0];
  EXPECT_EQ(deployment["cooling_down"], true) << deployment;
  EXPECT_EQ(upstream.requests(), 1u);
}

// The retry on the same deployment waits the milliseconds Azure asked for,
// not the backoff's few.
TEST(Azure, ARetryWaitsForRetryAfterMs) {
  using Clock = std::chrono::steady_clock;
  std::mutex mutex;
  std::vector<Clock::time_point> arrivals;
  ScriptedUpstream upstream([&](const std::string&) {
    const std::lock_guard lock(mutex);
    arrivals.push_back(Clock::now());
    if (arrivals.size() == 1) {
      return ScriptedUpstream::Reply{{too_many_requests("retry-after-ms: 700\r\n")}};
    }
    const std::string body = R"({"choices":[]})";
    return ScriptedUpstream::Reply{
        {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body}};
  });
  TestGateway gateway(azure_yaml(origin_of(upstream.port()),
                                 "router:\n  retries: 1\n  backoff: {base: 1ms, max: 5s}\n"
                                 "  cooldown: {fails: 5, within: 60s, for: 30s}\n"));
  auto answer =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(answer.status, 200u) << answer.body;
  EXPECT_EQ(answer.header("x-sluice-attempts"), "2");
  const std::lock_guard lock(mutex);
  ASSERT_EQ(arrivals.size(), 2u);
  EXPECT_GE(arrivals[1] - arrivals[0], 690ms)
      << "a Retry-After in whole seconds would have been none at all";
}

}  // namespace
}  // namespace sluice::testing

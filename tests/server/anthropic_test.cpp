// Anthropic through a real gateway, both ways: OpenAI clients reaching
// `provider: anthropic` deployments, and Anthropic clients (`/v1/messages`)
// reaching Anthropic deployments as they are, or OpenAI ones translated.
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

constexpr std::string_view kGatewayKey = "sk-gateway-team";
constexpr std::string_view kAnthropicKey = "sk-ant-deployment-secret";

std::string origin_at(std::uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

// A key the clients use; model `claude` on an Anthropic deployment at
// `anthropic_origin` (no path: /v1/messages is appended), and model `gpt`
// on an OpenAI one at `openai_base_url`.
std::string gateway_yaml(const std::string& anthropic_origin, const std::string& openai_base_url,
                         const std::string& extra = "") {
  return extra + "auth:\n  keys:\n    - name: team\n      key: " + std::string(kGatewayKey) +
         "\nmodels:\n  - name: claude\n    deployments:\n      - id: anthropic-1\n"
         "        provider: anthropic\n        base_url: " +
         anthropic_origin +
         "\n        model: claude-upstream\n        api_key: " + std::string(kAnthropicKey) +
         "\n  - name: gpt\n    deployments:\n" + deployment_yaml("openai-1", openai_base_url);
}

Headers with_key(Headers headers = {}) {
  headers.emplace_back("x-api-key", std::string(kGatewayKey));
  return headers;
}

std::string messages_body(const std::string& model, bool stream, const std::string& extra = "") {
  return R"({"model":")" + model + R"(","max_tokens":64,"stream":)" + (stream ? "true" : "false") +
         R"(,"messages":[{"role":"user","content":"Hello"}])" + extra + "}";
}

// An SSE body's events as (name, data) pairs.
std::vector<std::pair<std::string, json>> named_events(const std::string& body) {
  std::vector<std::pair<std::string, json>> events;
  std::size_t start = 0;
  while (start < body.size()) {
    auto end = body.find("\n\n", start);
    if (end == std::string::npos) end = body.size();
    const auto event = body.substr(start, end - start);
    start = end + 2;
    std::string name;
    std::string data;
    std::size_t line_start = 0;
    while (line_start < event.size()) {
      auto line_end = event.find('\n', line_start);
      if (line_end == std::string::npos) line_end = event.size();
      const auto line = event.substr(line_start, line_end - line_start);
      line_start = line_end + 1;
      if (line.starts_with("event: ")) name = line.substr(7);
      if (line.starts_with("data: ")) data = line.substr(6);
    }
    if (!data.empty()) events.emplace_back(name, json::parse(data));
  }
  return events;
}

class Anthropic : public ::testing::Test {
 protected:
  void SetUp() override {
    mock::Behaviour behaviour;
    behaviour.tokens = 3;
    upstream_ = start_mock(behaviour);
  }
  std::string yaml(const std::string& extra = "") const {
    return gateway_yaml(origin_at(upstream_->port()), upstream_->base_url(), extra);
  }
  std::unique_ptr<mock::MockServer> upstream_;
};

TEST_F(Anthropic, OpenAiClientsGetAnthropicAnswersTranslated) {
  TestGateway gateway(yaml());
  auto plain = http_request(gateway.port(), "POST", "/v1/chat/completions",
                            chat_body("claude", false), with_key());
  ASSERT_EQ(plain.status, 200u) << plain.body;
  const auto answer = json::parse(plain.body);
  EXPECT_EQ(answer["object"], "chat.completion");
  EXPECT_EQ(answer["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "stop");
  EXPECT_GT(answer["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(answer["usage"]["total_tokens"].get<int>(),
            answer["usage"]["prompt_tokens"].get<int>() +
                answer["usage"]["completion_tokens"].get<int>());

  auto streamed = http_request(
      gateway.port(), "POST", "/v1/chat/completions",
      chat_body("claude", true, R"("stream_options":{"include_usage":true})"), with_key());
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  const auto events = sse_data(streamed.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content;
  bool usage_seen = false;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    const auto chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (!chunk["choices"].empty()) {
      content += chunk["choices"][0]["delta"].value("content", "");
    } else if (chunk.contains("usage")) {
      usage_seen = true;
    }
  }
  EXPECT_EQ(content, "tok0 tok1 tok2 ");
  EXPECT_TRUE(usage_seen);

  const auto sent = upstream_->recent_requests();
  ASSERT_EQ(sent.size(), 2u);
  for (const auto& request : sent) {
    EXPECT_EQ(request.target, "/v1/messages");
    EXPECT_EQ(request.header("x-api-key"), kAnthropicKey);
    EXPECT_EQ(request.header("anthropic-version"), "2023-06-01");
    EXPECT_FALSE(request.header("authorization"));
    EXPECT_EQ(json::parse(request.body)["model"], "claude-upstream");
  }
}

// The translated stream always ends with usage, for the gateway's budgets;
// a client that did not ask for it does not get it.
TEST_F(Anthropic, TheUsageChunkReachesOnlyClientsThatAskForIt) {
  TestGateway gateway(yaml());
  auto streamed = http_request(gateway.port(), "POST", "/v1/chat/completions",
                               chat_body("claude", true), with_key());
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  const auto events = sse_data(streamed.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    const auto chunk = json::parse(events[i]);
    ASSERT_FALSE(chunk["choices"].empty()) << "a usage-only chunk: " << events[i];
    content += chunk["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(content, "tok0 tok1 tok2 ");
}

// Each input_json_delta the upstream sends is a tool_calls delta of its own
// for the client, as it arrives: never gathered into one burst.
TEST_F(Anthropic, StreamedToolArgumentsReachOpenAiClientsDeltaByDelta) {
  TestGateway gateway(yaml());
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get_weather",)"
                            R"("parameters":{"type":"object"}}}])";
  auto headers = with_key({{"x-mock-anthropic", "tools"}});
  auto streamed = http_request(gateway.port(), "POST", "/v1/chat/completions",
                               chat_body("claude", true, tools), headers);
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  std::string arguments;
  std::string id;
  unsigned argument_deltas = 0;
  std::string finish_reason;
  for (const auto& data : sse_data(streamed.body)) {
    if (data == "[DONE]") continue;
    const auto chunk = json::parse(data);
    if (chunk["choices"].empty()) continue;
    const auto& choice = chunk["choices"][0];
    if (choice["finish_reason"].is_string()) finish_reason = choice["finish_reason"];
    if (!choice["delta"].contains("tool_calls")) continue;
    const auto& call = choice["delta"]["tool_calls"][0];
    EXPECT_EQ(call["index"], 0);
    if (call.contains("id")) id = call["id"];
    if (call["function"].contains("arguments")) {
      const auto piece = call["function"]["arguments"].get<std::string>();
      if (!piece.empty()) ++argument_deltas;
      arguments += piece;
    }
  }
  EXPECT_TRUE(id.starts_with("toolu_")) << id;
  EXPECT_GT(argument_deltas, 2u) << "the arguments came in one burst";
  EXPECT_TRUE(json::parse(arguments).is_object()) << arguments;
  EXPECT_EQ(finish_reason, "tool_calls");
}

// An overloaded Anthropic deployment (529) fails over like a 503, here to a
// fallback model on another provider.
TEST(AnthropicFailover, AnOverloadedDeploymentFailsOverAcrossProviders) {
  mock::Behaviour overloaded;
  overloaded.fail = "overloaded";
  auto anthropic = start_mock(overloaded);
  auto openai = start_mock();
  TestGateway gateway(
      "models:\n  - name: claude\n    fallbacks: [gpt]\n"
      "    deployments:\n      - id: anthropic-1\n        provider: anthropic\n"
      "        base_url: " +
      origin_at(anthropic->port()) + "\n        model: claude-upstream\n" +
      "  - name: gpt\n    deployments:\n" + deployment_yaml("openai-1", openai->base_url()));
  auto answer =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("claude", false));
  ASSERT_EQ(answer.status, 200u) << answer.body;
  EXPECT_EQ(answer.header("x-sluice-deployment"), "openai-1");
  EXPECT_EQ(anthropic->recent_requests().size(), 1u);
}

// To an Anthropic deployment a Messages client's request goes as it came,
// but for its model and key, and the answer comes back byte for byte.
TEST(MessagesEndpoint, PassesThroughToAnthropicByteForByte) {
  const std::vector<std::string> events = {
      "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\","
      "\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-upstream\",\"content\":[],"
      "\"stop_reason\":null,\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
      "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
      "\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
      "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
      "\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQBCgIYAhIM+/sig==\"}}\n\n",
      "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
      "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
      "\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n",
      "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"};
  std::string answer;
  for (const auto& event : events) answer += event;
  std::mutex mutex;
  std::vector<std::string> heads;
  ScriptedUpstream upstream([&](const std::string& head) {
    {
      const std::lock_guard lock(mutex);
      heads.push_back(head);
    }
    std::vector<std::string> parts = {
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"};
    for (const auto& event : events) parts.push_back(chunk(event));
    parts.push_back("0\r\n\r\n");
    return ScriptedUpstream::Reply{parts, 2ms};
  });
  TestGateway gateway(gateway_yaml(origin_at(upstream.port()), upstream.base_url()));
  const auto headers = with_key(
      {{"anthropic-version", "2023-01-01"}, {"anthropic-beta", "interleaved-thinking-2025-05-14"}});
  auto streamed = http_request(gateway.port(), "POST", "/v1/messages?beta=true",
                               messages_body("claude", true), headers);
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  EXPECT_EQ(streamed.body, answer) << "the events, signature included, byte for byte";
  EXPECT_EQ(streamed.header("x-sluice-deployment"), "anthropic-1");

  const std::lock_guard lock(mutex);
  ASSERT_EQ(heads.size(), 1u);
  const auto& head = heads[0];
  EXPECT_TRUE(head.starts_with("POST /v1/messages?beta=true HTTP/1.1")) << head;
  EXPECT_EQ(field_value(head, "x-api-key"), kAnthropicKey) << "the deployment's, not the client's";
  EXPECT_EQ(field_value(head, "anthropic-version"), "2023-01-01");
  EXPECT_EQ(field_value(head, "anthropic-beta"), "interleaved-thinking-2025-05-14");
  EXPECT_EQ(head.find(kGatewayKey), std::string::npos) << head;
}

TEST_F(Anthropic, MessagesClientsReachAnthropicWithTheirBodyAsItCame) {
  TestGateway gateway(yaml());
  const std::string extra =
      R"(,"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}])";
  auto plain = http_request(gateway.port(), "POST", "/v1/messages",
                            messages_body("claude", false, extra), with_key());
  ASSERT_EQ(plain.status, 200u) << plain.body;
  const auto message = json::parse(plain.body);
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["content"][0]["text"], "tok0 tok1 tok2 ");

  auto counted =
      http_request(gateway.port(), "POST", "/v1/messages/count_tokens",
                   R"({"model":"claude","messages":[{"role":"user","content":"Hi"}]})", with_key());
  ASSERT_EQ(counted.status, 200u) << counted.body;
  EXPECT_GT(json::parse(counted.body)["input_tokens"].get<int>(), 0);

  const auto sent = upstream_->recent_requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].target, "/v1/messages");
  EXPECT_EQ(sent[0].header("anthropic-version"), "2023-06-01") << "the client sent none";
  auto sent_body = json::parse(sent[0].body);
  EXPECT_EQ(sent_body["model"], "claude-upstream");
  sent_body["model"] = "claude";
  EXPECT_EQ(sent_body, json::parse(messages_body("claude", false, extra)));
  EXPECT_EQ(sent[1].target, "/v1/messages/count_tokens");
}

TEST_F(Anthropic, MessagesClientsGetOpenAiAnswersTranslated) {
  TestGateway gateway(yaml());
  auto plain = http_request(gateway.port(), "POST", "/v1/messages",
                            messages_body("gpt", false, R"(,"system":"Be brief.")"), with_key());
  ASSERT_EQ(plain.status, 200u) << plain.body;
  const auto message = json::parse(plain.body);
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["content"][0]["type"], "text");
  EXPECT_EQ(message["content"][0]["text"], "tok0 tok1 tok2 ");
  EXPECT_EQ(message["stop_reason"], "end_turn");
  EXPECT_GT(message["usage"]["input_tokens"].get<int>(), 0);
  EXPECT_GT(message["usage"]["output_tokens"].get<int>(), 0);

  auto streamed =
      http_request(gateway.port(), "POST", "/v1/messages", messages_body("gpt", true), with_key());
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  EXPECT_EQ(streamed.header("content-type"), "text/event-stream");
  const auto events = named_events(streamed.body);
  ASSERT_GE(events.size(), 5u) << streamed.body;
  EXPECT_EQ(events.front().first, "message_start");
  EXPECT_EQ(events[events.size() - 2].first, "message_delta");
  EXPECT_EQ(events.back().first, "message_stop");
  std::string text;
  int open_block = -1;
  for (const auto& [name, data] : events) {
    EXPECT_EQ(data["type"], name) << "each event's name is its type";
    if (name == "content_block_start") open_block = data["index"];
    if (name == "content_block_delta") {
      EXPECT_EQ(data["index"], open_block);
      text += data["delta"]["text"].get<std::string>();
    }
    if (name == "content_block_stop") {
      EXPECT_EQ(data["index"], open_block);
      open_block = -1;
    }
  }
  EXPECT_EQ(text, "tok0 tok1 tok2 ");
  EXPECT_EQ(open_block, -1) << "every block was stopped";
  const auto& delta = events[events.size() - 2].second;
  EXPECT_EQ(delta["delta"]["stop_reason"], "end_turn");
  EXPECT_GT(delta["usage"]["output_tokens"].get<int>(), 0);

  const auto sent = upstream_->recent_requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].target, "/v1/chat/completions");
  const auto translated = json::parse(sent[0].body);
  EXPECT_EQ(translated["messages"][0], json::parse(R"({"role":"system","content":"Be brief."})"));
  EXPECT_FALSE(sent[0].header("x-api-key")) << "the client's key stays with the gateway";
  EXPECT_EQ(json::parse(sent[1].body)["stream_options"]["include_usage"], true);
}

// What the gateway answers itself on /v1/messages is worded as Anthropic
// words its errors, with the status an OpenAI client would get.
TEST_F(Anthropic, MessagesErrorsComeInAnthropicsShape) {
  TestGateway gateway(yaml());
  auto expect_error = [](const HttpResponse& response, unsigned status, std::string_view type) {
    EXPECT_EQ(response.status, status) << response.body;
    const auto body = json::parse(response.body);
    EXPECT_EQ(body["type"], "error") << response.body;
    EXPECT_EQ(body["error"]["type"], type) << response.body;
    EXPECT_TRUE(body["error"]["message"].is_string()) << response.body;
  };
  expect_error(http_request(gateway.port(), "POST", "/v1/messages", messages_body("claude", false)),
               401, "authentication_error");
  expect_error(http_request(gateway.port(), "POST", "/v1/messages", messages_body("nope", false),
                            with_key()),
               404, "not_found_error");
  expect_error(http_request(gateway.port(), "POST", "/v1/messages/count_tokens",
                            R"({"model":"gpt","messages":[]})", with_key()),
               400, "invalid_request_error");
  expect_error(http_request(gateway.port(), "POST", "/v1/messages",
                            messages_body("gpt", false, R"(,"top_k":5)"), with_key()),
               400, "invalid_request_error");
  // The OpenAI upstream's own error, translated.
  expect_error(http_request(gateway.port(), "POST", "/v1/messages", messages_body("gpt", false),
                            with_key({{"x-mock-fail", "400"}})),
               400, "invalid_request_error");
  // A body over the limit is refused from the head, in the dialect the head
  // names.
  HttpConnection too_large(gateway.port());
  too_large.send_raw(
      "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 100000000\r\n\r\n");
  auto head = too_large.read_head();
  head.body = too_large.read_rest_of_body();
  expect_error(head, 413, "request_too_large");
  // An OpenAI client still gets OpenAI's shape.
  auto openai = http_request(gateway.port(), "POST", "/v1/chat/completions",
                             chat_body("nope", false), with_key());
  EXPECT_EQ(openai.status, 404u);
  EXPECT_TRUE(json::parse(openai.body)["error"].is_object()) << openai.body;
}

// A stream that breaks after its first byte ends with Anthropic's error
// event for a Messages client, whichever provider broke it.
TEST_F(Anthropic, ABrokenStreamEndsWithAnAnthropicErrorEvent) {
  TestGateway gateway(yaml("router:\n  retries: 0\n"));
  for (const char* model : {"claude", "gpt"}) {
    auto streamed = http_request(gateway.port(), "POST", "/v1/messages", messages_body(model, true),
                                 with_key({{"x-mock-fail", "reset-mid"}}));
    ASSERT_EQ(streamed.status, 200u) << model << ": " << streamed.body;
    const auto events = named_events(streamed.body);
    ASSERT_FALSE(events.empty()) << model;
    EXPECT_EQ(events.back().first, "error") << model << ": " << streamed.body;
    EXPECT_EQ(events.back().second["type"], "error") << model;
    EXPECT_TRUE(events.back().second["error"]["message"].is_string()) << model;
    for (const auto& [name, data] : events) EXPECT_NE(name, "message_stop") << model;
  }
}

}  // namespace
}  // namespace sluice::testing

// The anthropic adapter's request side: what goes upstream, where, with
// which header lines; and its config key.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sluice/config/config.hpp"
#include "sluice/protocol/adapters.hpp"

namespace sluice::protocol {
namespace {

using nlohmann::json;

config::Deployment anthropic_deployment() {
  config::Deployment deployment;
  deployment.id = "claude";
  deployment.provider = "anthropic";
  deployment.api_key = "sk-ant-secret";
  deployment.headers = {{"x-team", "blue"}};
  return deployment;
}

struct Sent {
  std::string target, fields, body;
};

Sent joined(const upstream::Request& request) {
  Sent sent;
  for (auto piece : request.target) sent.target.append(piece);
  for (auto piece : request.fields) sent.fields.append(piece);
  for (auto piece : request.body) sent.body.append(piece);
  return sent;
}

TEST(AnthropicAdapter, ChatCompletionsGoToMessagesWithTheKeyInXApiKey) {
  auto adapter = make_adapter(anthropic_deployment());
  EXPECT_FALSE(adapter->passes_through(Dialect::openai));
  const std::string client_fields =
      "Content-Type: application/json\r\nAuthorization: Bearer client-key\r\n"
      "x-api-key: client-key\r\nuser-agent: sdk/1\r\n";
  upstream::Request request{
      "POST",
      {"", "/chat/completions", "?api-version=1"},
      {client_fields, "x-request-id: r1\r\n",
       "Authorization: Bearer sk-ant-secret\r\nx-team: blue\r\n"},
      {R"({"model":)", R"("claude-x")", R"(,"messages":[{"role":"user","content":"hi"}])",
       R"(,"stream_options":{"include_usage":true})", "}"}};
  std::string storage;
  ASSERT_FALSE(adapter->adapt_request(request, storage));
  const auto sent = joined(request);
  EXPECT_EQ(sent.target, "/v1/messages");
  EXPECT_EQ(json::parse(sent.body), json::parse(R"({"model":"claude-x","max_tokens":4096,
                "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})"));
  EXPECT_EQ(sent.fields,
            "user-agent: sdk/1\r\n"
            "x-request-id: r1\r\n"
            "x-team: blue\r\nx-api-key: sk-ant-secret\r\nanthropic-version: 2023-06-01\r\n"
            "content-type: application/json\r\n");
  EXPECT_EQ(sent.fields.find("Bearer"), std::string::npos);
  EXPECT_EQ(sent.fields.find("client-key"), std::string::npos);
}

TEST(AnthropicAdapter, TheClientsLinesAreLeftAsTheyAreWhenNoneIsReplaced) {
  auto adapter = make_adapter(anthropic_deployment());
  const std::string client_fields = "user-agent: sdk/1\r\n";
  upstream::Request request{"POST",
                            {"/base", "/chat/completions", ""},
                            {client_fields, "", ""},
                            {R"({"model":"m","messages":[{"role":"user","content":"hi"}]})"}};
  std::string storage;
  ASSERT_FALSE(adapter->adapt_request(request, storage));
  EXPECT_EQ(request.fields[0].data(), client_fields.data());
  EXPECT_EQ(joined(request).target, "/base/v1/messages");
}

TEST(AnthropicAdapter, OtherEndpointsAreRefusedNamingTheProvider) {
  auto adapter = make_adapter(anthropic_deployment());
  for (const char* endpoint : {"/embeddings", "/completions", "/responses"}) {
    upstream::Request request{"POST", {"", endpoint, ""}, {}, {R"({"model":"m","input":"x"})"}};
    std::string storage;
    auto refused = adapter->adapt_request(request, storage);
    ASSERT_TRUE(refused) << endpoint;
    EXPECT_EQ(refused->status, 400u);
    EXPECT_NE(refused->message.find("anthropic"), std::string::npos) << refused->message;
    EXPECT_NE(refused->message.find(endpoint), std::string::npos) << refused->message;
  }
}

TEST(AnthropicAdapter, AnUnsupportedFieldRefusesTheAttempt) {
  auto adapter = make_adapter(anthropic_deployment());
  upstream::Request request{
      "POST",
      {"", "/chat/completions", ""},
      {},
      {R"({"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true})"}};
  std::string storage;
  auto refused = adapter->adapt_request(request, storage);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->param, "logprobs");
  EXPECT_EQ(refused->type, "invalid_request_error");
}

TEST(AnthropicAdapter, AnswersAreTranslated) {
  auto adapter = make_adapter(anthropic_deployment());
  auto translator = adapter->translate_answer(Dialect::openai);
  ASSERT_TRUE(translator);
  std::string out;
  translator->body(R"({"type":"error","error":{"type":"not_found_error","message":"no model"}})",
                   out);
  EXPECT_EQ(json::parse(out)["error"]["type"], "not_found_error");
}

TEST(AnthropicAdapter, TheVersionCanBeSetPerDeployment) {
  auto config = config::load_string(R"(
auth: {disabled: true}
models:
  - name: chat
    deployments:
      - {base_url: "https://api.anthropic.com", provider: anthropic, anthropic_version: "2024-01-01"}
)");
  const auto& deployment = config->models[0].deployments[0];
  EXPECT_EQ(deployment.anthropic_version, "2024-01-01");
  auto adapter = make_adapter(deployment);
  upstream::Request request{"POST",
                            {"", "/chat/completions", ""},
                            {},
                            {R"({"model":"m","messages":[{"role":"user","content":"hi"}]})"}};
  std::string storage;
  ASSERT_FALSE(adapter->adapt_request(request, storage));
  EXPECT_NE(joined(request).fields.find("anthropic-version: 2024-01-01\r\n"), std::string::npos);
}

TEST(AnthropicAdapter, TheVersionKeyIsRefusedForOtherProviders) {
  try {
    config::load_string(R"(
auth: {disabled: true}
models:
  - name: chat
    deployments:
      - {base_url: "https://api.openai.com/v1", anthropic_version: "2024-01-01"}
)");
    FAIL() << "the config loaded";
  } catch (const config::ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("anthropic_version"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("provider: anthropic"), std::string::npos)
        << error.what();
  }
}

// A Messages client's request goes to Anthropic as it came: its body and
// query untouched, its anthropic-version and anthropic-beta lines kept,
// only its credentials replaced by the deployment's key.
TEST(AnthropicAdapter, MessagesClientsPassThroughWithTheirVersionAndBetaLines) {
  auto adapter = make_adapter(anthropic_deployment());
  EXPECT_FALSE(adapter->passes_through(Dialect::anthropic)) << "its key must be set";
  EXPECT_EQ(adapter->translate_answer(Dialect::anthropic), nullptr) << "answers are spliced";
  const std::string client_fields =
      "x-api-key: client-key\r\nanthropic-version: 2023-01-01\r\n"
      "anthropic-beta: interleaved-thinking-2025-05-14\r\ncontent-type: application/json\r\n";
  const std::string body =
      R"(,"max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"hi",)"
      R"("cache_control":{"type":"ephemeral"}}]}]})";
  upstream::Request request{"POST",
                            {"/base", "/messages", "?beta=true"},
                            {client_fields, "x-request-id: r1\r\n", "ignored\r\n"},
                            {R"({"model":)", R"("claude-x")", body}};
  std::string storage;
  ASSERT_FALSE(adapter->adapt_request(request, storage));
  const auto sent = joined(request);
  EXPECT_EQ(sent.target, "/base/v1/messages?beta=true");
  EXPECT_EQ(sent.body, R"({"model":"claude-x")" + body) << "byte for byte";
  EXPECT_EQ(sent.fields,
            "anthropic-version: 2023-01-01\r\n"
            "anthropic-beta: interleaved-thinking-2025-05-14\r\ncontent-type: application/json\r\n"
            "x-request-id: r1\r\n"
            "x-team: blue\r\nx-api-key: sk-ant-secret\r\n");
}

TEST(AnthropicAdapter, AMessagesClientWithoutAVersionGetsTheDeployments) {
  auto deployment = anthropic_deployment();
  deployment.anthropic_version = "2024-02-02";
  auto adapter = make_adapter(deployment);
  upstream::Request request{
      "POST", {"", "/messages/count_tokens", ""}, {"", "", ""}, {R"({"model":"m"})"}};
  std::string storage;
  ASSERT_FALSE(adapter->adapt_request(request, storage));
  const auto sent = joined(request);
  EXPECT_EQ(sent.target, "/v1/messages/count_tokens");
  EXPECT_EQ(sent.fields,
            "x-team: blue\r\nx-api-key: sk-ant-secret\r\nanthropic-version: 2024-02-02\r\n");
}

// OpenAI's upstreams take a Messages client's request translated, and
// refuse what they have no counterpart for.
TEST(OpenAiAdapter, MessagesClientsAreTranslatedToChatCompletions) {
  auto adapter = make_adapter(config::Deployment{});
  EXPECT_TRUE(adapter->passes_through(Dialect::openai));
  EXPECT_FALSE(adapter->passes_through(Dialect::anthropic));
  EXPECT_NE(adapter->translate_answer(Dialect::anthropic), nullptr);
  upstream::Request request{
      "POST",
      {"/v1", "/messages", ""},
      {"", "", ""},
      {R"({"model":)", R"("gpt-x")",
       R"(,"max_tokens":7,"system":"be brief","messages":[{"role":"user","content":"hi"}]})"}};
  std::string storage;
  ASSERT_FALSE(adapter->adapt_request(request, storage));
  const auto sent = joined(request);
  EXPECT_EQ(sent.target, "/v1/chat/completions");
  const auto translated = json::parse(sent.body);
  EXPECT_EQ(translated["model"], "gpt-x");
  EXPECT_EQ(translated["max_tokens"], 7);
  EXPECT_EQ(translated["messages"][0], json::parse(R"({"role":"system","content":"be brief"})"));

  upstream::Request count{"POST", {"/v1", "/messages/count_tokens", ""}, {}, {R"({"model":"m"})"}};
  const auto refused = adapter->adapt_request(count, storage);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400u);
  EXPECT_NE(refused->message.find("openai"), std::string::npos) << refused->message;
}

}  // namespace
}  // namespace sluice::protocol

// Request shaping and rule routing behind the gateway: what the upstream
// receives, what the client is told, and that a rule's pick keeps its own
// fallbacks.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kKey = "sk-shaping-test-0123456789";

// A deployment whose upstream model name is the model's own public name, so
// the response's `model` names the model that served it.
std::string named_deployment(const std::string& id, const std::string& base_url,
                             const std::string& upstream_model) {
  return "      - id: " + id + "\n        base_url: " + base_url +
         "\n        model: " + upstream_model + "\n";
}

std::string chat_request(const std::string& model, const json& messages,
                         json extra = json::object()) {
  json body = {{"model", model}, {"messages", messages}};
  for (auto& [key, value] : extra.items()) body[key] = value;
  return body.dump();
}

json conversation(int turns, const std::string& system = "You are terse.") {
  json messages = json::array({{{"role", "system"}, {"content", system}}});
  for (int turn = 1; turn <= turns; ++turn) {
    messages.push_back({{"role", "user"}, {"content", "question " + std::to_string(turn)}});
    if (turn < turns) {
      messages.push_back({{"role", "assistant"}, {"content", "answer " + std::to_string(turn)}});
    }
  }
  return messages;
}

json last_body(const mock::MockServer& upstream) {
  auto requests = upstream.recent_requests();
  if (requests.empty()) return json();
  return json::parse(requests.back().body);
}

HttpResponse post(std::uint16_t port, const std::string& body, const Headers& headers = {}) {
  return http_request(port, "POST", "/v1/chat/completions", body, headers);
}

const std::string kShapedModel =
    "    shaping:\n"
    "      defaults: {max_tokens: 512, reasoning_effort: low}\n"
    "      caps: {max_tokens: 2048}\n"
    "      trim_history: {max_messages: 4, max_prompt_tokens: 6000}\n";

TEST(Shaping, UpstreamGetsTheTrimmedAndDefaultedBody) {
  auto upstream = start_mock();
  TestGateway gateway("models:\n  - name: chat\n" + kShapedModel + "    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));
  auto response = post(gateway.port(), chat_request("chat", conversation(4)));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-shaped"), "trimmed,max_tokens,reasoning_effort");
  EXPECT_FALSE(response.has_header("x-sluice-model"));  // not routed by a rule

  json sent = last_body(*upstream);
  EXPECT_EQ(sent["model"], "mock-model");
  EXPECT_EQ(sent["max_tokens"], 512);
  EXPECT_EQ(sent["reasoning_effort"], "low");
  // Eight messages, four allowed: the system prompt and the newest three.
  ASSERT_EQ(sent["messages"].size(), 4u);
  EXPECT_EQ(sent["messages"][0]["role"], "system");
  EXPECT_EQ(sent["messages"][1]["content"], "question 3");
  EXPECT_EQ(sent["messages"][2]["content"], "answer 3");
  EXPECT_EQ(sent["messages"][3]["content"], "question 4");
  EXPECT_EQ(json::parse(response.body)["model"], "mock-model");
}

TEST(Shaping, ClientValuesWinAndCapsClamp) {
  auto upstream = start_mock();
  TestGateway gateway("models:\n  - name: chat\n" + kShapedModel + "    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));

  auto capped =
      post(gateway.port(),
           chat_request("chat", conversation(1),
                        {{"max_completion_tokens", 100000}, {"reasoning_effort", "high"}}));
  ASSERT_EQ(capped.status, 200u) << capped.body;
  EXPECT_EQ(capped.header("x-sluice-shaped"), "max_tokens_capped");
  json sent = last_body(*upstream);
  EXPECT_EQ(sent["max_completion_tokens"], 2048);
  EXPECT_FALSE(sent.contains("max_tokens"));  // max_completion_tokens counts as set
  EXPECT_EQ(sent["reasoning_effort"], "high");

  // Within every limit: nothing changes and the body goes byte for byte,
  // but for the model name.
  std::string body =
      chat_request("chat", conversation(1), {{"max_tokens", 64}, {"reasoning_effort", "medium"}});
  auto untouched = post(gateway.port(), body);
  ASSERT_EQ(untouched.status, 200u) << untouched.body;
  EXPECT_FALSE(untouched.has_header("x-sluice-shaped"));
  std::string expected = body;
  expected.replace(expected.find(R"("model":"chat")"), 14, R"("model":"mock-model")");
  EXPECT_EQ(upstream->recent_requests().back().body, expected);
}

TEST(Shaping, ModelsWithoutShapingAreForwardedAsTheyCame) {
  auto upstream = start_mock();
  TestGateway gateway("models:\n  - name: chat\n" + kShapedModel + "    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()) +
                      "  - name: plain\n    deployments:\n" +
                      deployment_yaml("d2", upstream->base_url()));
  // Spacing a re-serialised body would lose shows the body was not parsed.
  std::string body = R"({ "model" : "plain", "messages" : [)";
  for (int i = 0; i < 10; ++i) body += R"({"role":"user","content":"m"},)";
  body += R"({"role":"user","content":"last"}] })";
  auto response = post(gateway.port(), body);
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_FALSE(response.has_header("x-sluice-shaped"));
  std::string expected = body;
  expected.replace(expected.find(R"("plain")"), 7, R"("mock-model")");
  EXPECT_EQ(upstream->recent_requests().back().body, expected);
}

TEST(Shaping, StreamsAndTheUsageRequestStillWork) {
  auto upstream = start_mock();
  TestGateway gateway(std::string("auth:\n  keys:\n    - name: team\n      key: ") + kKey +
                      "\n      tpm: 100000\nmodels:\n  - name: chat\n" + kShapedModel +
                      "    deployments:\n" + deployment_yaml("d1", upstream->base_url()));
  auto response =
      post(gateway.port(), chat_request("chat", conversation(3), {{"stream", true}}), bearer(kKey));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-shaped"), "trimmed,max_tokens,reasoning_effort");
  auto events = sse_data(response.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  json sent = last_body(*upstream);
  EXPECT_EQ(sent["messages"].size(), 4u);
  EXPECT_EQ(sent["max_tokens"], 512);
  EXPECT_EQ(sent["stream"], true);
  // The shaped body still gets the usage chunk added for the key's TPM.
  EXPECT_EQ(sent["stream_options"]["include_usage"], true);
}

TEST(Shaping, TheKeysTokenEstimateIsTakenFromTheShapedBody) {
  auto upstream = start_mock();
  TestGateway gateway(std::string("auth:\n  keys:\n    - name: team\n      key: ") + kKey +
                      "\n      tpm: 2000\nmodels:\n  - name: capped\n"
                      "    shaping:\n      caps: {max_tokens: 100}\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()) +
                      "  - name: uncapped\n    deployments:\n" +
                      deployment_yaml("d2", upstream->base_url()));
  const Headers auth = bearer(kKey);
  // Asking for 50,000 tokens, capped to 100 before the key is charged: the
  // reservation leaves most of the 2,000-token budget.
  auto capped =
      post(gateway.port(), chat_request("capped", conversation(1), {{"max_tokens", 50000}}), auth);
  ASSERT_EQ(capped.status, 200u) << capped.body;
  EXPECT_EQ(capped.header("x-sluice-shaped"), "max_tokens_capped");
  EXPECT_GE(std::stoul(capped.header("x-ratelimit-remaining-tokens")), 1800u);
  EXPECT_EQ(last_body(*upstream)["max_tokens"], 100);

  // The same request uncapped reserves all of it.
  auto uncapped = post(gateway.port(),
                       chat_request("uncapped", conversation(1), {{"max_tokens", 50000}}), auth);
  ASSERT_EQ(uncapped.status, 200u) << uncapped.body;
  EXPECT_EQ(uncapped.header("x-ratelimit-remaining-tokens"), "0");
}

// ---------------------------------------------------------------------------
// Rule routing

class RuleRouting : public ::testing::Test {
 protected:
  void SetUp() override {
    mini_ = start_mock();
    reasoning_ = start_mock();
    mock::Behaviour failing;
    failing.fail = "500";
    broken_default_ = start_mock(failing);
    backup_ = start_mock();
  }

  // chat-default fails every request and falls back to chat-backup.
  std::string config(const std::string& extra_top = "", const std::string& auto_extra = "") {
    return extra_top + "models:\n" +
           "  - name: chat-mini\n    shaping:\n      caps: {max_tokens: 256}\n"
           "    deployments:\n" +
           named_deployment("mini", mini_->base_url(), "chat-mini") +
           "  - name: chat-reasoning\n    deployments:\n" +
           named_deployment("reasoning", reasoning_->base_url(), "chat-reasoning") +
           "  - name: chat-default\n    fallbacks: [chat-backup]\n    deployments:\n" +
           named_deployment("default", broken_default_->base_url(), "chat-default") +
           "  - name: chat-backup\n    deployments:\n" +
           named_deployment("backup", backup_->base_url(), "chat-backup") + "  - name: auto\n" +
           auto_extra +
           "    rules:\n"
           "      - {when: {prompt_tokens_below: 200, no_tools: true}, model: chat-mini}\n"
           "      - {when: {contains_any: [\"prove\", \"step by step\"]}, model: chat-reasoning}\n"
           "      - {model: chat-default}\n";
  }

  static json user(const std::string& text) {
    return json::array({{{"role", "user"}, {"content", text}}});
  }

  std::unique_ptr<mock::MockServer> mini_, reasoning_, broken_default_, backup_;
};

TEST_F(RuleRouting, EachRequestGoesToTheFirstMatchingTarget) {
  TestGateway gateway(config());
  const std::string long_text(1200, 'x');  // 300 tokens: past the first rule

  auto small = post(gateway.port(), chat_request("auto", user("Hi there")));
  ASSERT_EQ(small.status, 200u) << small.body;
  EXPECT_EQ(small.header("x-sluice-model"), "chat-mini");
  EXPECT_EQ(small.header("x-sluice-deployment"), "mini");
  EXPECT_EQ(json::parse(small.body)["model"], "chat-mini");
  EXPECT_EQ(last_body(*mini_)["model"], "chat-mini");

  auto proof = post(gateway.port(), chat_request("auto", user(long_text + " Prove it.")));
  ASSERT_EQ(proof.status, 200u) << proof.body;
  EXPECT_EQ(proof.header("x-sluice-model"), "chat-reasoning");
  EXPECT_EQ(proof.header("x-sluice-deployment"), "reasoning");
  EXPECT_EQ(json::parse(proof.body)["model"], "chat-reasoning");

  // Short, but offering tools: not the first rule; no phrase: the catch-all.
  auto tools =
      post(gateway.port(),
           chat_request(
               "auto", user("Hi"),
               {{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}}));
  ASSERT_EQ(tools.status, 200u) << tools.body;
  EXPECT_EQ(tools.header("x-sluice-model"), "chat-default");

  EXPECT_EQ(mini_->stats().requests, 1u);
  EXPECT_EQ(reasoning_->stats().requests, 1u);
}

TEST_F(RuleRouting, TheTargetsFallbacksStillApply) {
  TestGateway gateway(config());
  auto response = post(gateway.port(), chat_request("auto", user(std::string(1200, 'x'))));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-model"), "chat-default");
  EXPECT_EQ(response.header("x-sluice-deployment"), "backup");
  EXPECT_EQ(response.header("x-sluice-attempts"), "2");
  EXPECT_EQ(json::parse(response.body)["model"], "chat-backup");
  EXPECT_EQ(broken_default_->stats().requests, 1u);
  EXPECT_EQ(backup_->stats().requests, 1u);
  EXPECT_EQ(mini_->stats().requests, 0u);
}

TEST_F(RuleRouting, TheTargetsShapingAppliesAfterTheRoutingModelsOwn) {
  TestGateway gateway(config("", "    shaping:\n      defaults: {max_tokens: 1000}\n"));
  auto response = post(gateway.port(), chat_request("auto", user("Hi")));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-model"), "chat-mini");
  // auto's default of 1000, then chat-mini's cap of 256.
  EXPECT_EQ(response.header("x-sluice-shaped"), "max_tokens,max_tokens_capped");
  EXPECT_EQ(last_body(*mini_)["max_tokens"], 256);
}

TEST_F(RuleRouting, TheKeyIsCheckedAgainstThePublicName) {
  TestGateway gateway(config(std::string("auth:\n  keys:\n    - name: team\n      key: ") + kKey +
                             "\n      models: [auto]\n"));
  const Headers auth = bearer(kKey);
  auto routed = post(gateway.port(), chat_request("auto", user("Hi")), auth);
  ASSERT_EQ(routed.status, 200u) << routed.body;
  EXPECT_EQ(routed.header("x-sluice-model"), "chat-mini");
  auto direct = post(gateway.port(), chat_request("chat-mini", user("Hi")), auth);
  EXPECT_EQ(direct.status, 404u) << direct.body;
}

TEST_F(RuleRouting, NoMatchingRuleIsAClientError) {
  TestGateway gateway(
      "models:\n  - name: chat-mini\n    deployments:\n" +
      named_deployment("mini", mini_->base_url(), "chat-mini") +
      "  - name: auto\n    rules:\n      - {when: {contains_any: [sql]}, model: chat-mini}\n");
  auto response = post(gateway.port(), chat_request("auto", user("Hi")));
  EXPECT_EQ(response.status, 400u);
  auto error = json::parse(response.body)["error"];
  EXPECT_EQ(error["code"], "no_matching_rule");
  EXPECT_EQ(error["param"], "model");
  EXPECT_EQ(mini_->stats().requests, 0u);
  EXPECT_EQ(post(gateway.port(), chat_request("auto", user("Write SQL"))).status, 200u);
}

TEST_F(RuleRouting, TheAccessLogNamesTheTargetAndTheChanges) {
  TempFile log_file("", ".log");
  TestGateway gateway(config("server:\n  listen: 127.0.0.1:0\n  threads: 2\nlog:\n  access_log: " +
                             log_file.path() + "\n"));
  auto response = post(gateway.port(), chat_request("auto", user("Hi"), {{"max_tokens", 9999}}));
  ASSERT_EQ(response.status, 200u) << response.body;
  std::string line;
  ASSERT_TRUE(eventually(
      [&] {
        std::ifstream in(log_file.path());
        return static_cast<bool>(std::getline(in, line)) && !line.empty();
      },
      3s));
  auto record = json::parse(line);
  EXPECT_EQ(record["model"], "auto");
  EXPECT_EQ(record["routed_to"], "chat-mini");
  EXPECT_EQ(record["shaped"], "max_tokens_capped");
  EXPECT_EQ(record["deployment"], "mini");
}

}  // namespace
}  // namespace sluice::testing

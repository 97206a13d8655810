// Request shaping and rule routing as pure decisions over a parsed body.
#include "sluice/shaping/shaping.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice::shaping {
namespace {

Json message(const std::string& role, const std::string& content) {
  return Json{{"role", role}, {"content", content}};
}

Json tool_call_message(const std::string& id, const std::string& arguments) {
  return Json{{"role", "assistant"},
              {"content", nullptr},
              {"tool_calls",
               Json::array({Json{{"id", id},
                                 {"type", "function"},
                                 {"function", {{"name", "lookup"}, {"arguments", arguments}}}}})}};
}

Json tool_result(const std::string& id, const std::string& content) {
  return Json{{"role", "tool"}, {"tool_call_id", id}, {"content", content}};
}

Json chat(Json messages) { return Json{{"model", "m"}, {"messages", std::move(messages)}}; }

std::vector<std::string> contents(const Json& request) {
  std::vector<std::string> texts;
  for (const auto& entry : request["messages"]) {
    texts.push_back(entry["content"].is_string()
                        ? entry["content"].get<std::string>()
                        : std::string("<") + entry["role"].get<std::string>() + ">");
  }
  return texts;
}

std::uint64_t prompt_tokens_of_messages(const Json& request) {
  std::uint64_t characters = 0;
  for (const auto& entry : request["messages"]) characters += message_characters(entry);
  return estimate_tokens(characters);
}

config::TrimHistory limits(unsigned max_messages, std::uint64_t max_prompt_tokens,
                           bool keep_system = true) {
  config::TrimHistory trim;
  trim.max_messages = max_messages;
  trim.max_prompt_tokens = max_prompt_tokens;
  trim.keep_system = keep_system;
  return trim;
}

// ---------------------------------------------------------------------------
// Token estimate

TEST(TokenEstimate, IsCharactersOverFourRoundedUp) {
  EXPECT_EQ(estimate_tokens(0), 0u);
  EXPECT_EQ(estimate_tokens(1), 1u);
  EXPECT_EQ(estimate_tokens(4), 1u);
  EXPECT_EQ(estimate_tokens(5), 2u);
  EXPECT_EQ(estimate_tokens(400), 100u);
}

TEST(TokenEstimate, CountsCharactersNotBytes) {
  EXPECT_EQ(count_characters("abcd"), 4u);
  EXPECT_EQ(count_characters("héllo"), 5u);   // é is two bytes
  EXPECT_EQ(count_characters("日本語"), 3u);  // three bytes each
  EXPECT_EQ(count_characters("😀"), 1u);       // four bytes
}

TEST(TokenEstimate, MessageTextFromStringsPartsAndToolCalls) {
  EXPECT_EQ(message_characters(message("user", "12345678")), 8u);
  Json parts{{"role", "user"},
             {"content",
              Json::array({Json{{"type", "text"}, {"text", "abcd"}},
                           Json{{"type", "image_url"}, {"image_url", {{"url", "data:ignored"}}}},
                           Json{{"type", "text"}, {"text", "efgh"}}})}};
  EXPECT_EQ(message_characters(parts), 8u);
  EXPECT_EQ(message_characters(tool_call_message("c1", R"({"q":"x"})")), 9u);
}

TEST(TokenEstimate, PromptOfEveryEndpointShape) {
  EXPECT_EQ(estimate_prompt_tokens(
                chat(Json::array({message("system", "12345678"), message("user", "1234")}))),
            3u);
  EXPECT_EQ(estimate_prompt_tokens(Json{{"prompt", "12345678"}}), 2u);
  EXPECT_EQ(estimate_prompt_tokens(Json{{"prompt", Json::array({"1234", "5678"})}}), 2u);
  EXPECT_EQ(
      estimate_prompt_tokens(Json{
          {"instructions", "1234"},
          {"input", Json::array({message("user", "5678"),
                                 Json{{"type", "function_call_output"}, {"output", "abcd"}}})}}),
      3u);
}

// ---------------------------------------------------------------------------
// Trimming

TEST(TrimHistory, WithinLimitsChangesNothing) {
  Json request = chat(Json::array({message("system", "s"), message("user", "u")}));
  Json before = request;
  EXPECT_FALSE(trim_history(limits(2, 100), request));
  EXPECT_EQ(request, before);
}

TEST(TrimHistory, DropsOldestNonSystemMessagesUntilMaxMessagesHolds) {
  Json request =
      chat(Json::array({message("system", "sys"), message("user", "u1"), message("assistant", "a1"),
                        message("user", "u2"), message("assistant", "a2"), message("user", "u3")}));
  ASSERT_TRUE(trim_history(limits(3, 0), request));
  EXPECT_EQ(contents(request), (std::vector<std::string>{"sys", "a2", "u3"}));
}

TEST(TrimHistory, DropsUntilPromptTokensHold) {
  const std::string forty(40, 'x');  // 10 tokens
  Json request =
      chat(Json::array({message("system", forty), message("user", forty + "1"),
                        message("assistant", forty + "2"), message("user", forty + "3"),
                        message("assistant", forty + "4"), message("user", forty + "5")}));
  ASSERT_GT(prompt_tokens_of_messages(request), 40u);
  // 245 characters, 62 tokens: dropping two messages leaves 163 characters,
  // 41 tokens. Oldest first, and no more than needed.
  ASSERT_TRUE(trim_history(limits(0, 41), request));
  EXPECT_LE(prompt_tokens_of_messages(request), 41u);
  EXPECT_EQ(contents(request),
            (std::vector<std::string>{forty, forty + "3", forty + "4", forty + "5"}));
}

TEST(TrimHistory, BothLimitsMustHold) {
  const std::string long_text(400, 'y');  // 100 tokens
  Json request = chat(
      Json::array({message("user", "old"), message("assistant", long_text), message("user", "mid"),
                   message("assistant", "short"), message("user", "last")}));
  // Four messages would satisfy max_messages, but the long answer breaks the
  // token limit until it is gone as well.
  ASSERT_TRUE(trim_history(limits(4, 50), request));
  EXPECT_EQ(contents(request), (std::vector<std::string>{"mid", "short", "last"}));
  EXPECT_LE(request["messages"].size(), 4u);
  EXPECT_LE(prompt_tokens_of_messages(request), 50u);
}

TEST(TrimHistory, KeepsSystemMessagesWhereverTheyAre) {
  Json request =
      chat(Json::array({message("user", "u1"), message("system", "s1"), message("developer", "d1"),
                        message("assistant", "a1"), message("user", "u2")}));
  ASSERT_TRUE(trim_history(limits(3, 0), request));
  EXPECT_EQ(contents(request), (std::vector<std::string>{"s1", "d1", "u2"}));
}

TEST(TrimHistory, WithoutKeepSystemSystemMessagesAreDroppedLikeOthers) {
  Json request = chat(Json::array({message("system", "sys"), message("user", "u1"),
                                   message("assistant", "a1"), message("user", "u2")}));
  ASSERT_TRUE(trim_history(limits(2, 0, /*keep_system=*/false), request));
  EXPECT_EQ(contents(request), (std::vector<std::string>{"a1", "u2"}));
}

TEST(TrimHistory, NeverDropsTheLastUserMessageEvenOverTheLimits) {
  const std::string huge(4000, 'z');
  Json request = chat(Json::array({message("system", "sys"), message("user", "u1"),
                                   message("assistant", "a1"), message("user", huge)}));
  ASSERT_TRUE(trim_history(limits(1, 10), request));
  EXPECT_EQ(contents(request), (std::vector<std::string>{"sys", huge}));
}

TEST(TrimHistory, KeepsTheTurnInProgressAfterTheLastUserMessage) {
  Json request =
      chat(Json::array({message("user", "u1"), message("assistant", "a1"), message("user", "u2"),
                        tool_call_message("c1", "{}"), tool_result("c1", "r1")}));
  ASSERT_TRUE(trim_history(limits(2, 0), request));
  EXPECT_EQ(contents(request), (std::vector<std::string>{"u2", "<assistant>", "r1"}));
}

TEST(TrimHistory, DropsAToolCallTogetherWithAllItsResults) {
  Json call{
      {"role", "assistant"},
      {"content", nullptr},
      {"tool_calls", Json::array({Json{{"id", "a"},
                                       {"type", "function"},
                                       {"function", {{"name", "f"}, {"arguments", "{}"}}}},
                                  Json{{"id", "b"},
                                       {"type", "function"},
                                       {"function", {{"name", "f"}, {"arguments", "{}"}}}}})}};
  Json request = chat(
      Json::array({message("system", "sys"), message("user", "u1"), call, tool_result("a", "ra"),
                   tool_result("b", "rb"), message("assistant", "a1"), message("user", "u2")}));
  // Without u1 six remain, one too many; the next oldest is the call with
  // its two results, and they go as one, never the call alone.
  ASSERT_TRUE(trim_history(limits(5, 0), request));
  EXPECT_EQ(contents(request), (std::vector<std::string>{"sys", "a1", "u2"}));
  for (const auto& entry : request["messages"]) EXPECT_NE(entry["role"], "tool");
}

TEST(TrimHistory, KeepsAToolCallWithItsResultsWhenTheLimitAllows) {
  Json request = chat(
      Json::array({message("user", "u1"), tool_call_message("c1", "{}"), tool_result("c1", "r1"),
                   message("assistant", "a1"), message("user", "u2")}));
  ASSERT_TRUE(trim_history(limits(4, 0), request));
  EXPECT_EQ(contents(request), (std::vector<std::string>{"<assistant>", "r1", "a1", "u2"}));
}

TEST(TrimHistory, LeavesBodiesWithoutMessagesAlone) {
  Json request{{"model", "m"}, {"prompt", std::string(1000, 'p')}};
  Json before = request;
  EXPECT_FALSE(trim_history(limits(1, 1), request));
  EXPECT_EQ(request, before);
}

// ---------------------------------------------------------------------------
// Defaults and caps

config::Shaping defaults_and_caps(std::optional<std::uint64_t> default_max_tokens,
                                  std::optional<std::string> effort,
                                  std::optional<std::uint64_t> cap) {
  config::Shaping shaping;
  shaping.defaults.max_tokens = default_max_tokens;
  shaping.defaults.reasoning_effort = std::move(effort);
  shaping.caps.max_tokens = cap;
  return shaping;
}

TEST(Defaults, SetOnlyWhatTheClientLeftOut) {
  auto shaping = defaults_and_caps(512, "low", std::nullopt);
  Json request = chat(Json::array({message("user", "hi")}));
  auto report = apply_shaping(shaping, "/chat/completions", request);
  EXPECT_EQ(request["max_tokens"], 512);
  EXPECT_EQ(request["reasoning_effort"], "low");
  EXPECT_EQ(report.joined(), "max_tokens,reasoning_effort");
}

TEST(Defaults, ClientValuesWin) {
  auto shaping = defaults_and_caps(512, "low", std::nullopt);
  Json request = chat(Json::array({message("user", "hi")}));
  request["max_tokens"] = 100;
  request["reasoning_effort"] = "high";
  Json before = request;
  auto report = apply_shaping(shaping, "/chat/completions", request);
  EXPECT_EQ(request, before);
  EXPECT_FALSE(report.changed());
}

TEST(Defaults, MaxCompletionTokensCountsAsSet) {
  auto shaping = defaults_and_caps(512, std::nullopt, std::nullopt);
  Json request = chat(Json::array({message("user", "hi")}));
  request["max_completion_tokens"] = 64;
  auto report = apply_shaping(shaping, "/chat/completions", request);
  EXPECT_FALSE(request.contains("max_tokens"));
  EXPECT_FALSE(report.changed());
}

TEST(Defaults, NullCountsAsNotSet) {
  auto shaping = defaults_and_caps(512, std::nullopt, std::nullopt);
  Json request = chat(Json::array({message("user", "hi")}));
  request["max_tokens"] = nullptr;
  apply_shaping(shaping, "/chat/completions", request);
  EXPECT_EQ(request["max_tokens"], 512);
}

TEST(Defaults, ResponsesApiSpelling) {
  auto shaping = defaults_and_caps(512, "low", std::nullopt);
  Json request{{"model", "m"}, {"input", "hi"}};
  auto report = apply_shaping(shaping, "/responses", request);
  EXPECT_EQ(request["max_output_tokens"], 512);
  EXPECT_FALSE(request.contains("max_tokens"));
  EXPECT_EQ(request["reasoning"]["effort"], "low");
  EXPECT_EQ(report.joined(), "max_tokens,reasoning_effort");

  Json set{{"model", "m"}, {"input", "hi"}, {"reasoning", {{"effort", "high"}}}};
  apply_shaping(shaping, "/responses", set);
  EXPECT_EQ(set["reasoning"]["effort"], "high");
}

TEST(Defaults, EmbeddingsAreLeftAlone) {
  auto shaping = defaults_and_caps(512, "low", 100);
  Json request{{"model", "m"}, {"input", "hi"}};
  Json before = request;
  EXPECT_FALSE(apply_shaping(shaping, "/embeddings", request).changed());
  EXPECT_EQ(request, before);
}

TEST(Defaults, KeepTheClientsKeyOrder) {
  auto shaping = defaults_and_caps(512, std::nullopt, std::nullopt);
  Json request = Json::parse(R"({"stream":false,"model":"m","messages":[]})");
  apply_shaping(shaping, "/chat/completions", request);
  EXPECT_EQ(request.dump(), R"({"stream":false,"model":"m","messages":[],"max_tokens":512})");
}

TEST(Caps, ClampWhatTheClientAskedFor) {
  auto shaping = defaults_and_caps(std::nullopt, std::nullopt, 2048);
  for (std::string field : {"max_tokens", "max_completion_tokens"}) {
    Json request = chat(Json::array({message("user", "hi")}));
    request[field] = 100000;
    auto report = apply_shaping(shaping, "/chat/completions", request);
    EXPECT_EQ(request[field], 2048) << field;
    EXPECT_EQ(report.joined(), "max_tokens_capped") << field;
  }
  Json fractional = chat(Json::array({message("user", "hi")}));
  fractional["max_tokens"] = 5000.5;
  apply_shaping(shaping, "/chat/completions", fractional);
  EXPECT_EQ(fractional["max_tokens"], 2048);
}

TEST(Caps, LeaveSmallerValuesAndUnsetFieldsAlone) {
  auto shaping = defaults_and_caps(std::nullopt, std::nullopt, 2048);
  Json request = chat(Json::array({message("user", "hi")}));
  request["max_tokens"] = 2048;
  EXPECT_FALSE(apply_shaping(shaping, "/chat/completions", request).changed());
  EXPECT_EQ(request["max_tokens"], 2048);

  Json unset = chat(Json::array({message("user", "hi")}));
  EXPECT_FALSE(apply_shaping(shaping, "/chat/completions", unset).changed());
  EXPECT_FALSE(unset.contains("max_tokens"));
}

TEST(Caps, DefaultIsNotReportedAsCapped) {
  auto shaping = defaults_and_caps(512, std::nullopt, 2048);
  Json request = chat(Json::array({message("user", "hi")}));
  auto report = apply_shaping(shaping, "/chat/completions", request);
  EXPECT_EQ(request["max_tokens"], 512);
  EXPECT_EQ(report.joined(), "max_tokens");
}

TEST(Shaping, TrimsChatOnlyAndReportsEachChange) {
  config::Shaping shaping = defaults_and_caps(512, std::nullopt, 1000);
  shaping.trim_history = limits(2, 0);
  Json request = chat(Json::array({message("system", "sys"), message("user", "u1"),
                                   message("assistant", "a1"), message("user", "u2")}));
  request["max_completion_tokens"] = 5000;
  auto report = apply_shaping(shaping, "/chat/completions", request);
  EXPECT_EQ(report.joined(), "trimmed,max_tokens_capped");
  EXPECT_EQ(contents(request), (std::vector<std::string>{"sys", "u2"}));
  EXPECT_EQ(request["max_completion_tokens"], 1000);
}

// ---------------------------------------------------------------------------
// Rules

config::Rule rule(std::optional<config::RuleCondition> when, std::string model) {
  return config::Rule{std::move(when), std::move(model)};
}

config::RuleCondition below(std::uint64_t tokens) {
  config::RuleCondition when;
  when.prompt_tokens_below = tokens;
  return when;
}

const std::vector<config::Rule>& example_rules() {
  static const std::vector<config::Rule> rules = [] {
    config::RuleCondition small = below(200);
    small.no_tools = true;
    config::RuleCondition reasoning;
    reasoning.contains_any = {"prove", "step by step"};
    return std::vector<config::Rule>{rule(small, "chat-mini"), rule(reasoning, "chat-reasoning"),
                                     rule(std::nullopt, "chat-default")};
  }();
  return rules;
}

std::string target_of(const Json& request) {
  const std::string* target = choose_rule_target(example_rules(), request);
  return target ? *target : "<none>";
}

TEST(Rules, FirstMatchWins) {
  // Short and without tools: the first rule, even though it says "prove".
  EXPECT_EQ(target_of(chat(Json::array({message("user", "Prove it")}))), "chat-mini");
  const std::string long_text(1000, 'w');
  EXPECT_EQ(target_of(chat(Json::array({message("user", long_text + " prove that")}))),
            "chat-reasoning");
  EXPECT_EQ(target_of(chat(Json::array({message("user", long_text)}))), "chat-default");
}

TEST(Rules, PromptTokensBelowIsStrict) {
  config::RuleCondition when = below(3);
  EXPECT_TRUE(rule_matches(when, chat(Json::array({message("user", "12345678")}))));    // 2
  EXPECT_FALSE(rule_matches(when, chat(Json::array({message("user", "123456789")}))));  // 3
  // The system prompt counts towards the size.
  EXPECT_FALSE(
      rule_matches(when, chat(Json::array({message("system", "12345678"), message("user", "1")}))));
}

TEST(Rules, NoTools) {
  config::RuleCondition without;
  without.no_tools = true;
  config::RuleCondition with;
  with.no_tools = false;
  Json plain = chat(Json::array({message("user", "hi")}));
  Json tools = plain;
  tools["tools"] = Json::array({Json{{"type", "function"}, {"function", {{"name", "f"}}}}});
  Json empty_tools = plain;
  empty_tools["tools"] = Json::array();
  EXPECT_TRUE(rule_matches(without, plain));
  EXPECT_FALSE(rule_matches(without, tools));
  EXPECT_TRUE(rule_matches(without, empty_tools));
  EXPECT_FALSE(rule_matches(with, plain));
  EXPECT_TRUE(rule_matches(with, tools));
  // A short request with tools skips the first rule.
  EXPECT_EQ(target_of(tools), "chat-default");
}

TEST(Rules, ContainsAnyIsCaseInsensitiveOverTheConversation) {
  config::RuleCondition when;
  when.contains_any = {"step by step"};  // lower-cased by the config loader
  EXPECT_TRUE(rule_matches(when, chat(Json::array({message("user", "Go STEP BY Step please")}))));
  EXPECT_TRUE(rule_matches(when, chat(Json::array({message("assistant", "let us go step by step"),
                                                   message("user", "ok")}))));
  Json parts{{"role", "user"},
             {"content", Json::array({Json{{"type", "text"}, {"text", "think Step by step"}}})}};
  EXPECT_TRUE(rule_matches(when, chat(Json::array({parts}))));
  EXPECT_FALSE(rule_matches(when, chat(Json::array({message("user", "step-by-step")}))));
  // Not the system prompt: an application's fixed instructions would match
  // every request.
  EXPECT_FALSE(rule_matches(
      when, chat(Json::array({message("system", "Think step by step."), message("user", "hi")}))));
  EXPECT_TRUE(rule_matches(when, Json{{"prompt", "Step by step:"}}));
}

TEST(Rules, AllConditionsOfARuleMustHold) {
  config::RuleCondition when = below(100);
  when.no_tools = true;
  when.contains_any = {"sql"};
  EXPECT_TRUE(rule_matches(when, chat(Json::array({message("user", "write SQL")}))));
  EXPECT_FALSE(rule_matches(when, chat(Json::array({message("user", "write python")}))));
  EXPECT_FALSE(
      rule_matches(when, chat(Json::array({message("user", "SQL " + std::string(400, 'x'))}))));
}

TEST(Rules, NoMatchWithoutACatchAll) {
  std::vector<config::Rule> rules = {rule(below(2), "tiny")};
  EXPECT_EQ(choose_rule_target(rules, chat(Json::array({message("user", "long enough")}))),
            nullptr);
  const std::string* picked = choose_rule_target(rules, chat(Json::array({message("user", "a")})));
  ASSERT_NE(picked, nullptr);
  EXPECT_EQ(*picked, "tiny");
}

// ---------------------------------------------------------------------------
// The whole stage

config::Config routing_config() {
  config::Config config;
  auto add = [&](config::Model model) {
    config.model_index.emplace(model.name, config.models.size());
    config.models.push_back(std::move(model));
  };
  config::Model mini;
  mini.name = "chat-mini";
  mini.deployments.push_back(config::Deployment{});
  mini.shaping = defaults_and_caps(std::nullopt, std::nullopt, 100);
  add(mini);
  config::Model big;
  big.name = "chat-big";
  big.deployments.push_back(config::Deployment{});
  add(big);
  config::Model router;
  router.name = "auto";
  router.rules = {rule(below(10), "chat-mini"), rule(std::nullopt, "chat-big")};
  router.shaping = defaults_and_caps(50, std::nullopt, std::nullopt);
  add(router);
  return config;
}

TEST(ShapeRequest, RoutesThenAppliesTheRequestedAndTheTargetsShaping) {
  auto config = routing_config();
  const config::Model& router = *config.find_model("auto");

  auto small = shape_request(config, router, "/chat/completions",
                             R"({"model":"auto","messages":[{"role":"user","content":"hi"}]})");
  ASSERT_NE(small.target, nullptr);
  EXPECT_EQ(small.target->name, "chat-mini");
  EXPECT_TRUE(small.routed);
  EXPECT_EQ(small.report.joined(), "max_tokens");  // auto's default, under mini's cap
  EXPECT_EQ(small.max_tokens, 50u);
  EXPECT_EQ(Json::parse(small.body)["max_tokens"], 50);
  EXPECT_EQ(Json::parse(small.body)["model"], "auto");  // the pipeline splices the model

  std::string long_body =
      R"({"model":"auto","max_tokens":9000,"messages":[{"role":"user","content":")" +
      std::string(100, 'x') + R"("}]})";
  auto large = shape_request(config, router, "/chat/completions", long_body);
  ASSERT_NE(large.target, nullptr);
  EXPECT_EQ(large.target->name, "chat-big");
  EXPECT_FALSE(large.report.changed());  // the client set max_tokens; big has no cap
  EXPECT_TRUE(large.body.empty());       // nothing to rewrite: the client's body goes
}

TEST(ShapeRequest, TargetCapsApplyToTheRoutedRequest) {
  auto config = routing_config();
  auto shaped = shape_request(
      config, *config.find_model("auto"), "/chat/completions",
      R"({"model":"auto","max_tokens":4000,"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_NE(shaped.target, nullptr);
  EXPECT_EQ(shaped.target->name, "chat-mini");
  EXPECT_EQ(shaped.report.joined(), "max_tokens_capped");
  EXPECT_EQ(shaped.max_tokens, 100u);
}

TEST(ShapeRequest, NoMatchingRuleLeavesNoTarget) {
  auto config = routing_config();
  config.models[config.model_index["auto"]].rules.pop_back();
  auto shaped = shape_request(config, *config.find_model("auto"), "/chat/completions",
                              R"({"model":"auto","prompt":")" + std::string(100, 'x') + R"("})");
  EXPECT_EQ(shaped.target, nullptr);
}

TEST(ShapeRequest, ModelWithShapingOnlyStaysTheTarget) {
  auto config = routing_config();
  const config::Model& mini = *config.find_model("chat-mini");
  auto shaped = shape_request(config, mini, "/chat/completions",
                              R"({"model":"chat-mini","max_tokens":101,"messages":[]})");
  EXPECT_EQ(shaped.target, &mini);
  EXPECT_FALSE(shaped.routed);
  EXPECT_EQ(shaped.report.joined(), "max_tokens_capped");
  EXPECT_EQ(shaped.body, R"({"model":"chat-mini","max_tokens":100,"messages":[]})");
}

}  // namespace
}  // namespace sluice::shaping

// What makes two requests the same request for the cache.
#include "sluice/cache/request_key.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace sluice::cache {
namespace {

using json = nlohmann::json;

json base_request() {
  return json::parse(R"({
    "model": "chat",
    "temperature": 0,
    "max_tokens": 50,
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What is the capital of France?"}
    ]
  })");
}

Digest exact_key(json body, std::string_view model = "chat", Endpoint endpoint = Endpoint::chat) {
  return request_key(std::move(body), model, endpoint, false).exact;
}

TEST(RequestKey, IgnoresUserStreamStreamOptionsAndTheCacheFlag) {
  auto plain = exact_key(base_request());
  auto with_extras = base_request();
  with_extras["user"] = "alice";
  with_extras["stream"] = true;
  with_extras["stream_options"] = {{"include_usage", true}};
  with_extras["cache"] = true;
  EXPECT_EQ(exact_key(with_extras), plain);
}

TEST(RequestKey, DoesNotDependOnKeyOrderOrNumberSpelling) {
  auto reordered = json::parse(R"({
    "messages": [
      {"content": "Be brief.", "role": "system"},
      {"content": "What is the capital of France?", "role": "user"}
    ],
    "max_tokens": 50.0,
    "temperature": 0.0,
    "model": "chat"
  })");
  EXPECT_EQ(exact_key(reordered), exact_key(base_request()));
}

TEST(RequestKey, ChangesWithSamplingParametersMessagesModelAndEndpoint) {
  auto plain = exact_key(base_request());

  auto warmer = base_request();
  warmer["temperature"] = 0.7;
  EXPECT_NE(exact_key(warmer), plain);

  auto shorter = base_request();
  shorter["max_tokens"] = 49;
  EXPECT_NE(exact_key(shorter), plain);

  auto seeded = base_request();
  seeded["seed"] = 1;
  EXPECT_NE(exact_key(seeded), plain);

  auto other_question = base_request();
  other_question["messages"][1]["content"] = "What is the capital of Spain?";
  EXPECT_NE(exact_key(other_question), plain);

  auto other_system = base_request();
  other_system["messages"][0]["content"] = "Be verbose.";
  EXPECT_NE(exact_key(other_system), plain);

  EXPECT_NE(exact_key(base_request(), "chat-2"), plain);
  EXPECT_NE(exact_key(base_request(), "chat", Endpoint::completions), plain);
}

TEST(RequestKey, TheBodysModelFieldIsReplacedByThePublicName) {
  auto aliased = base_request();
  aliased["model"] = "something-else";
  EXPECT_EQ(exact_key(aliased), exact_key(base_request()));
}

TEST(RequestKey, SemanticScopeIsTheConversationWithoutTheLastUserMessage) {
  auto first = request_key(base_request(), "chat", Endpoint::chat, true);
  EXPECT_EQ(first.query_text, "What is the capital of France?");
  EXPECT_FALSE(first.has_tools);

  auto rephrased = base_request();
  rephrased["messages"][1]["content"] = "Capital of France, what is it?";
  auto second = request_key(rephrased, "chat", Endpoint::chat, true);
  EXPECT_EQ(second.scope, first.scope);
  EXPECT_NE(second.exact, first.exact);

  auto other_parameters = base_request();
  other_parameters["max_tokens"] = 500;
  EXPECT_NE(request_key(other_parameters, "chat", Endpoint::chat, true).scope, first.scope);

  auto other_system = base_request();
  other_system["messages"][0]["content"] = "Answer in French.";
  EXPECT_NE(request_key(other_system, "chat", Endpoint::chat, true).scope, first.scope);
}

TEST(RequestKey, QueryTextComesFromTextPartsAndThePrompt) {
  auto parts = base_request();
  parts["messages"][1]["content"] = json::parse(
      R"([{"type":"text","text":"Describe"},{"type":"image_url","image_url":{"url":"x"}},
          {"type":"text","text":"this"}])");
  parts["messages"].push_back({{"role", "assistant"}, {"content", "Sure."}});
  EXPECT_EQ(request_key(parts, "chat", Endpoint::chat, true).query_text, "Describe\nthis");

  auto completion = json::parse(R"({"model":"c","prompt":"Once upon a time","temperature":0})");
  EXPECT_EQ(request_key(completion, "c", Endpoint::completions, true).query_text,
            "Once upon a time");
}

TEST(RequestKey, NotesTools) {
  auto with_tools = base_request();
  with_tools["tools"] = json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  EXPECT_TRUE(request_key(with_tools, "chat", Endpoint::chat, true).has_tools);
  auto empty_tools = base_request();
  empty_tools["tools"] = json::array();
  EXPECT_FALSE(request_key(empty_tools, "chat", Endpoint::chat, true).has_tools);
}

TEST(CachedEndpoint, OnlyCompletions) {
  EXPECT_EQ(cached_endpoint("/chat/completions"), Endpoint::chat);
  EXPECT_EQ(cached_endpoint("/completions"), Endpoint::completions);
  EXPECT_FALSE(cached_endpoint("/embeddings").has_value());
  EXPECT_FALSE(cached_endpoint("/responses").has_value());
}

}  // namespace
}  // namespace sluice::cache

// OpenAI chat completion requests translated to Anthropic Messages
// requests: each mapping, and each field that is refused.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sluice/protocol/anthropic_request.hpp"

namespace sluice::protocol::anthropic {
namespace {

using nlohmann::json;

json translated(const std::string& openai_body) {
  auto result = translate_chat_request(openai_body);
  EXPECT_TRUE(result.ok()) << openai_body << " -> " << result.error().to_json();
  return result.ok() ? json::parse(result.value()) : json();
}

struct Mapping {
  const char* what;
  const char* openai;
  const char* anthropic;
};

// `model` and `messages` are in every request; the default max_tokens
// (4096) is in every translation that does not say otherwise.
const Mapping kMappings[] = {
    {"a user message becomes a text block, max_tokens defaults",
     R"({"model":"claude","messages":[{"role":"user","content":"hi"}]})",
     R"({"model":"claude","max_tokens":4096,
         "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})"},
    {"system and developer messages become the system prompt",
     R"({"model":"m","messages":[{"role":"system","content":"be brief"},
         {"role":"developer","content":[{"type":"text","text":"be kind"}]},
         {"role":"user","content":"hi"}]})",
     R"({"model":"m","max_tokens":4096,"system":"be brief\n\nbe kind",
         "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})"},
    {"consecutive messages of one role are merged",
     R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},
         {"role":"assistant","content":"c"},{"role":"assistant","content":"d"}]})",
     R"({"model":"m","max_tokens":4096,"messages":[
         {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
         {"role":"assistant","content":[{"type":"text","text":"c"},{"type":"text","text":"d"}]}]})"},
    {"text and image parts become blocks: a URL source and a base64 one",
     R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what?"},
         {"type":"image_url","image_url":{"url":"https://x.test/cat.png","detail":"high"}},
         {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0K"}}]}]})",
     R"({"model":"m","max_tokens":4096,"messages":[{"role":"user","content":[
         {"type":"text","text":"what?"},
         {"type":"image","source":{"type":"url","url":"https://x.test/cat.png"}},
         {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0K"}}]}]})"},
    {"tools and tool_choice (a function)",
     R"({"model":"m","messages":[{"role":"user","content":"weather?"}],
         "tools":[{"type":"function","function":{"name":"weather","description":"Gets it",
           "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
           {"type":"function","function":{"name":"now"}}],
         "tool_choice":{"type":"function","function":{"name":"weather"}}})",
     R"({"model":"m","max_tokens":4096,
         "messages":[{"role":"user","content":[{"type":"text","text":"weather?"}]}],
         "tools":[{"name":"weather","description":"Gets it",
           "input_schema":{"type":"object","properties":{"city":{"type":"string"}}}},
           {"name":"now","input_schema":{"type":"object","properties":{}}}],
         "tool_choice":{"type":"tool","name":"weather"}})"},
    {"tool_choice required is any; parallel_tool_calls false disables parallel use",
     R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required",
         "parallel_tool_calls":false})",
     R"({"model":"m","max_tokens":4096,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
         "tool_choice":{"type":"any","disable_parallel_tool_use":true}})"},
    {"tool_choice auto and none",
     R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"none"})",
     R"({"model":"m","max_tokens":4096,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
         "tool_choice":{"type":"none"}})"},
    {"assistant tool calls become tool_use blocks, tool messages tool_result blocks",
     R"({"model":"m","messages":[{"role":"user","content":"weather?"},
         {"role":"assistant","content":null,"tool_calls":[
           {"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}},
           {"id":"call_2","type":"function","function":{"name":"now","arguments":""}}]},
         {"role":"tool","tool_call_id":"call_1","content":"sunny"},
         {"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"noon"}]},
         {"role":"user","content":"thanks"}]})",
     R"({"model":"m","max_tokens":4096,"messages":[
         {"role":"user","content":[{"type":"text","text":"weather?"}]},
         {"role":"assistant","content":[
           {"type":"tool_use","id":"call_1","name":"weather","input":{"city":"Paris"}},
           {"type":"tool_use","id":"call_2","name":"now","input":{}}]},
         {"role":"user","content":[
           {"type":"tool_result","tool_use_id":"call_1","content":"sunny"},
           {"type":"tool_result","tool_use_id":"call_2","content":"noon"},
           {"type":"text","text":"thanks"}]}]})"},
    {"max_tokens, stop (a string), temperature, top_p, user, stream",
     R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":100,"stop":"END",
         "temperature":0.5,"top_p":0.9,"user":"u-1","stream":true,
         "stream_options":{"include_usage":true}})",
     R"({"model":"m","max_tokens":100,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
         "stop_sequences":["END"],"temperature":0.5,"top_p":0.9,"metadata":{"user_id":"u-1"},
         "stream":true})"},
    {"max_completion_tokens wins over max_tokens; stop as an array",
     R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":100,
         "max_completion_tokens":200,"stop":["a","b"]})",
     R"({"model":"m","max_tokens":200,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
         "stop_sequences":["a","b"]})"},
    {"reasoning_effort high: a thinking budget, max_tokens raised above it",
     R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"high",
         "max_tokens":1000})",
     R"({"model":"m","max_tokens":17384,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
         "thinking":{"type":"enabled","budget_tokens":16384}})"},
    {"reasoning_effort low under a large max_tokens leaves it as it is",
     R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"low",
         "max_completion_tokens":8000})",
     R"({"model":"m","max_tokens":8000,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
         "thinking":{"type":"enabled","budget_tokens":1024}})"},
    {"reasoning_effort medium with the default max_tokens",
     R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"medium"})",
     R"({"model":"m","max_tokens":8192,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
         "thinking":{"type":"enabled","budget_tokens":4096}})"},
    {"neutral values of fields Anthropic lacks, and nulls, are accepted",
     R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":1,"logprobs":false,
         "presence_penalty":0,"frequency_penalty":0.0,"response_format":{"type":"text"},
         "seed":null,"stream":false,"store":false,"reasoning_effort":"none"})",
     R"({"model":"m","max_tokens":4096,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]})"},
};

TEST(AnthropicRequest, EachMapping) {
  for (const auto& mapping : kMappings) {
    SCOPED_TRACE(mapping.what);
    EXPECT_EQ(translated(mapping.openai), json::parse(mapping.anthropic));
  }
}

struct Refusal {
  const char* openai_extra;  // spliced into a valid request
  const char* param;
};

const Refusal kRefusals[] = {
    {R"("n":2)", "n"},
    {R"("logprobs":true)", "logprobs"},
    {R"("top_logprobs":3)", "top_logprobs"},
    {R"("presence_penalty":0.5)", "presence_penalty"},
    {R"("frequency_penalty":-1)", "frequency_penalty"},
    {R"("logit_bias":{"50256":-100})", "logit_bias"},
    {R"("seed":7)", "seed"},
    {R"("response_format":{"type":"json_object"})", "response_format"},
    {R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})", "response_format"},
    {R"("functions":[{"name":"f"}])", "functions"},
    {R"("modalities":["text","audio"])", "modalities"},
    {R"("some_future_field":1)", "some_future_field"},
    {R"("reasoning_effort":"extreme")", "reasoning_effort"},
    {R"("max_tokens":0)", "max_tokens"},
    {R"("stop":[1])", "stop"},
    {R"("tools":[{"type":"web_search"}])", "tools[0].type"},
    {R"("tool_choice":"sometimes")", "tool_choice"},
};

TEST(AnthropicRequest, EachUnsupportedFieldIsRefusedByName) {
  for (const auto& refusal : kRefusals) {
    const std::string body =
        std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}],)") +
        refusal.openai_extra + "}";
    SCOPED_TRACE(body);
    auto result = translate_chat_request(body);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().status, 400u);
    EXPECT_EQ(result.error().type, "invalid_request_error");
    EXPECT_EQ(result.error().param, refusal.param);
    EXPECT_NE(result.error().message.find(refusal.param), std::string::npos)
        << result.error().message;
  }
}

TEST(AnthropicRequest, MessagesItCannotCarryAreRefusedByPlace) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x"}}]}])",
       "messages[0].content[0].type"},
      {R"([{"role":"function","name":"f","content":"x"}])", "messages[0].role"},
      {R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function",
          "function":{"name":"f","arguments":"not json"}}]}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"role":"tool","content":"x"}])", "messages[0].tool_call_id"},
      {R"([{"role":"system","content":"only a system prompt"}])", "messages"},
      {R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png,raw"}}]}])",
       "messages[0].content[0].image_url.url"},
  };
  for (const auto& [messages, param] : cases) {
    SCOPED_TRACE(messages);
    auto result =
        translate_chat_request(std::string(R"({"model":"m","messages":)") + messages + "}");
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().param, param) << result.error().message;
  }
}

TEST(AnthropicRequest, ABodyThatIsNoJsonObjectIsRefusedWithoutThrowing) {
  for (const char* body : {"", "{", "[]", "null", R"({"model":"m"})"}) {
    SCOPED_TRACE(body);
    auto result = translate_chat_request(body);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().status, 400u);
  }
}

TEST(AnthropicRequest, ThinkingBudgets) {
  EXPECT_EQ(thinking_budget("minimal"), 1024u);
  EXPECT_EQ(thinking_budget("low"), 1024u);
  EXPECT_EQ(thinking_budget("medium"), 4096u);
  EXPECT_EQ(thinking_budget("high"), 16384u);
  EXPECT_EQ(thinking_budget("none"), std::nullopt);
}

}  // namespace
}  // namespace sluice::protocol::anthropic

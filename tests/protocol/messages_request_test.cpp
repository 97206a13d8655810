// Anthropic Messages requests translated to OpenAI chat completion
// requests: each mapping, and each field that is refused.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sluice/protocol/messages_request.hpp"

namespace sluice::protocol::messages {
namespace {

using nlohmann::json;

json translated(const std::string& anthropic_body) {
  auto result = translate_messages_request(anthropic_body);
  EXPECT_TRUE(result.ok()) << anthropic_body << " -> " << result.error().to_json();
  return result.ok() ? json::parse(result.value()) : json();
}

struct Mapping {
  const char* what;
  const char* anthropic;
  const char* openai;
};

const Mapping kMappings[] = {
    {"a string message stays a string; model and max_tokens are copied",
     R"({"model":"claude-x","max_tokens":100,"messages":[{"role":"user","content":"hi"}]})",
     R"({"model":"claude-x","max_tokens":100,"messages":[{"role":"user","content":"hi"}]})"},
    {"a string system prompt is a leading system message",
     R"({"model":"m","max_tokens":1,"system":"be brief",
         "messages":[{"role":"user","content":"hi"}]})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"system","content":"be brief"},
         {"role":"user","content":"hi"}]})"},
    {"system text blocks are joined by a blank line, cache_control dropped",
     R"({"model":"m","max_tokens":1,"system":[{"type":"text","text":"You are Claude Code."},
         {"type":"text","text":"Be careful.","cache_control":{"type":"ephemeral"}}],
         "messages":[{"role":"user","content":"hi"}]})",
     R"({"model":"m","max_tokens":1,"messages":[
         {"role":"system","content":"You are Claude Code.\n\nBe careful."},
         {"role":"user","content":"hi"}]})"},
    {"an empty system prompt is no message",
     R"({"model":"m","max_tokens":1,"system":[],"messages":[{"role":"user","content":"hi"}]})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]})"},
    {"one text block becomes a string, several become text parts",
     R"({"model":"m","max_tokens":1,"messages":[
         {"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}]},
         {"role":"assistant","content":[{"type":"text","text":"b"}]},
         {"role":"user","content":[{"type":"text","text":"c"},{"type":"text","text":"d"}]}]})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},
         {"role":"assistant","content":"b"},
         {"role":"user","content":[{"type":"text","text":"c"},{"type":"text","text":"d"}]}]})"},
    {"images: a base64 source as a data: URL, a URL source as it is",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":[
         {"type":"text","text":"what?"},
         {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0K"}},
         {"type":"image","source":{"type":"url","url":"https://x.test/cat.png"}}]}]})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":[
         {"type":"text","text":"what?"},
         {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0K"}},
         {"type":"image_url","image_url":{"url":"https://x.test/cat.png"}}]}]})"},
    {"tool_use blocks become tool calls; tool results tool messages before the user's text",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"weather?"},
         {"role":"assistant","content":[{"type":"text","text":"Looking."},
           {"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Paris"}},
           {"type":"tool_use","id":"toolu_2","name":"now","input":{}}]},
         {"role":"user","content":[
           {"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},
           {"type":"tool_result","tool_use_id":"toolu_2","is_error":true,
            "content":[{"type":"text","text":"clock"},{"type":"text","text":"broken"}]},
           {"type":"text","text":"thanks"}]}]})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"weather?"},
         {"role":"assistant","content":"Looking.","tool_calls":[
           {"id":"toolu_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}},
           {"id":"toolu_2","type":"function","function":{"name":"now","arguments":"{}"}}]},
         {"role":"tool","tool_call_id":"toolu_1","content":"sunny"},
         {"role":"tool","tool_call_id":"toolu_2","content":"clock\nbroken"},
         {"role":"user","content":"thanks"}]})"},
    {"tool calls alone leave content null; results alone make no user message",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"go"},
         {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f"}]},
         {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1"}]}]})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"go"},
         {"role":"assistant","content":null,"tool_calls":[
           {"id":"t1","type":"function","function":{"name":"f","arguments":"{}"}}]},
         {"role":"tool","tool_call_id":"t1","content":""}]})"},
    {"earlier thinking is dropped; a turn of thinking alone is left out",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},
         {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"SIG"},
           {"type":"text","text":"b"}]},
         {"role":"user","content":"c"},
         {"role":"assistant","content":[{"type":"redacted_thinking","data":"opaque"}]},
         {"role":"user","content":"d"}]})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},
         {"role":"assistant","content":"b"},{"role":"user","content":"c"},
         {"role":"user","content":"d"}]})"},
    {"tools and tool_choice tool; cache_control on a tool dropped",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
         "tools":[{"name":"weather","description":"Gets it",
           "input_schema":{"type":"object","properties":{"city":{"type":"string"}}}},
           {"type":"custom","name":"now","input_schema":{"type":"object"},
            "cache_control":{"type":"ephemeral"}}],
         "tool_choice":{"type":"tool","name":"weather"}})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
         "tools":[{"type":"function","function":{"name":"weather","description":"Gets it",
           "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
           {"type":"function","function":{"name":"now","parameters":{"type":"object"}}}],
         "tool_choice":{"type":"function","function":{"name":"weather"}}})"},
    {"tool_choice any is required; disable_parallel_tool_use is parallel_tool_calls false",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
         "tool_choice":{"type":"any","disable_parallel_tool_use":true}})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
         "tool_choice":"required","parallel_tool_calls":false})"},
    {"tool_choice auto, parallel use left allowed",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
         "tool_choice":{"type":"auto","disable_parallel_tool_use":false}})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
         "tool_choice":"auto"})"},
    {"tool_choice none",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
         "tool_choice":{"type":"none"}})",
     R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
         "tool_choice":"none"})"},
    {"stop_sequences, temperature, top_p, metadata.user_id",
     R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],
         "stop_sequences":["END","STOP"],"temperature":0.5,"top_p":0.9,
         "metadata":{"user_id":"u-1"}})",
     R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],
         "stop":["END","STOP"],"temperature":0.5,"top_p":0.9,"user":"u-1"})"},
    {"stream asks for the usage too",
     R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"stream":true})",
     R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"stream":true,
         "stream_options":{"include_usage":true}})"},
    {"thinking up to 1024 is low effort, max_tokens its newer name",
     R"({"model":"m","max_tokens":2048,"messages":[{"role":"user","content":"x"}],
         "thinking":{"type":"enabled","budget_tokens":1024}})",
     R"({"model":"m","max_completion_tokens":2048,"messages":[{"role":"user","content":"x"}],
         "reasoning_effort":"low"})"},
    {"thinking up to 8192 is medium",
     R"({"model":"m","max_tokens":9000,"messages":[{"role":"user","content":"x"}],
         "thinking":{"type":"enabled","budget_tokens":8192}})",
     R"({"model":"m","max_completion_tokens":9000,"messages":[{"role":"user","content":"x"}],
         "reasoning_effort":"medium"})"},
    {"thinking above 8192 is high",
     R"({"model":"m","max_tokens":32000,"messages":[{"role":"user","content":"x"}],
         "thinking":{"type":"enabled","budget_tokens":8193}})",
     R"({"model":"m","max_completion_tokens":32000,"messages":[{"role":"user","content":"x"}],
         "reasoning_effort":"high"})"},
    {"thinking disabled, stream false, empty stop_sequences and nulls are nothing",
     R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],
         "thinking":{"type":"disabled"},"stream":false,"stop_sequences":[],"top_k":null,
         "metadata":{"user_id":null},"service_tier":null})",
     R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]})"},
};

TEST(MessagesRequest, EachMapping) {
  for (const auto& mapping : kMappings) {
    SCOPED_TRACE(mapping.what);
    EXPECT_EQ(translated(mapping.anthropic), json::parse(mapping.openai));
  }
}

TEST(MessagesRequest, ThinkingBudgetsAsEfforts) {
  EXPECT_EQ(reasoning_effort(1), "low");
  EXPECT_EQ(reasoning_effort(1024), "low");
  EXPECT_EQ(reasoning_effort(1025), "medium");
  EXPECT_EQ(reasoning_effort(4096), "medium");
  EXPECT_EQ(reasoning_effort(8192), "medium");
  EXPECT_EQ(reasoning_effort(8193), "high");
  EXPECT_EQ(reasoning_effort(16384), "high");
}

struct Refusal {
  const char* anthropic_extra;  // spliced into a valid request
  const char* param;
  const char* code;
};

const Refusal kRefusals[] = {
    {R"("top_k":40)", "top_k", "unsupported_parameter"},
    {R"("service_tier":"auto")", "service_tier", "unsupported_parameter"},
    {R"("container":"c")", "container", "unsupported_parameter"},
    {R"("mcp_servers":[{"type":"url","url":"https://x.test","name":"x"}])", "mcp_servers",
     "unsupported_parameter"},
    {R"("context_management":{"edits":[]})", "context_management", "unsupported_parameter"},
    {R"("some_future_field":1)", "some_future_field", "unsupported_parameter"},
    {R"("metadata":{"user_id":"u","other":1})", "metadata.other", "unsupported_parameter"},
    {R"("metadata":{"user_id":7})", "metadata.user_id", "invalid_value"},
    {R"("tools":[{"type":"web_search_20250305","name":"web_search"}])", "tools[0].type",
     "unsupported_parameter"},
    {R"("tools":[{"name":"f","input_schema":{}},{"type":"bash_20250124","name":"bash"}])",
     "tools[1].type", "unsupported_parameter"},
    {R"("tools":[{"name":"f"}])", "tools[0].input_schema", "invalid_value"},
    {R"("tools":[{"input_schema":{}}])", "tools[0].name", "invalid_value"},
    {R"("tool_choice":{"type":"sometimes"})", "tool_choice.type", "invalid_value"},
    {R"("tool_choice":{"type":"tool"})", "tool_choice.name", "invalid_value"},
    {R"("tool_choice":"auto")", "tool_choice", "invalid_value"},
    {R"("thinking":{"type":"enabled"})", "thinking.budget_tokens", "invalid_value"},
    {R"("thinking":{"type":"enabled","budget_tokens":0})", "thinking.budget_tokens",
     "invalid_value"},
    {R"("thinking":{"type":"sometimes"})", "thinking.type", "invalid_value"},
    {R"("stop_sequences":"END")", "stop_sequences", "invalid_value"},
    {R"("temperature":"hot")", "temperature", "invalid_value"},
    {R"("stream":"yes")", "stream", "invalid_value"},
    {R"("system":[{"type":"image","source":{}}])", "system[0].type", "unsupported_parameter"},
};

TEST(MessagesRequest, EachUnsupportedFieldIsRefusedByName) {
  for (const auto& refusal : kRefusals) {
    const std::string body =
        std::string(R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],)") +
        refusal.anthropic_extra + "}";
    SCOPED_TRACE(body);
    auto result = translate_messages_request(body);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().status, 400u);
    EXPECT_EQ(result.error().type, "invalid_request_error");
    EXPECT_EQ(result.error().param, refusal.param);
    EXPECT_EQ(result.error().code, refusal.code);
    EXPECT_NE(result.error().message.find(std::string("`") + refusal.param + "`"),
              std::string::npos)
        << result.error().message;
  }
}

TEST(MessagesRequest, MaxTokensIsRequiredAsAnthropicRequiresIt) {
  auto missing =
      translate_messages_request(R"({"model":"m","messages":[{"role":"user","content":"x"}]})");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().status, 400u);
  EXPECT_EQ(missing.error().param, "max_tokens");
  EXPECT_EQ(missing.error().code, "missing_required_parameter");
  for (const char* value : {"0", "-1", "1.5", "\"10\""}) {
    SCOPED_TRACE(value);
    auto wrong = translate_messages_request(
        std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":)") +
        value + "}");
    ASSERT_FALSE(wrong.ok());
    EXPECT_EQ(wrong.error().param, "max_tokens");
    EXPECT_EQ(wrong.error().code, "invalid_value");
  }
}

TEST(MessagesRequest, BlocksItCannotCarryAreRefusedByPlace) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"},
          {"role":"user","content":[{"type":"text","text":"read this"},
            {"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"x"}}]}])",
       "messages[2].content[1].type"},
      {R"([{"role":"user","content":[{"type":"search_result","source":"s","title":"t","content":[]}]}])",
       "messages[0].content[0].type"},
      {R"([{"role":"user","content":[{"type":"tool_result","tool_use_id":"t",
            "content":[{"type":"text","text":"see"},{"type":"image","source":{"type":"base64",
            "media_type":"image/png","data":"x"}}]}]}])",
       "messages[0].content[0].content[1].type"},
      {R"([{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}])",
       "messages[0].content[0].source.type"},
      {R"([{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}])",
       "messages[0].content[0].type"},
      {R"([{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t"}]}])",
       "messages[0].content[0].type"},
      {R"([{"role":"assistant","content":[{"type":"server_tool_use","id":"s","name":"web_search",
            "input":{}}]}])",
       "messages[0].content[0].type"},
      {R"([{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[1]}]}])",
       "messages[0].content[0].input"},
      {R"([{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}])",
       "messages[0].content[0]"},
      {R"([{"role":"user","content":[{"type":"tool_result","content":"x"}]}])",
       "messages[0].content[0].tool_use_id"},
      {R"([{"role":"system","content":"x"}])", "messages[0].role"},
      {R"([{"role":"user"}])", "messages[0].content"},
      {R"([{"role":"user","content":7}])", "messages[0].content"},
      {R"([])", "messages"},
  };
  for (const auto& [messages, param] : cases) {
    SCOPED_TRACE(messages);
    auto result = translate_messages_request(
        std::string(R"({"model":"m","max_tokens":5,"messages":)") + messages + "}");
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().status, 400u);
    EXPECT_EQ(result.error().param, param) << result.error().message;
  }
}

TEST(MessagesRequest, ABodyThatIsNoJsonObjectIsRefusedWithoutThrowing) {
  for (const char* body : {"", "{", "[]", "null", R"({"model":"m","max_tokens":5})",
                           R"({"model":"m","max_tokens":5,"messages":{}})", "\xff\xfe"}) {
    SCOPED_TRACE(body);
    auto result = translate_messages_request(body);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().status, 400u);
  }
}

}  // namespace
}  // namespace sluice::protocol::messages

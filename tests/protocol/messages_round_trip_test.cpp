// Anthropic requests translated to OpenAI and back by the other direction's
// translation (protocol::anthropic) equal the originals field for field, and
// so do Anthropic answers translated to OpenAI and back: for the fields
// both directions carry, written as the other direction writes them.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sluice/protocol/anthropic_answer.hpp"
#include "sluice/protocol/anthropic_request.hpp"
#include "sluice/protocol/messages_answer.hpp"
#include "sluice/protocol/messages_request.hpp"

namespace sluice::protocol {
namespace {

using nlohmann::json;

// Requests as protocol::anthropic writes them: content as blocks, the
// system prompt a string, tool results' content a string and before the
// turn's text, no empty text, max_tokens above any thinking budget, and
// budgets of the efforts (1024, 4096, 16384).
const char* const kRequests[] = {
    R"({"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})",
    R"({"model":"m","max_tokens":10,"system":"be brief","messages":[
        {"role":"user","content":[{"type":"text","text":"hi"}]},
        {"role":"assistant","content":[{"type":"text","text":"hello"}]},
        {"role":"user","content":[{"type":"text","text":"and"},{"type":"text","text":"bye"}]}],
        "stop_sequences":["x","y"],"temperature":0.2,"top_p":0.5,
        "metadata":{"user_id":"someone"},"stream":true})",
    R"({"model":"m","max_tokens":300,"messages":[{"role":"user","content":[
        {"type":"text","text":"what is this?"},
        {"type":"image","source":{"type":"url","url":"https://x.test/a.png"}},
        {"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"/9j/4AAQ"}}]}]})",
    R"({"model":"m","max_tokens":50,"messages":[
        {"role":"user","content":[{"type":"text","text":"weather?"}]},
        {"role":"assistant","content":[{"type":"text","text":"Looking."},
          {"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Paris","days":[1,2]}},
          {"type":"tool_use","id":"toolu_2","name":"now","input":{}}]},
        {"role":"user","content":[
          {"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},
          {"type":"tool_result","tool_use_id":"toolu_2","content":"noon"},
          {"type":"text","text":"thanks"}]}],
        "tools":[{"name":"weather","description":"Gets it",
          "input_schema":{"type":"object","properties":{"city":{"type":"string"}}}},
          {"name":"now","input_schema":{"type":"object","properties":{}}}],
        "tool_choice":{"type":"tool","name":"weather"}})",
    R"({"model":"m","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"go"}]}],
        "tools":[{"name":"f","input_schema":{"type":"object"}}],
        "tool_choice":{"type":"any","disable_parallel_tool_use":true}})",
    R"({"model":"m","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"go"}]}],
        "tools":[{"name":"f","input_schema":{"type":"object"}}],
        "tool_choice":{"type":"auto","disable_parallel_tool_use":true}})",
    R"({"model":"m","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"go"}]}],
        "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"none"}})",
    R"({"model":"m","max_tokens":2000,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
        "thinking":{"type":"enabled","budget_tokens":1024}})",
    R"({"model":"m","max_tokens":5000,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
        "thinking":{"type":"enabled","budget_tokens":4096}})",
    R"({"model":"m","max_tokens":20000,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
        "thinking":{"type":"enabled","budget_tokens":16384},"stream":true})",
};

TEST(MessagesRoundTrip, RequestsReadBackFieldForField) {
  for (const char* request : kRequests) {
    SCOPED_TRACE(request);
    auto openai = messages::translate_messages_request(request);
    ASSERT_TRUE(openai.ok()) << openai.error().to_json();
    auto back = anthropic::translate_chat_request(openai.value());
    ASSERT_TRUE(back.ok()) << openai.value() << " -> " << back.error().to_json();
    EXPECT_EQ(json::parse(back.value()), json::parse(request)) << "via " << openai.value();
  }
}

// Answers as Anthropic writes them, with what OpenAI's answer carries: one
// text block before any tool_use, no cache writes (OpenAI has none to
// report), and a stop_reason other than stop_sequence (OpenAI's stop does
// not tell it from end_turn).
const char* const kAnswers[] = {
    R"({"id":"msg_1","type":"message","role":"assistant","model":"claude-x",
        "content":[{"type":"text","text":"Hello there"}],"stop_reason":"end_turn",
        "stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":3,
        "cache_read_input_tokens":0}})",
    R"({"id":"msg_2","type":"message","role":"assistant","model":"claude-x",
        "content":[{"type":"text","text":"Let me look."},
          {"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Paris","n":[1,2.5]}},
          {"type":"tool_use","id":"toolu_2","name":"now","input":{}}],
        "stop_reason":"tool_use","stop_sequence":null,
        "usage":{"input_tokens":5,"output_tokens":40,"cache_read_input_tokens":100}})",
    R"({"id":"msg_3","type":"message","role":"assistant","model":"m",
        "content":[{"type":"tool_use","id":"toolu_9","name":"f","input":{"a":{"b":null}}}],
        "stop_reason":"tool_use","stop_sequence":null,
        "usage":{"input_tokens":1,"output_tokens":2,"cache_read_input_tokens":0}})",
    R"({"id":"msg_4","type":"message","role":"assistant","model":"m",
        "content":[{"type":"text","text":"cut sho"}],"stop_reason":"max_tokens",
        "stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":1,
        "cache_read_input_tokens":3}})",
    R"({"id":"msg_5","type":"message","role":"assistant","model":"m",
        "content":[],"stop_reason":"refusal","stop_sequence":null,
        "usage":{"input_tokens":7,"output_tokens":0,"cache_read_input_tokens":0}})",
};

TEST(MessagesRoundTrip, AnswersReadBackFieldForField) {
  for (const char* original : kAnswers) {
    SCOPED_TRACE(original);
    bool understood = false;
    const auto openai = anthropic::translate_answer_body(original, 1700000000, &understood);
    ASSERT_TRUE(understood) << openai;
    const auto back = messages::translate_answer_body(openai, &understood);
    ASSERT_TRUE(understood) << back;
    EXPECT_EQ(json::parse(back), json::parse(original)) << "via " << openai;
  }
}

// And the stop reasons alone, both ways, where they are total.
TEST(MessagesRoundTrip, StopReasonsReadBack) {
  for (const char* reason : {"end_turn", "max_tokens", "tool_use", "refusal"}) {
    SCOPED_TRACE(reason);
    EXPECT_EQ(messages::stop_reason(anthropic::finish_reason(reason)), reason);
  }
  for (const char* finish : {"stop", "length", "tool_calls", "content_filter"}) {
    SCOPED_TRACE(finish);
    EXPECT_EQ(anthropic::finish_reason(messages::stop_reason(finish)), finish);
  }
}

}  // namespace
}  // namespace sluice::protocol

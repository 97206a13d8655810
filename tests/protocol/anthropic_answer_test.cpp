// Anthropic Messages answers translated to OpenAI chat completions: whole
// messages, errors, and event streams fed one event at a time.

#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "sluice/protocol/anthropic_answer.hpp"

namespace sluice::protocol::anthropic {
namespace {

using nlohmann::json;

constexpr std::int64_t kCreated = 1700000000;

json answer(const std::string& anthropic_body) {
  bool understood = false;
  auto body = translate_answer_body(anthropic_body, kCreated, &understood);
  EXPECT_TRUE(understood) << body;
  return json::parse(body);
}

TEST(AnthropicAnswer, TextBlocksBecomeTheMessageContent) {
  auto completion = answer(R"({"id":"msg_1","type":"message","role":"assistant",
      "model":"claude-x","content":[{"type":"text","text":"Hello"},{"type":"text","text":", you"}],
      "stop_reason":"end_turn","stop_sequence":null,
      "usage":{"input_tokens":10,"output_tokens":3}})");
  EXPECT_EQ(completion["id"], "msg_1");
  EXPECT_EQ(completion["object"], "chat.completion");
  EXPECT_EQ(completion["created"], kCreated);
  EXPECT_EQ(completion["model"], "claude-x");
  const auto& choice = completion["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Hello, you");
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(completion["usage"],
            json::parse(R"({"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,
                            "prompt_tokens_details":{"cached_tokens":0}})"));
}

TEST(AnthropicAnswer, ToolUseBecomesToolCalls) {
  auto completion = answer(R"({"id":"msg_2","type":"message","role":"assistant","model":"c",
      "content":[{"type":"text","text":"Let me look."},
                 {"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Paris"}},
                 {"type":"tool_use","id":"toolu_2","name":"now","input":{}}],
      "stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":2}})");
  const auto& message = completion["choices"][0]["message"];
  EXPECT_EQ(message["content"], "Let me look.");
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "weather");
  EXPECT_EQ(json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(message["tool_calls"][1]["function"]["arguments"], "{}");
  EXPECT_EQ(completion["choices"][0]["finish_reason"], "tool_calls");
}

TEST(AnthropicAnswer, ToolUseAloneLeavesContentNull) {
  auto completion = answer(R"({"id":"m","type":"message","model":"c","content":[
      {"type":"tool_use","id":"t","name":"f","input":{"a":1}}],"stop_reason":"tool_use"})");
  EXPECT_TRUE(completion["choices"][0]["message"]["content"].is_null());
}

TEST(AnthropicAnswer, ThinkingBecomesReasoningContentWithoutItsSignature) {
  auto completion = answer(R"({"id":"m","type":"message","model":"c","content":[
      {"type":"thinking","thinking":"Two and two...","signature":"sig=="},
      {"type":"redacted_thinking","data":"opaque"},
      {"type":"text","text":"Four."}],"stop_reason":"end_turn"})");
  const auto& message = completion["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "Two and two...");
  EXPECT_EQ(message["content"], "Four.");
  EXPECT_EQ(completion.dump().find("sig=="), std::string::npos);
}

TEST(AnthropicAnswer, EachStopReason) {
  const std::pair<const char*, const char*> reasons[] = {
      {"end_turn", "stop"},       {"stop_sequence", "stop"},     {"max_tokens", "length"},
      {"tool_use", "tool_calls"}, {"refusal", "content_filter"}, {"pause_turn", "stop"}};
  for (const auto& [stop_reason, finish] : reasons) {
    SCOPED_TRACE(stop_reason);
    EXPECT_EQ(finish_reason(stop_reason), finish);
    auto completion =
        answer(std::string(R"({"id":"m","type":"message","model":"c",)") +
               R"("content":[{"type":"text","text":"x"}],"stop_reason":")" + stop_reason + "\"}");
    EXPECT_EQ(completion["choices"][0]["finish_reason"], finish);
  }
}

TEST(AnthropicAnswer, CachedTokensCountInThePrompt) {
  auto completion = answer(R"({"id":"m","type":"message","model":"c","content":[],
      "stop_reason":"end_turn","usage":{"input_tokens":5,"cache_read_input_tokens":100,
      "cache_creation_input_tokens":20,"output_tokens":7}})");
  EXPECT_EQ(completion["usage"],
            json::parse(R"({"prompt_tokens":125,"completion_tokens":7,"total_tokens":132,
                            "prompt_tokens_details":{"cached_tokens":100}})"));
}

TEST(AnthropicAnswer, AnErrorBodyTakesOpenAisShape) {
  auto error = json::parse(translate_error_body(
      R"({"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too big"}})"));
  EXPECT_EQ(error, json::parse(R"({"error":{"message":"max_tokens: too big",
      "type":"invalid_request_error","param":null,"code":null}})"));

  auto overloaded = json::parse(translate_error_body(
      R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})"));
  EXPECT_EQ(overloaded["error"]["type"], "server_error");
  EXPECT_EQ(overloaded["error"]["code"], "overloaded");
  EXPECT_EQ(overloaded["error"]["message"], "Overloaded");

  auto too_long = json::parse(translate_error_body(
      R"({"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}})"));
  EXPECT_EQ(too_long["error"]["code"], "context_length_exceeded");

  auto rate = json::parse(translate_error_body(
      R"({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}})"));
  EXPECT_EQ(rate["error"]["type"], "rate_limit_error");
}

TEST(AnthropicAnswer, AnErrorReachingBodyIsTranslatedToo) {
  auto error = json::parse(translate_answer_body(
      R"({"type":"error","error":{"type":"authentication_error","message":"bad key"}})", kCreated));
  EXPECT_EQ(error["error"]["type"], "authentication_error");
  EXPECT_EQ(error["error"]["message"], "bad key");
}

TEST(AnthropicAnswer, AnAnswerNotUnderstoodIsAnErrorAndABadGateway) {
  AnswerTranslator translator(kCreated);
  std::string out;
  translator.body("<html>502 Bad Gateway</html>", out);
  auto error = json::parse(out);
  EXPECT_EQ(error["error"]["type"], "server_error");
  EXPECT_NE(error["error"]["message"].get<std::string>().find("<html>"), std::string::npos);
  EXPECT_EQ(translator.status(200), 502u);
  EXPECT_EQ(translator.content_type("text/html"), "application/json");

  AnswerTranslator plain(kCreated);
  plain.body(R"({"id":"m","type":"message","model":"c","content":[]})", out);
  EXPECT_EQ(plain.status(200), 200u);
  EXPECT_EQ(plain.status(529), 529u);
  EXPECT_EQ(plain.content_type("text/event-stream; charset=utf-8"), "text/event-stream");
}

// ---------------------------------------------------------------------------
// Streams

// One event as Anthropic sends it: its payload on one data line (the
// literals below are wrapped for reading).
std::string sse(const std::string& type, std::string data) {
  std::replace(data.begin(), data.end(), '\n', ' ');
  return "event: " + type + "\ndata: " + data;
}

// What the client got, event by event.
struct Received {
  std::vector<std::string> payloads;  // each event's data, [DONE] included
  unsigned done = 0;
};

Received events_of(const std::string& out) {
  Received received;
  std::size_t start = 0;
  for (auto end = out.find("\n\n"); end != std::string::npos;
       start = end + 2, end = out.find("\n\n", start)) {
    auto event = out.substr(start, end - start);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    auto payload = event.substr(6);
    if (payload == "[DONE]") ++received.done;
    received.payloads.push_back(payload);
  }
  EXPECT_EQ(start, out.size()) << "every event ends in a blank line";
  return received;
}

// Reassembles a chat completion from its chunks, as an OpenAI client does.
struct Reassembled {
  std::string content, reasoning;
  std::vector<json> tool_calls;  // by index
  std::string finish_reason;
  json usage;
  std::set<std::string> ids, models;
  std::set<std::int64_t> created;
};

Reassembled reassemble(const Received& received) {
  Reassembled whole;
  for (const auto& payload : received.payloads) {
    if (payload == "[DONE]") continue;
    auto chunk = json::parse(payload);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    whole.ids.insert(chunk["id"].get<std::string>());
    whole.models.insert(chunk["model"].get<std::string>());
    whole.created.insert(chunk["created"].get<std::int64_t>());
    if (chunk.contains("usage")) whole.usage = chunk["usage"];
    if (chunk["choices"].empty()) continue;
    const auto& choice = chunk["choices"][0];
    const auto& delta = choice["delta"];
    if (delta.contains("content")) whole.content += delta["content"].get<std::string>();
    if (delta.contains("reasoning_content")) {
      whole.reasoning += delta["reasoning_content"].get<std::string>();
    }
    if (delta.contains("tool_calls")) {
      for (const auto& call : delta["tool_calls"]) {
        const auto index = call["index"].get<std::size_t>();
        if (index >= whole.tool_calls.size()) {
          EXPECT_EQ(index, whole.tool_calls.size()) << "indexes count up from 0";
          whole.tool_calls.push_back(call);
          continue;
        }
        auto& arguments = whole.tool_calls[index]["function"]["arguments"];
        arguments = arguments.get<std::string>() + call["function"]["arguments"].get<std::string>();
      }
    }
    if (!choice["finish_reason"].is_null()) whole.finish_reason = choice["finish_reason"];
  }
  return whole;
}

// Feeds `events` one by one, checking each is answered at once.
Received stream(const std::vector<std::string>& events, std::string* first = nullptr) {
  AnswerTranslator translator(kCreated);
  std::string all;
  for (std::size_t i = 0; i < events.size(); ++i) {
    std::string out;
    translator.event(events[i], out);
    if (i == 0 && first) *first = out;
    all += out;
  }
  std::string last;
  translator.end_of_events(last);
  EXPECT_EQ(last, "") << "the stream had ended with message_stop";
  return events_of(all);
}

const std::string kMessageStart =
    sse("message_start",
        R"({"type":"message_start","message":{"id":"msg_s","type":"message","role":"assistant",
        "model":"claude-s","content":[],"stop_reason":null,
        "usage":{"input_tokens":25,"cache_read_input_tokens":10,"output_tokens":1}}})");

std::string text_delta(int index, const std::string& text) {
  return sse("content_block_delta",
             R"({"type":"content_block_delta","index":)" + std::to_string(index) +
                 R"(,"delta":{"type":"text_delta","text":)" + json(text).dump() + "}}");
}

std::string block_stop(int index) {
  return sse("content_block_stop",
             R"({"type":"content_block_stop","index":)" + std::to_string(index) + "}");
}

std::string message_end(const std::string& stop_reason, int output_tokens) {
  return sse("message_delta", R"({"type":"message_delta","delta":{"stop_reason":")" + stop_reason +
                                  R"(","stop_sequence":null},"usage":{"output_tokens":)" +
                                  std::to_string(output_tokens) + "}}");
}

const std::string kMessageStop = sse("message_stop", R"({"type":"message_stop"})");
const std::string kPing = sse("ping", R"({"type": "ping"})");

TEST(AnthropicStream, TextArrivesAsContentDeltas) {
  std::string first;
  auto received = stream(
      {kMessageStart,
       sse("content_block_start",
           R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"),
       kPing, text_delta(0, "Hel"), text_delta(0, "lo"), text_delta(0, " there"), block_stop(0),
       message_end("end_turn", 12), kMessageStop},
      &first);
  // The role chunk comes from message_start alone.
  auto first_events = events_of(first);
  ASSERT_EQ(first_events.payloads.size(), 1u);
  auto role = json::parse(first_events.payloads[0]);
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");

  EXPECT_EQ(received.done, 1u);
  EXPECT_EQ(received.payloads.back(), "[DONE]");
  auto whole = reassemble(received);
  EXPECT_EQ(whole.content, "Hello there");
  EXPECT_EQ(whole.finish_reason, "stop");
  EXPECT_EQ(whole.ids, std::set<std::string>{"msg_s"});
  EXPECT_EQ(whole.models, std::set<std::string>{"claude-s"});
  EXPECT_EQ(whole.created, std::set<std::int64_t>{kCreated});
  EXPECT_EQ(whole.usage, json::parse(R"({"prompt_tokens":35,"completion_tokens":12,
      "total_tokens":47,"prompt_tokens_details":{"cached_tokens":10}})"));
  // The usage chunk is usage only, and comes just before [DONE].
  auto usage_chunk = json::parse(received.payloads[received.payloads.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_TRUE(usage_chunk.contains("usage"));
}

TEST(AnthropicStream, EachEventIsAnsweredAsItArrives) {
  AnswerTranslator translator(kCreated);
  std::string out;
  translator.event(kMessageStart, out);
  EXPECT_FALSE(out.empty());
  out.clear();
  translator.event(text_delta(0, "a"), out);
  EXPECT_NE(out.find(R"("content":"a")"), std::string::npos) << out;
  out.clear();
  translator.event(kPing, out);
  EXPECT_EQ(out, "") << "ping is dropped";
}

TEST(AnthropicStream, ToolArgumentsSplitAcrossManyPiecesReassemble) {
  const std::string arguments = R"({"city": "Paris", "units": "celsius", "days": [1, 2, 3]})";
  std::vector<std::string> events = {
      kMessageStart,
      sse("content_block_start",
          R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"),
      text_delta(0, "Checking."), block_stop(0),
      sse("content_block_start",
          R"({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_a","name":"weather","input":{}}})")};
  // Three characters a piece, the first one empty, as Anthropic sends them.
  events.push_back(sse(
      "content_block_delta",
      R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}})"));
  for (std::size_t at = 0; at < arguments.size(); at += 3) {
    events.push_back(sse(
        "content_block_delta",
        R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":)" +
            json(arguments.substr(at, 3)).dump() + "}}"));
  }
  events.push_back(block_stop(1));
  events.push_back(sse(
      "content_block_start",
      R"({"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_b","name":"now","input":{}}})"));
  events.push_back(sse(
      "content_block_delta",
      R"({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{}"}})"));
  events.push_back(block_stop(2));
  events.push_back(message_end("tool_use", 40));
  events.push_back(kMessageStop);

  auto received = stream(events);
  EXPECT_EQ(received.done, 1u);
  auto whole = reassemble(received);
  EXPECT_EQ(whole.content, "Checking.");
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  EXPECT_EQ(whole.tool_calls[0]["index"], 0);
  EXPECT_EQ(whole.tool_calls[0]["id"], "toolu_a");
  EXPECT_EQ(whole.tool_calls[0]["type"], "function");
  EXPECT_EQ(whole.tool_calls[0]["function"]["name"], "weather");
  EXPECT_EQ(whole.tool_calls[0]["function"]["arguments"], arguments);
  EXPECT_EQ(whole.tool_calls[1]["index"], 1);
  EXPECT_EQ(whole.tool_calls[1]["id"], "toolu_b");
  EXPECT_EQ(whole.tool_calls[1]["function"]["arguments"], "{}");
  EXPECT_EQ(whole.finish_reason, "tool_calls");
  // Many argument pieces, each a chunk of its own.
  EXPECT_GT(received.payloads.size(), arguments.size() / 3);
}

TEST(AnthropicStream, ThinkingThenText) {
  std::string first;
  auto received = stream(
      {kMessageStart,
       sse("content_block_start",
           R"({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}})"),
       sse("content_block_delta",
           R"({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me "}})"),
       sse("content_block_delta",
           R"({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"think."}})"),
       sse("content_block_delta",
           R"({"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}})"),
       block_stop(0),
       sse("content_block_start",
           R"({"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}})"),
       text_delta(1, "Done."), block_stop(1), message_end("max_tokens", 9), kMessageStop},
      &first);
  EXPECT_EQ(events_of(first).payloads.size(), 1u) << "the role chunk is not held for thinking";
  auto whole = reassemble(received);
  EXPECT_EQ(whole.reasoning, "Let me think.");
  EXPECT_EQ(whole.content, "Done.");
  EXPECT_EQ(whole.finish_reason, "length");
  EXPECT_EQ(received.done, 1u);
  for (const auto& payload : received.payloads) {
    EXPECT_EQ(payload.find("SIG"), std::string::npos) << payload;
  }
}

TEST(AnthropicStream, AnErrorEventEndsTheStreamWithSluicesErrorEvent) {
  AnswerTranslator translator(kCreated);
  std::string out;
  translator.event(kMessageStart, out);
  translator.event(text_delta(0, "par"), out);
  out.clear();
  translator.event(
      sse("error",
          R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})"),
      out);
  auto received = events_of(out);
  ASSERT_EQ(received.payloads.size(), 1u);
  auto error = json::parse(received.payloads[0]);
  EXPECT_EQ(error["error"]["code"], "overloaded_error");
  EXPECT_EQ(error["error"]["message"], "Overloaded");
  std::string after;
  translator.event(kMessageStop, after);
  translator.end_of_events(after);
  EXPECT_EQ(after, "") << "no clean end after an error";
}

TEST(AnthropicStream, AStreamEndingBeforeMessageStopEndsInAnErrorNotDone) {
  AnswerTranslator translator(kCreated);
  std::string out;
  translator.event(kMessageStart, out);
  translator.event(text_delta(0, "cut"), out);
  translator.end_of_events(out);
  EXPECT_EQ(out.find("[DONE]"), std::string::npos);
  EXPECT_NE(out.find("stream_interrupted"), std::string::npos) << out;
}

TEST(AnthropicStream, DataSplitOverLinesAndUnknownEventsAreHandled) {
  AnswerTranslator translator(kCreated);
  std::string out;
  translator.event(kMessageStart, out);
  out.clear();
  translator.event(
      "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\r\n"
      "data: \"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}",
      out);
  EXPECT_NE(out.find(R"("content":"ok")"), std::string::npos) << out;
  out.clear();
  translator.event(sse("some_new_event", R"({"type":"some_new_event"})"), out);
  translator.event("data: not json", out);
  translator.event(": a comment", out);
  EXPECT_EQ(out, "");
}

}  // namespace
}  // namespace sluice::protocol::anthropic

// OpenAI chat completion answers translated to Anthropic Messages answers:
// whole messages, errors, and event streams fed one event at a time.

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "sluice/protocol/messages_answer.hpp"
#include "sluice/stream/sse_events.hpp"

namespace sluice::protocol::messages {
namespace {

using nlohmann::json;

json answer(const std::string& openai_body) {
  bool understood = false;
  auto body = translate_answer_body(openai_body, &understood);
  EXPECT_TRUE(understood) << body;
  return json::parse(body);
}

TEST(MessagesAnswer, ATextAnswerBecomesAMessage) {
  auto message = answer(R"({"id":"chatcmpl-1","object":"chat.completion","created":1,
      "model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},
      "finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,
      "total_tokens":15}})");
  EXPECT_EQ(message, json::parse(R"({"id":"msg_chatcmpl-1","type":"message","role":"assistant",
      "model":"gpt-x","content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn",
      "stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3,
      "cache_read_input_tokens":0}})"));
}

TEST(MessagesAnswer, AnIdWithAnthropicsPrefixIsKeptAsItIs) {
  auto message = answer(R"({"id":"msg_01abc","object":"chat.completion","model":"m",
      "choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]})");
  EXPECT_EQ(message["id"], "msg_01abc");
}

TEST(MessagesAnswer, ToolCallsBecomeToolUseBlocksAfterTheText) {
  auto message = answer(R"({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":"Let me look.","tool_calls":[
        {"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}},
        {"id":"call_2","type":"function","function":{"name":"now","arguments":""}}]},
      "finish_reason":"tool_calls"}]})");
  EXPECT_EQ(message["content"], json::parse(R"([{"type":"text","text":"Let me look."},
      {"type":"tool_use","id":"call_1","name":"weather","input":{"city":"Paris"}},
      {"type":"tool_use","id":"call_2","name":"now","input":{}}])"));
  EXPECT_EQ(message["stop_reason"], "tool_use");
}

TEST(MessagesAnswer, ToolCallsAloneMakeNoTextBlock) {
  auto message = answer(R"({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":null,"tool_calls":[
        {"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
      "finish_reason":"tool_calls"}]})");
  ASSERT_EQ(message["content"].size(), 1u);
  EXPECT_EQ(message["content"][0]["type"], "tool_use");
}

TEST(MessagesAnswer, ReasoningIsNotCarriedOver) {
  auto message = answer(R"({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":"Four.","reasoning_content":"Two and two..."},
      "finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":40,
      "completion_tokens_details":{"reasoning_tokens":35}}})");
  EXPECT_EQ(message["content"], json::parse(R"([{"type":"text","text":"Four."}])"));
  EXPECT_EQ(message.dump().find("Two and two"), std::string::npos);
  EXPECT_EQ(message["usage"]["output_tokens"], 40) << "reasoning still counts as output";
}

TEST(MessagesAnswer, TextPartsAndARefusal) {
  auto parts = answer(R"({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      "finish_reason":"stop"}]})");
  EXPECT_EQ(parts["content"], json::parse(R"([{"type":"text","text":"ab"}])"));
  auto refusal = answer(R"({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":null,"refusal":"I can't help with that."},
      "finish_reason":"stop"}]})");
  EXPECT_EQ(refusal["content"],
            json::parse(R"([{"type":"text","text":"I can't help with that."}])"));
  EXPECT_EQ(refusal["stop_reason"], "refusal");
}

TEST(MessagesAnswer, EachFinishReason) {
  const std::pair<const char*, const char*> reasons[] = {
      {"stop", "end_turn"},          {"length", "max_tokens"},      {"tool_calls", "tool_use"},
      {"function_call", "tool_use"}, {"content_filter", "refusal"}, {"something_new", "end_turn"}};
  for (const auto& [finish, stop] : reasons) {
    SCOPED_TRACE(finish);
    EXPECT_EQ(stop_reason(finish), stop);
    auto message =
        answer(std::string(R"({"id":"c","object":"chat.completion","model":"m","choices":[)") +
               R"({"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":")" +
               finish + "\"}]}");
    EXPECT_EQ(message["stop_reason"], stop);
    EXPECT_TRUE(message["stop_sequence"].is_null());
  }
}

TEST(MessagesAnswer, CachedPromptTokensAreCountedApart) {
  auto message = answer(R"({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],
      "usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127,
      "prompt_tokens_details":{"cached_tokens":100}}})");
  EXPECT_EQ(message["usage"], json::parse(R"({"input_tokens":20,"output_tokens":7,
      "cache_read_input_tokens":100})"));
}

TEST(MessagesAnswer, ArgumentsThatAreNoObjectAreNotUnderstoodUnlessCutByTheLimit) {
  for (const char* arguments : {R"(not json)", R"([1,2])", R"({\"city\": \"Par)"}) {
    SCOPED_TRACE(arguments);
    const std::string tool_call =
        std::string(R"({"id":"call_1","type":"function","function":{"name":"f","arguments":")") +
        arguments + "\"}}";
    const std::string body =
        R"({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":)"
        R"({"role":"assistant","content":null,"tool_calls":[)" +
        tool_call + R"(]},"finish_reason":")";
    bool understood = true;
    auto refused = json::parse(translate_answer_body(body + "tool_calls\"}]}", &understood));
    EXPECT_FALSE(understood);
    EXPECT_EQ(refused["type"], "error");
    EXPECT_EQ(refused["error"]["type"], "api_error");

    auto cut = answer(body + "length\"}]}");
    EXPECT_EQ(cut["content"][0]["input"], json::object());
    EXPECT_EQ(cut["stop_reason"], "max_tokens");
  }
}

TEST(MessagesAnswer, AnAnswerNotUnderstoodIsAnApiErrorQuotingIt) {
  for (const char* body : {"<html>502 Bad Gateway</html>", "{}", R"({"choices":[]})",
                           R"({"choices":[{"index":0}]})", "[1]"}) {
    SCOPED_TRACE(body);
    bool understood = true;
    auto error = json::parse(translate_answer_body(body, &understood));
    EXPECT_FALSE(understood);
    EXPECT_EQ(error["type"], "error");
    EXPECT_EQ(error["error"]["type"], "api_error");
    EXPECT_NE(error["error"]["message"].get<std::string>().find(body), std::string::npos);
  }
}

TEST(MessagesAnswer, ErrorTypesByStatus) {
  const std::pair<unsigned, const char*> types[] = {{400, "invalid_request_error"},
                                                    {401, "authentication_error"},
                                                    {403, "permission_error"},
                                                    {404, "not_found_error"},
                                                    {413, "request_too_large"},
                                                    {429, "rate_limit_error"},
                                                    {503, "overloaded_error"},
                                                    {529, "overloaded_error"},
                                                    {500, "api_error"},
                                                    {502, "api_error"},
                                                    {504, "api_error"},
                                                    {422, "invalid_request_error"},
                                                    {409, "invalid_request_error"},
                                                    {200, "api_error"}};
  for (const auto& [status, type] : types) {
    SCOPED_TRACE(status);
    EXPECT_EQ(error_type(status), type);
    auto error = json::parse(translate_error_body(
        R"({"error":{"message":"it failed","type":"whatever","param":null,"code":null}})", status));
    EXPECT_EQ(error,
              json({{"type", "error"}, {"error", {{"type", type}, {"message", "it failed"}}}}));
  }
}

TEST(MessagesAnswer, ErrorBodiesOfOtherShapes) {
  auto text = json::parse(translate_error_body("upstream exploded", 502));
  EXPECT_EQ(text["error"]["type"], "api_error");
  EXPECT_EQ(text["error"]["message"], "upstream exploded");
  auto bare = json::parse(translate_error_body(R"({"error":"no such model"})", 404));
  EXPECT_EQ(bare["error"]["message"], "no such model");
  EXPECT_EQ(bare["error"]["type"], "not_found_error");
  auto flat = json::parse(translate_error_body(
      R"({"object":"error","message":"bad input","type":"BadRequestError","code":400})", 400));
  EXPECT_EQ(flat["error"]["message"], "bad input");
  EXPECT_EQ(flat["error"]["type"], "invalid_request_error");
  auto empty = json::parse(translate_error_body("", 503));
  EXPECT_EQ(empty["error"]["type"], "overloaded_error");
  EXPECT_NE(empty["error"]["message"].get<std::string>().find("503"), std::string::npos);
  auto long_body = json::parse(translate_error_body(std::string(5000, 'x'), 500));
  EXPECT_LT(long_body["error"]["message"].get<std::string>().size(), 300u);
}

TEST(MessagesAnswer, AContextOverflowReadsAsAnthropicWordsIt) {
  auto error = json::parse(translate_error_body(
      R"({"error":{"message":"This model's maximum context length is 128000 tokens.",
          "type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}})",
      400));
  EXPECT_EQ(error["error"]["type"], "invalid_request_error");
  EXPECT_EQ(error["error"]["message"],
            "prompt is too long: This model's maximum context length is 128000 tokens.");
}

TEST(MessagesAnswer, ErrorBodyAndEventShapes) {
  EXPECT_EQ(json::parse(error_body("rate_limit_error", "slow \"down\"")),
            json::parse(R"({"type":"error","error":{"type":"rate_limit_error",
                "message":"slow \"down\""}})"));
  const auto event = error_event("overloaded_error", "Overloaded");
  EXPECT_EQ(event, "event: error\ndata: " + error_body("overloaded_error", "Overloaded") + "\n\n");
}

TEST(MessagesAnswer, AnErrorReachingTheAnswerBodyIsTypedByItself) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}})",
       "rate_limit_error"},
      {R"({"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}})",
       "rate_limit_error"},
      {R"({"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}})",
       "authentication_error"},
      {R"({"error":{"message":"bad","type":"invalid_request_error","param":"x","code":null}})",
       "invalid_request_error"},
      {R"({"error":{"message":"no model","type":"invalid_request_error","code":"model_not_found"}})",
       "not_found_error"},
      {R"({"error":{"message":"busy","type":"server_error","code":"overloaded"}})",
       "overloaded_error"},
      {R"({"error":{"message":"oops","type":"server_error","code":null}})", "api_error"},
      {R"({"error":{"message":"gone","type":"upstream_error","code":"stream_interrupted"}})",
       "api_error"},
      {R"({"object":"error","message":"bad input","type":"BadRequestError","code":400})",
       "api_error"},
  };
  for (const auto& [body, type] : cases) {
    SCOPED_TRACE(body);
    auto error = answer(body);
    EXPECT_EQ(error["type"], "error");
    EXPECT_EQ(error["error"]["type"], type);
    const auto parsed = json::parse(body);
    const auto& expected = parsed.contains("error") ? parsed["error"] : parsed;
    EXPECT_EQ(error["error"]["message"], expected["message"]);
  }
}

TEST(MessagesAnswer, TheTranslatorTypesAnErrorByTheStatusItWasTold) {
  AnswerTranslator told;
  EXPECT_EQ(told.status(404), 404u);
  std::string out;
  told.body(R"({"error":{"message":"nope","type":"invalid_request_error","code":null}})", out);
  EXPECT_EQ(json::parse(out)["error"]["type"], "not_found_error");
  EXPECT_EQ(told.content_type("application/json; charset=utf-8"), "application/json");

  // A failed attempt's body comes with no status: its shape decides.
  AnswerTranslator untold;
  untold.body(R"({"error":{"message":"slow","type":"rate_limit_error","code":null}})", out);
  EXPECT_EQ(json::parse(out)["error"]["type"], "rate_limit_error");
  EXPECT_EQ(untold.status(429), 429u);
}

TEST(MessagesAnswer, AnAnswerNotUnderstoodIsABadGateway) {
  AnswerTranslator translator;
  std::string out;
  translator.body("<html>oops</html>", out);
  auto error = json::parse(out);
  EXPECT_EQ(error["error"]["type"], "api_error");
  EXPECT_EQ(translator.status(200), 502u);
  EXPECT_EQ(translator.content_type("text/html"), "application/json");

  AnswerTranslator plain;
  plain.body(R"({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]})",
             out);
  EXPECT_EQ(json::parse(out)["type"], "message");
  EXPECT_EQ(plain.status(200), 200u);
  EXPECT_EQ(plain.content_type("text/event-stream; charset=utf-8"), "text/event-stream");
}

// ---------------------------------------------------------------------------
// Streams

// One OpenAI event: a chunk of the answer "chatcmpl-s" of model "gpt-s".
std::string chunk(const json& delta, const char* finish_reason = nullptr) {
  json chunk{{"id", "chatcmpl-s"},
             {"object", "chat.completion.chunk"},
             {"created", 1},
             {"model", "gpt-s"},
             {"choices",
              json::array({{{"index", 0},
                            {"delta", delta},
                            {"finish_reason", finish_reason ? json(finish_reason) : json()}}})}};
  return "data: " + chunk.dump();
}

const std::string kRoleChunk = chunk({{"role", "assistant"}, {"content", ""}});
const std::string kDone = "data: [DONE]";

std::string usage_chunk(int prompt, int cached, int completion) {
  json usage{{"prompt_tokens", prompt},
             {"completion_tokens", completion},
             {"total_tokens", prompt + completion},
             {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  return "data: " + json{{"id", "chatcmpl-s"},
                         {"object", "chat.completion.chunk"},
                         {"model", "gpt-s"},
                         {"choices", json::array()},
                         {"usage", usage}}
                        .dump();
}

std::string tool_start(int index, const std::string& id, const std::string& name) {
  return chunk(
      {{"tool_calls", json::array({{{"index", index},
                                    {"id", id},
                                    {"type", "function"},
                                    {"function", {{"name", name}, {"arguments", ""}}}}})}});
}

std::string tool_arguments(int index, const std::string& piece) {
  return chunk(
      {{"tool_calls", json::array({{{"index", index}, {"function", {{"arguments", piece}}}}})}});
}

struct Event {
  std::string name;
  json data;
};

// The client's events, each checked to be `event: NAME`, one data line and
// a blank line, its name the payload's type.
std::vector<Event> events_of(const std::string& out) {
  std::vector<Event> events;
  std::string_view rest = out;
  for (;;) {
    std::size_t event_end = 0;
    const auto end = stream::next_event_end(rest, event_end);
    if (end == std::string_view::npos) break;
    const auto text = rest.substr(0, event_end);
    EXPECT_EQ(end - event_end, 2u) << "events end in LF LF";
    const auto newline = text.find('\n');
    EXPECT_EQ(text.substr(0, 7), "event: ") << text;
    EXPECT_EQ(text.substr(newline + 1, 6), "data: ") << text;
    Event event{std::string(text.substr(7, newline - 7)),
                json::parse(text.substr(newline + 7), nullptr, false)};
    EXPECT_EQ(event.data["type"], event.name) << text;
    events.push_back(std::move(event));
    rest.remove_prefix(end);
  }
  EXPECT_TRUE(rest.empty()) << "every event ends in a blank line: " << rest;
  return events;
}

std::vector<std::string> names(const std::vector<Event>& events) {
  std::vector<std::string> names;
  for (const auto& event : events) names.push_back(event.name);
  return names;
}

// The stream's blocks keep Anthropic's rules: indexes from 0 up by one,
// each block started, given deltas, and stopped once, before the next.
void expect_well_formed(const std::vector<Event>& events) {
  std::int64_t open = -1;
  std::int64_t next = 0;
  bool stopped_message = false;
  for (const auto& event : events) {
    EXPECT_FALSE(stopped_message) << "nothing after message_stop";
    if (event.name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block starts while another is open";
      EXPECT_EQ(event.data["index"], next);
      open = next++;
    } else if (event.name == "content_block_delta") {
      EXPECT_EQ(event.data["index"], open);
    } else if (event.name == "content_block_stop") {
      EXPECT_EQ(event.data["index"], open);
      open = -1;
    } else if (event.name == "message_delta" || event.name == "message_stop") {
      EXPECT_EQ(open, -1) << "a block is left open at the message's end";
      stopped_message = event.name == "message_stop";
    }
  }
}

// Feeds `events` one by one; the client's events for each, in order.
std::vector<std::vector<Event>> stream_each(const std::vector<std::string>& events,
                                            std::string* end = nullptr) {
  EventTranslator translator;
  std::vector<std::vector<Event>> answered;
  for (const auto& event : events) {
    std::string out;
    translator.event(event, out);
    answered.push_back(events_of(out));
  }
  std::string last;
  translator.end_of_events(last);
  if (end) *end = last;
  return answered;
}

std::vector<Event> stream(const std::vector<std::string>& events) {
  std::string end;
  std::vector<Event> all;
  for (auto& some : stream_each(events, &end)) {
    for (auto& event : some) all.push_back(std::move(event));
  }
  EXPECT_EQ(end, "") << "the stream had ended with [DONE]";
  expect_well_formed(all);
  return all;
}

TEST(MessagesStream, TextArrivesAsTextDeltasOfOneBlock) {
  auto each = stream_each({kRoleChunk, chunk({{"content", "Hel"}}), chunk({{"content", "lo"}}),
                           chunk(json::object(), "stop"), usage_chunk(30, 10, 7), kDone});
  ASSERT_EQ(each.size(), 6u);
  // The role chunk alone starts the message, with no block yet.
  ASSERT_EQ(names(each[0]), std::vector<std::string>{"message_start"});
  EXPECT_EQ(each[0][0].data, json::parse(R"({"type":"message_start","message":{
      "id":"msg_chatcmpl-s","type":"message","role":"assistant","model":"gpt-s","content":[],
      "stop_reason":null,"stop_sequence":null,
      "usage":{"input_tokens":0,"output_tokens":0,"cache_read_input_tokens":0}}})"));
  ASSERT_EQ(names(each[1]),
            (std::vector<std::string>{"content_block_start", "content_block_delta"}));
  EXPECT_EQ(each[1][0].data, json::parse(R"({"type":"content_block_start","index":0,
      "content_block":{"type":"text","text":""}})"));
  EXPECT_EQ(each[1][1].data, json::parse(R"({"type":"content_block_delta","index":0,
      "delta":{"type":"text_delta","text":"Hel"}})"));
  ASSERT_EQ(names(each[2]), std::vector<std::string>{"content_block_delta"});
  EXPECT_EQ(each[2][0].data["delta"]["text"], "lo");
  ASSERT_EQ(names(each[3]), std::vector<std::string>{"content_block_stop"});
  EXPECT_EQ(each[3][0].data["index"], 0);
  EXPECT_TRUE(each[4].empty()) << "the usage waits for the end";
  ASSERT_EQ(names(each[5]), (std::vector<std::string>{"message_delta", "message_stop"}));
  EXPECT_EQ(each[5][0].data, json::parse(R"({"type":"message_delta",
      "delta":{"stop_reason":"end_turn","stop_sequence":null},
      "usage":{"input_tokens":20,"output_tokens":7,"cache_read_input_tokens":10}})"));
}

TEST(MessagesStream, ToolArgumentsPassFragmentByFragmentAsTheyArrive) {
  const std::string arguments = R"({"city": "Paris", "units": "celsius", "days": [1, 2, 3]})";
  std::vector<std::string> events = {kRoleChunk, chunk({{"content", "Checking."}}),
                                     tool_start(0, "call_a", "weather")};
  std::vector<std::string> pieces;
  for (std::size_t at = 0; at < arguments.size(); at += 3) {
    pieces.push_back(arguments.substr(at, 3));
    events.push_back(tool_arguments(0, pieces.back()));
  }
  events.push_back(tool_start(1, "call_b", "now"));
  events.push_back(tool_arguments(1, "{}"));
  events.push_back(chunk(json::object(), "tool_calls"));
  events.push_back(usage_chunk(50, 0, 40));
  events.push_back(kDone);

  auto each = stream_each(events);
  // Each fragment is answered at once by exactly one input_json_delta
  // carrying it, at the first tool's block.
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    SCOPED_TRACE(i);
    const auto& answered = each[3 + i];
    ASSERT_EQ(answered.size(), 1u);
    EXPECT_EQ(answered[0].data,
              json({{"type", "content_block_delta"},
                    {"index", 1},
                    {"delta", {{"type", "input_json_delta"}, {"partial_json", pieces[i]}}}}));
  }
  std::vector<Event> all;
  for (auto& some : each) all.insert(all.end(), some.begin(), some.end());
  expect_well_formed(all);
  EXPECT_EQ(names(all).front(), "message_start");

  // The blocks, in order: text at 0, the tools at 1 and 2.
  std::vector<json> starts;
  std::map<std::int64_t, std::string> partial;
  std::map<std::int64_t, int> stops;
  for (const auto& event : all) {
    if (event.name == "content_block_start") starts.push_back(event.data);
    if (event.name == "content_block_stop") ++stops[event.data["index"].get<std::int64_t>()];
    if (event.name == "content_block_delta" && event.data["delta"]["type"] == "input_json_delta") {
      partial[event.data["index"].get<std::int64_t>()] +=
          event.data["delta"]["partial_json"].get<std::string>();
    }
  }
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_EQ(starts[0]["content_block"]["type"], "text");
  EXPECT_EQ(starts[1], json::parse(R"({"type":"content_block_start","index":1,
      "content_block":{"type":"tool_use","id":"call_a","name":"weather","input":{}}})"));
  EXPECT_EQ(starts[2], json::parse(R"({"type":"content_block_start","index":2,
      "content_block":{"type":"tool_use","id":"call_b","name":"now","input":{}}})"));
  EXPECT_EQ(partial[1], arguments);
  EXPECT_EQ(partial[2], "{}");
  EXPECT_EQ(stops, (std::map<std::int64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  ASSERT_GE(all.size(), 2u);
  const auto& delta = all[all.size() - 2];
  EXPECT_EQ(delta.name, "message_delta");
  EXPECT_EQ(delta.data["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(delta.data["usage"]["output_tokens"], 40);
  EXPECT_EQ(delta.data["usage"]["input_tokens"], 50);
  EXPECT_EQ(all.back().name, "message_stop");
}

TEST(MessagesStream, AToolCallWhoseFirstChunkCarriesArgumentsStartsThenDeltas) {
  auto all =
      stream({kRoleChunk,
              chunk({{"tool_calls",
                      json::array({{{"index", 0},
                                    {"id", "call_1"},
                                    {"type", "function"},
                                    {"function", {{"name", "f"}, {"arguments", "{\"a\""}}}}})}}),
              tool_arguments(0, ":1}"), chunk(json::object(), "tool_calls"), kDone});
  EXPECT_EQ(names(all),
            (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                      "content_block_delta", "content_block_stop", "message_delta",
                                      "message_stop"}));
  EXPECT_EQ(all[2].data["delta"]["partial_json"], "{\"a\"");
  EXPECT_EQ(all[3].data["delta"]["partial_json"], ":1}");
}

TEST(MessagesStream, AToolCallWithoutAnIdGetsOneMadeUp) {
  auto all =
      stream({kRoleChunk,
              chunk({{"tool_calls", json::array({{{"index", 0}, {"function", {{"name", "f"}}}}})}}),
              chunk(json::object(), "tool_calls"), kDone});
  ASSERT_EQ(all[1].name, "content_block_start");
  EXPECT_EQ(all[1].data["content_block"]["id"], "toolu_msg_chatcmpl-s_0");
  EXPECT_EQ(all[1].data["content_block"]["name"], "f");
}

TEST(MessagesStream, ArgumentsOfAnEarlierToolAfterALaterOneBeganEndTheStreamInAnError) {
  std::string end;
  auto each = stream_each(
      {kRoleChunk, tool_start(0, "call_a", "f"), tool_arguments(0, "{"),
       tool_start(1, "call_b", "g"), tool_arguments(0, "}"), tool_arguments(1, "{}"), kDone},
      &end);
  ASSERT_EQ(names(each[4]), std::vector<std::string>{"error"});
  EXPECT_EQ(each[4][0].data["error"]["type"], "api_error");
  EXPECT_TRUE(each[5].empty() && each[6].empty()) << "the stream had ended";
  EXPECT_EQ(end, "");
}

TEST(MessagesStream, TextAfterAToolStartsANewBlock) {
  auto all = stream({kRoleChunk, tool_start(0, "call_a", "f"), tool_arguments(0, "{}"),
                     chunk({{"content", "done"}}), chunk(json::object(), "stop"), kDone});
  EXPECT_EQ(names(all), (std::vector<std::string>{
                            "message_start", "content_block_start", "content_block_delta",
                            "content_block_stop", "content_block_start", "content_block_delta",
                            "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(all[4].data["index"], 1);
  EXPECT_EQ(all[4].data["content_block"]["type"], "text");
}

TEST(MessagesStream, ReasoningIsNotCarriedOver) {
  auto each = stream_each({kRoleChunk, chunk({{"reasoning_content", "Let me think"}}),
                           chunk({{"reasoning_content", "..."}}), chunk({{"content", "Four."}}),
                           chunk(json::object(), "stop"), kDone});
  EXPECT_TRUE(each[1].empty());
  EXPECT_TRUE(each[2].empty());
  std::vector<Event> all;
  for (auto& some : each) all.insert(all.end(), some.begin(), some.end());
  expect_well_formed(all);
  for (const auto& event : all) {
    EXPECT_EQ(event.data.dump().find("think"), std::string::npos) << event.data;
  }
  EXPECT_EQ(all[1].data["index"], 0) << "the text is the first block";
}

TEST(MessagesStream, EachFinishReasonAsTheStopReason) {
  for (const auto& [finish, stop] : std::vector<std::pair<const char*, const char*>>{
           {"length", "max_tokens"}, {"content_filter", "refusal"}, {"stop", "end_turn"}}) {
    SCOPED_TRACE(finish);
    auto all =
        stream({kRoleChunk, chunk({{"content", "x"}}), chunk(json::object(), finish), kDone});
    EXPECT_EQ(all[all.size() - 2].data["delta"]["stop_reason"], stop);
  }
}

TEST(MessagesStream, ARefusalIsTextAndStopsAsARefusal) {
  auto all =
      stream({kRoleChunk, chunk({{"refusal", "I can't."}}), chunk(json::object(), "stop"), kDone});
  EXPECT_EQ(all[2].data["delta"]["text"], "I can't.");
  EXPECT_EQ(all[all.size() - 2].data["delta"]["stop_reason"], "refusal");
}

TEST(MessagesStream, DoneWithoutAFinishReasonOrAnyChunkStillEndsWellFormed) {
  auto all = stream({kRoleChunk, chunk({{"content", "x"}}), kDone});
  EXPECT_EQ(names(all),
            (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(all[4].data["delta"]["stop_reason"], "end_turn");
  EXPECT_EQ(all[4].data["usage"]["input_tokens"], 0);

  auto bare = stream({kDone});
  EXPECT_EQ(names(bare),
            (std::vector<std::string>{"message_start", "message_delta", "message_stop"}));
}

TEST(MessagesStream, AzuresPromptFilterChunkIsSkipped) {
  auto each = stream_each(
      {R"(data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]})",
       kRoleChunk, chunk({{"content", "x"}}), chunk(json::object(), "stop"), kDone});
  EXPECT_TRUE(each[0].empty());
  ASSERT_EQ(names(each[1]), std::vector<std::string>{"message_start"});
  EXPECT_EQ(each[1][0].data["message"]["id"], "msg_chatcmpl-s");
  EXPECT_EQ(each[1][0].data["message"]["model"], "gpt-s");
}

TEST(MessagesStream, AnErrorEventEndsTheStreamWithAnthropicsErrorEvent) {
  EventTranslator translator;
  std::string out;
  translator.event(kRoleChunk, out);
  translator.event(chunk({{"content", "par"}}), out);
  out.clear();
  // As sluice itself words a stream that broke (without its blank line).
  auto broken = stream::stream_error_event("The upstream stream was interrupted: reset",
                                           "stream_interrupted");
  ASSERT_TRUE(broken.ends_with("\n\n"));
  broken.resize(broken.size() - 2);
  translator.event(broken, out);
  auto events = events_of(out);
  ASSERT_EQ(names(events), std::vector<std::string>{"error"});
  EXPECT_EQ(events[0].data, json::parse(R"({"type":"error","error":{"type":"api_error",
      "message":"The upstream stream was interrupted: reset"}})"));
  std::string after;
  translator.event(kDone, after);
  translator.end_of_events(after);
  EXPECT_EQ(after, "") << "no clean end after an error";
}

TEST(MessagesStream, AnOverloadedErrorKeepsItsKind) {
  EventTranslator translator;
  std::string out;
  translator.event(
      R"(data: {"error":{"message":"busy","type":"server_error","code":"overloaded"}})", out);
  auto events = events_of(out);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data["error"]["type"], "overloaded_error");
}

TEST(MessagesStream, AStreamCutBeforeDoneEndsInAnErrorNotAMessageStop) {
  EventTranslator translator;
  std::string out;
  translator.event(kRoleChunk, out);
  translator.event(chunk({{"content", "cut"}}), out);
  std::string end;
  translator.end_of_events(end);
  auto events = events_of(end);
  ASSERT_EQ(names(events), std::vector<std::string>{"error"});
  EXPECT_EQ(events[0].data["error"]["type"], "api_error");
  EXPECT_EQ((out + end).find("message_stop"), std::string::npos);
  std::string again;
  translator.end_of_events(again);
  EXPECT_EQ(again, "") << "one error only";
}

TEST(MessagesStream, DataSplitOverLinesCommentsAndNoiseAreHandled) {
  EventTranslator translator;
  std::string out;
  translator.event(kRoleChunk, out);
  out.clear();
  translator.event(
      ": keep-alive\r\ndata: {\"id\":\"chatcmpl-s\",\"choices\":[{\"index\":0,\r\n"
      "data: \"delta\":{\"content\":\"ok\"}}]}",
      out);
  EXPECT_NE(out.find(R"("text":"ok")"), std::string::npos) << out;
  out.clear();
  translator.event("data: not json", out);
  translator.event(": a comment", out);
  translator.event("data: [1,2]", out);
  translator.event(R"(data: {"id":"x","choices":[{"index":1,"delta":{"content":"second"}}]})", out);
  EXPECT_EQ(out, "");
}

}  // namespace
}  // namespace sluice::protocol::messages

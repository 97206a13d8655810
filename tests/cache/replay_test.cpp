// Upstream answers into entries, entries back into JSON and SSE answers.
#include "sluice/cache/replay.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace sluice::cache {
namespace {

using json = nlohmann::json;

std::string event(const std::string& payload) { return "data: " + payload + "\n\n"; }

std::string chunk(const std::string& choices, const std::string& extra = "") {
  return event(R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,)"
               R"("model":"gpt-x","choices":)" +
               choices + extra + "}");
}

// The `data:` payloads of a rendered stream.
std::vector<std::string> payloads(const std::string& sse) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    auto end = sse.find("\n\n", pos);
    out.push_back(sse.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

TEST(FromEventStream, AssemblesContentRoleFinishReasonAndUsage) {
  std::string sse =
      chunk(
          R"([{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}])") +
      chunk(R"([{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}])") +
      // CRLF line ends and a comment line are SSE too.
      ": keep-alive\r\n\r\n" + "data: " +
      R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-x","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":null}]})" +
      "\r\n\r\n" + chunk(R"([{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}])") +
      chunk("[]", R"(,"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7})") +
      event("[DONE]");
  auto response = from_event_stream(sse, Endpoint::chat);
  ASSERT_TRUE(response.has_value());
  auto body = json::parse(response->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"], "chatcmpl-1");
  EXPECT_EQ(body["model"], "gpt-x");
  EXPECT_EQ(body["created"], 1700000000);
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello world");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
}

TEST(FromEventStream, MergesToolCallsByIndex) {
  std::string sse =
      chunk(
          R"([{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}])") +
      chunk(
          R"([{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}])") +
      chunk(
          R"([{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]},"finish_reason":null}])") +
      chunk(
          R"([{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":null}])") +
      chunk(R"([{"index":0,"delta":{},"finish_reason":"tool_calls"}])") + event("[DONE]");
  auto response = from_event_stream(sse, Endpoint::chat);
  ASSERT_TRUE(response.has_value());
  auto message = json::parse(response->body)["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][0]["id"], "call_a");
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(message["tool_calls"][1]["function"]["name"], "get_time");
}

TEST(FromEventStream, KeepsChoicesApart) {
  std::string sse =
      chunk(
          R"([{"index":0,"delta":{"role":"assistant","content":"A"},"finish_reason":null},{"index":1,"delta":{"role":"assistant","content":"B"},"finish_reason":null}])") +
      chunk(R"([{"index":1,"delta":{"content":"b"},"finish_reason":"stop"}])") +
      chunk(R"([{"index":0,"delta":{"content":"a"},"finish_reason":"length"}])") + event("[DONE]");
  auto body = json::parse(from_event_stream(sse, Endpoint::chat)->body);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Aa");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["message"]["content"], "Bb");
}

TEST(FromEventStream, RefusesStreamsThatAreNotWhole) {
  std::string start =
      chunk(R"([{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}])");
  std::string finish = chunk(R"([{"index":0,"delta":{},"finish_reason":"stop"}])");
  EXPECT_TRUE(from_event_stream(start + finish + event("[DONE]"), Endpoint::chat).has_value());
  EXPECT_FALSE(from_event_stream(start + finish, Endpoint::chat).has_value()) << "no [DONE]";
  EXPECT_FALSE(from_event_stream(start + "data: [DO", Endpoint::chat).has_value());
  EXPECT_FALSE(from_event_stream(start + event(R"({"error":{"message":"boom"}})") + event("[DONE]"),
                                 Endpoint::chat)
                   .has_value());
  EXPECT_FALSE(
      from_event_stream(start + "event: error\ndata: {}\n\n" + event("[DONE]"), Endpoint::chat)
          .has_value());
  EXPECT_FALSE(from_event_stream(start + "data: {not json\n\n" + event("[DONE]"), Endpoint::chat)
                   .has_value());
  EXPECT_FALSE(
      from_event_stream(
          chunk(
              R"([{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":"stop"}])") +
              event("[DONE]"),
          Endpoint::chat)
          .has_value())
      << "logprobs would be lost";
}

TEST(FromEventStream, AssemblesCompletions) {
  auto text_chunk = [](const std::string& text, const std::string& finish) {
    return event(
        R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":")" +
        text + R"(","logprobs":null,"finish_reason":)" + finish + "}]}");
  };
  auto response = from_event_stream(text_chunk("Once", "null") + text_chunk(" upon", "null") +
                                        text_chunk("", "\"stop\"") + event("[DONE]"),
                                    Endpoint::completions);
  ASSERT_TRUE(response.has_value());
  auto body = json::parse(response->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "Once upon");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
}

TEST(FromJsonBody, KeepsTheBodyAsItCameWhenItHasChoices) {
  std::string body =
      R"({"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]})";
  auto response = from_json_body(body, Endpoint::chat);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->body, body);
  EXPECT_FALSE(from_json_body(R"({"choices":[]})", Endpoint::chat).has_value());
  EXPECT_FALSE(from_json_body(R"({"error":{}})", Endpoint::chat).has_value());
  EXPECT_FALSE(from_json_body("{trunc", Endpoint::chat).has_value());
}

TEST(RenderEventStream, ReplaysAChatCompletionAsChunks) {
  CachedResponse cached{
      Endpoint::chat,
      R"({"id":"chatcmpl-9","object":"chat.completion","created":5,"model":"gpt-x","system_fingerprint":"fp",)"
      R"("choices":[{"index":0,"message":{"role":"assistant","content":"Hi there","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"stop"}],)"
      R"("usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})"};
  auto sse = render_event_stream(cached, /*include_usage=*/true).value();
  EXPECT_TRUE(sse.ends_with("data: [DONE]\n\n"));
  auto events = payloads(sse);
  ASSERT_EQ(events.size(), 4u) << sse;
  auto content = json::parse(events[0]);
  EXPECT_EQ(content["object"], "chat.completion.chunk");
  EXPECT_EQ(content["id"], "chatcmpl-9");
  EXPECT_EQ(content["model"], "gpt-x");
  EXPECT_EQ(content["system_fingerprint"], "fp");
  EXPECT_EQ(content["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(content["choices"][0]["delta"]["content"], "Hi there");
  EXPECT_EQ(content["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(content["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_TRUE(content["choices"][0]["finish_reason"].is_null());
  auto finish = json::parse(events[1]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(finish["choices"][0]["delta"], json::object());
  auto usage = json::parse(events[2]);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
  EXPECT_EQ(events[3], "[DONE]");

  EXPECT_EQ(payloads(render_event_stream(cached, false).value()).size(), 3u)
      << "no usage chunk unasked";
}

TEST(RenderEventStream, RoundTripsThroughAssembly) {
  CachedResponse cached{
      Endpoint::completions,
      R"({"id":"cmpl-2","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"abc","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}})"};
  auto again = from_event_stream(render_event_stream(cached, true).value(), Endpoint::completions);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(json::parse(again->body), json::parse(cached.body));
}

TEST(RenderEventStream, RefusesAnEntryWithFieldsOfTheWrongType) {
  CachedResponse odd{Endpoint::chat,
                     R"({"id":"x","choices":[{"index":"first","message":{"content":"a"}}]})"};
  EXPECT_FALSE(render_event_stream(odd, false).has_value());
  EXPECT_FALSE(from_event_stream(
                   event(R"({"id":"x","choices":[{"index":"first","delta":{"content":"a"}}]})") +
                       event("[DONE]"),
                   Endpoint::chat)
                   .has_value());
}

TEST(EmbeddingFromBody, TakesTheFirstVectorScaledToUnitLength) {
  auto vector = embedding_from_body(
      R"({"object":"list","data":[{"object":"embedding","index":0,"embedding":[3,4]}],"model":"e"})");
  ASSERT_EQ(vector.size(), 2u);
  EXPECT_FLOAT_EQ(vector[0], 0.6f);
  EXPECT_FLOAT_EQ(vector[1], 0.8f);
  EXPECT_TRUE(embedding_from_body(R"({"data":[]})").empty());
  EXPECT_TRUE(embedding_from_body(R"({"data":[{"embedding":"AAAA"}]})").empty());
  EXPECT_TRUE(embedding_from_body("not json").empty());
}

}  // namespace
}  // namespace sluice::cache

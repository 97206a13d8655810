// OpenAI requests translated to Anthropic and read back as OpenAI requests
// equal the originals field for field, where the mapping is total.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sluice/protocol/anthropic_request.hpp"

namespace sluice::protocol::anthropic {
namespace {

using nlohmann::json;

// An Anthropic Messages request read as the OpenAI request it stands for.
json back_interpreted(const json& anthropic) {
  json openai{{"model", anthropic["model"]}, {"max_tokens", anthropic["max_tokens"]}};
  json messages = json::array();
  if (anthropic.contains("system")) {
    messages.push_back({{"role", "system"}, {"content", anthropic["system"]}});
  }
  for (const auto& turn : anthropic["messages"]) {
    json text_parts = json::array();
    json tool_calls = json::array();
    for (const auto& block : turn["content"]) {
      if (block["type"] == "text") {
        text_parts.push_back({{"type", "text"}, {"text", block["text"]}});
      } else if (block["type"] == "image") {
        const auto& source = block["source"];
        const std::string url = source["type"] == "url"
                                    ? source["url"].get<std::string>()
                                    : "data:" + source["media_type"].get<std::string>() +
                                          ";base64," + source["data"].get<std::string>();
        text_parts.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
      } else if (block["type"] == "tool_use") {
        tool_calls.push_back(
            {{"id", block["id"]},
             {"type", "function"},
             {"function", {{"name", block["name"]}, {"arguments", block["input"].dump()}}}});
      } else if (block["type"] == "tool_result") {
        messages.push_back({{"role", "tool"},
                            {"tool_call_id", block["tool_use_id"]},
                            {"content", block["content"]}});
      }
    }
    if (text_parts.empty() && tool_calls.empty()) continue;
    json message{{"role", turn["role"]}};
    // One text part reads back as the plain string it came from.
    if (text_parts.size() == 1 && text_parts[0]["type"] == "text") {
      message["content"] = text_parts[0]["text"];
    } else if (!text_parts.empty()) {
      message["content"] = text_parts;
    } else {
      message["content"] = nullptr;
    }
    if (!tool_calls.empty()) message["tool_calls"] = tool_calls;
    messages.push_back(message);
  }
  openai["messages"] = messages;
  if (anthropic.contains("stop_sequences")) openai["stop"] = anthropic["stop_sequences"];
  for (const char* name : {"temperature", "top_p", "stream"}) {
    if (anthropic.contains(name)) openai[name] = anthropic[name];
  }
  if (anthropic.contains("metadata")) openai["user"] = anthropic["metadata"]["user_id"];
  if (anthropic.contains("tools")) {
    json tools = json::array();
    for (const auto& tool : anthropic["tools"]) {
      json function{{"name", tool["name"]}, {"parameters", tool["input_schema"]}};
      if (tool.contains("description")) function["description"] = tool["description"];
      tools.push_back({{"type", "function"}, {"function", function}});
    }
    openai["tools"] = tools;
  }
  if (anthropic.contains("tool_choice")) {
    const auto& choice = anthropic["tool_choice"];
    if (choice["type"] == "auto") openai["tool_choice"] = "auto";
    if (choice["type"] == "any") openai["tool_choice"] = "required";
    if (choice["type"] == "none") openai["tool_choice"] = "none";
    if (choice["type"] == "tool") {
      openai["tool_choice"] = {{"type", "function"}, {"function", {{"name", choice["name"]}}}};
    }
    if (choice.value("disable_parallel_tool_use", false)) openai["parallel_tool_calls"] = false;
  }
  return openai;
}

// Requests whose every field maps one to one (arguments in their compact
// form, messages already alternating, max_tokens given).
const char* const kRequests[] = {
    R"({"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]})",
    R"({"model":"m","max_tokens":10,"messages":[{"role":"system","content":"be brief"},
        {"role":"user","content":"hi"},{"role":"assistant","content":"hello"},
        {"role":"user","content":"bye"}],"stop":["x","y"],"temperature":0.2,"top_p":0.5,
        "user":"someone","stream":true})",
    R"({"model":"m","max_tokens":300,"messages":[{"role":"user","content":[
        {"type":"text","text":"what is this?"},
        {"type":"image_url","image_url":{"url":"https://x.test/a.png"}},
        {"type":"image_url","image_url":{"url":"data:image/jpeg;base64,/9j/4AAQ"}}]}]})",
    R"({"model":"m","max_tokens":50,"messages":[{"role":"user","content":"weather?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
          "function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"sunny"}],
        "tools":[{"type":"function","function":{"name":"weather","description":"Gets it",
          "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
        "tool_choice":{"type":"function","function":{"name":"weather"}}})",
    R"({"model":"m","max_tokens":50,"messages":[{"role":"user","content":"go"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
        "tool_choice":"required","parallel_tool_calls":false})",
};

TEST(AnthropicRoundTrip, TotalMappingsReadBackFieldForField) {
  for (const char* request : kRequests) {
    SCOPED_TRACE(request);
    auto translated = translate_chat_request(request);
    ASSERT_TRUE(translated.ok()) << translated.error().to_json();
    EXPECT_EQ(back_interpreted(json::parse(translated.value())), json::parse(request));
  }
}

}  // namespace
}  // namespace sluice::protocol::anthropic

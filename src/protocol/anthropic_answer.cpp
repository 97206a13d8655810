#include "sluice/protocol/anthropic_answer.hpp"

#include <nlohmann/json.hpp>

#include "sluice/openai/api_error.hpp"
#include "sluice/protocol/json_fields.hpp"
#include "sluice/stream/sse_events.hpp"

namespace sluice::protocol::anthropic {

namespace {

using nlohmann::json;
using namespace std::string_view_literals;

using json_fields::count_field;
using json_fields::dump;
using json_fields::field;
using json_fields::text_field;

// OpenAI's usage for Anthropic's token counts: Anthropic counts cached
// prompt tokens apart from input_tokens, OpenAI counts them in.
json openai_usage(std::uint64_t input, std::uint64_t cache_read, std::uint64_t cache_creation,
                  std::uint64_t output) {
  const auto prompt = input + cache_read + cache_creation;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", output},
          {"total_tokens", prompt + output},
          {"prompt_tokens_details", {{"cached_tokens", cache_read}}}};
}

// OpenAI's error type and code for Anthropic's error type: most names are
// the same; Anthropic's own failures are OpenAI's server_error.
std::pair<std::string, std::string> openai_error_kind(std::string_view type) {
  if (type == "api_error") return {"server_error", ""};
  if (type == "overloaded_error") return {"server_error", "overloaded"};
  if (type == "request_too_large") return {"invalid_request_error", "request_too_large"};
  if (type.empty()) return {"server_error", ""};
  return {std::string(type), ""};
}

std::string openai_error(std::string message, std::string_view anthropic_type) {
  auto [type, code] = openai_error_kind(anthropic_type);
  ApiError error{502, std::move(message), std::move(type), "", std::move(code)};
  return error.to_json();
}

std::string not_understood(std::string_view body) {
  constexpr std::size_t kQuoted = 200;
  return openai_error(
      "The upstream's answer was not understood: " + std::string(body.substr(0, kQuoted)), "");
}

// The error of an Anthropic error object ({"type":"error","error":{...}}),
// or null when it is none.
const json* error_of(const json& answer) {
  if (text_field(answer, "type") != "error") return nullptr;
  const auto* error = field(answer, "error");
  return error && error->is_object() ? error : nullptr;
}

std::string translate_error(const json& error) {
  const auto message = text_field(error, "message");
  // Anthropic's words for a prompt over the context window: OpenAI's code
  // for it lets clients (and the router's fallbacks) recognise it.
  if (message.starts_with("prompt is too long")) {
    return ApiError{400, std::string(message), "invalid_request_error", "",
                    "context_length_exceeded"}
        .to_json();
  }
  return openai_error(std::string(message), text_field(error, "type"));
}

}  // namespace

std::string_view finish_reason(std::string_view stop_reason) {
  if (stop_reason == "max_tokens") return "length";
  if (stop_reason == "tool_use") return "tool_calls";
  if (stop_reason == "refusal") return "content_filter";
  return "stop";
}

std::string translate_error_body(std::string_view anthropic_body) {
  const auto answer = json::parse(anthropic_body, nullptr, false);
  if (const auto* error = answer.is_discarded() ? nullptr : error_of(answer)) {
    return translate_error(*error);
  }
  return not_understood(anthropic_body);
}

std::string translate_answer_body(std::string_view anthropic_body, std::int64_t created,
                                  bool* understood) {
  if (understood) *understood = true;
  const auto answer = json::parse(anthropic_body, nullptr, false);
  if (answer.is_discarded()) {
    if (understood) *understood = false;
    return not_understood(anthropic_body);
  }
  if (const auto* error = error_of(answer)) return translate_error(*error);
  const auto* content = field(answer, "content");
  if (text_field(answer, "type") != "message" || !content || !content->is_array()) {
    if (understood) *understood = false;
    return not_understood(anthropic_body);
  }

  std::string text, reasoning;
  bool has_text = false;
  json tool_calls = json::array();
  for (const auto& block : *content) {
    const auto type = text_field(block, "type");
    if (type == "text") {
      text += text_field(block, "text");
      has_text = true;
    } else if (type == "thinking") {
      // The signature is dropped: an OpenAI client has nowhere to keep it,
      // so this path cannot hand thinking back to Anthropic on a later turn.
      reasoning += text_field(block, "thinking");
    } else if (type == "tool_use") {
      const auto* input = field(block, "input");
      tool_calls.push_back(
          {{"id", text_field(block, "id")},
           {"type", "function"},
           {"function",
            {{"name", text_field(block, "name")}, {"arguments", input ? dump(*input) : "{}"}}}});
    }
    // redacted_thinking carries nothing readable; other block types have no
    // chat completion counterpart.
  }
  json message{{"role", "assistant"}, {"content", has_text ? json(text) : json(nullptr)}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) message["tool_calls"] = std::move(tool_calls);

  const json no_usage = json::object();
  const auto* usage = field(answer, "usage");
  const auto& counts = usage ? *usage : no_usage;
  json completion = json::object();
  completion["id"] = text_field(answer, "id");
  completion["object"] = "chat.completion";
  completion["created"] = created;
  completion["model"] = text_field(answer, "model");
  completion["choices"] =
      json::array({{{"index", 0},
                    {"message", std::move(message)},
                    {"logprobs", nullptr},
                    {"finish_reason", finish_reason(text_field(answer, "stop_reason"))}}});
  completion["usage"] = openai_usage(
      count_field(counts, "input_tokens"), count_field(counts, "cache_read_input_tokens"),
      count_field(counts, "cache_creation_input_tokens"), count_field(counts, "output_tokens"));
  return dump(completion);
}

// ---------------------------------------------------------------------------
// Events

void EventTranslator::take_usage(const json& usage) {
  // message_start carries the prompt's counts; message_delta the output's so
  // far (cumulative), and may repeat the prompt's.
  if (field(usage, "input_tokens")) input_tokens_ = count_field(usage, "input_tokens");
  if (field(usage, "cache_read_input_tokens")) {
    cache_read_tokens_ = count_field(usage, "cache_read_input_tokens");
  }
  if (field(usage, "cache_creation_input_tokens")) {
    cache_creation_tokens_ = count_field(usage, "cache_creation_input_tokens");
  }
  if (field(usage, "output_tokens")) output_tokens_ = count_field(usage, "output_tokens");
}

void EventTranslator::append_chunk(const json& delta, std::string_view finish,
                                   std::string& out) const {
  json chunk{{"id", id_},
             {"object", "chat.completion.chunk"},
             {"created", created_},
             {"model", model_},
             {"choices",
              json::array({{{"index", 0},
                            {"delta", delta},
                            {"logprobs", nullptr},
                            {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}}})}};
  out.append("data: "sv).append(dump(chunk)).append("\n\n"sv);
}

void EventTranslator::append_usage_chunk(std::string& out) const {
  json chunk{{"id", id_},
             {"object", "chat.completion.chunk"},
             {"created", created_},
             {"model", model_},
             {"choices", json::array()},
             {"usage", openai_usage(input_tokens_, cache_read_tokens_, cache_creation_tokens_,
                                    output_tokens_)}};
  out.append("data: "sv).append(dump(chunk)).append("\n\n"sv);
}

void EventTranslator::on_message_start(const json& message, std::string& out) {
  id_ = text_field(message, "id");
  model_ = text_field(message, "model");
  if (const auto* usage = field(message, "usage")) take_usage(*usage);
  // Sent at once: the client sees the answer begin even while the model
  // thinks before its first word.
  append_chunk({{"role", "assistant"}, {"content", ""}}, {}, out);
}

void EventTranslator::event(std::string_view upstream_event, std::string& out) {
  if (finished_) return;
  // The event's `event:` line repeats the payload's type, which is what is
  // read.
  const auto data = stream::event_data(upstream_event);
  if (data.empty()) return;
  const auto payload = json::parse(data, nullptr, false);
  // A payload that is no JSON says nothing the client could use.
  if (payload.is_discarded() || !payload.is_object()) return;
  const auto type = text_field(payload, "type");

  if (type == "message_start") {
    if (const auto* message = field(payload, "message")) on_message_start(*message, out);
  } else if (type == "content_block_start") {
    const auto* block = field(payload, "content_block");
    if (!block) return;
    const auto block_type = text_field(*block, "type");
    if (block_type == "tool_use") {
      const unsigned index = tool_blocks_++;
      if (const auto* at = field(payload, "index"); at && at->is_number_integer()) {
        tool_indexes_[at->get<std::int64_t>()] = index;
      }
      append_chunk({{"tool_calls",
                     json::array({{{"index", index},
                                   {"id", text_field(*block, "id")},
                                   {"type", "function"},
                                   {"function",
                                    {{"name", text_field(*block, "name")}, {"arguments", ""}}}}})}},
                   {}, out);
    } else if (block_type == "text" && !text_field(*block, "text").empty()) {
      append_chunk({{"content", text_field(*block, "text")}}, {}, out);
    }
  } else if (type == "content_block_delta") {
    const auto* delta = field(payload, "delta");
    if (!delta) return;
    const auto delta_type = text_field(*delta, "type");
    if (delta_type == "text_delta") {
      append_chunk({{"content", text_field(*delta, "text")}}, {}, out);
    } else if (delta_type == "thinking_delta") {
      append_chunk({{"reasoning_content", text_field(*delta, "thinking")}}, {}, out);
    } else if (delta_type == "input_json_delta") {
      const auto* at = field(payload, "index");
      if (!at || !at->is_number_integer()) return;
      const auto found = tool_indexes_.find(at->get<std::int64_t>());
      const auto piece = text_field(*delta, "partial_json");
      if (found == tool_indexes_.end() || piece.empty()) return;
      append_chunk(
          {{"tool_calls",
            json::array({{{"index", found->second}, {"function", {{"arguments", piece}}}}})}},
          {}, out);
    }
    // signature_delta: see translate_answer_body on signatures.
  } else if (type == "message_delta") {
    if (const auto* usage = field(payload, "usage")) take_usage(*usage);
    const auto* delta = field(payload, "delta");
    if (delta && field(*delta, "stop_reason")) {
      append_chunk(json::object(), finish_reason(text_field(*delta, "stop_reason")), out);
    }
  } else if (type == "message_stop") {
    // Always sent: the gateway reads it for budgets and the access log, and
    // strips it when the client did not ask for usage.
    append_usage_chunk(out);
    out.append("data: [DONE]\n\n"sv);
    finished_ = true;
  } else if (type == "error") {
    const auto* error = field(payload, "error");
    const json none = json::object();
    const auto& what = error ? *error : none;
    out.append(stream::stream_error_event(
        text_field(what, "message"),
        text_field(what, "type").empty() ? "upstream_error" : text_field(what, "type")));
    finished_ = true;
  }
  // ping, content_block_stop and event types yet unknown: nothing to send.
}

void EventTranslator::end_of_events(std::string& out) {
  if (finished_) return;
  finished_ = true;
  out.append(stream::stream_error_event("The upstream stream ended before message_stop.",
                                        "stream_interrupted"));
}

// ---------------------------------------------------------------------------
// The relay's translator

unsigned AnswerTranslator::status(unsigned upstream_status) {
  // A success the gateway could not read is the upstream's failure.
  return not_understood_ && upstream_status < 300 ? 502 : upstream_status;
}

std::string_view AnswerTranslator::content_type(std::string_view upstream_type) {
  return upstream_type.starts_with("text/event-stream") ? "text/event-stream"sv
                                                        : "application/json"sv;
}

void AnswerTranslator::event(std::string_view upstream_event, std::string& out) {
  events_.event(upstream_event, out);
}

void AnswerTranslator::end_of_events(std::string& out) { events_.end_of_events(out); }

void AnswerTranslator::body(std::string_view upstream_body, std::string& out) {
  bool understood = true;
  out = translate_answer_body(upstream_body, created_, &understood);
  not_understood_ = !understood;
}

}  // namespace sluice::protocol::anthropic

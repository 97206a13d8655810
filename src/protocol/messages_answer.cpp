#include "sluice/protocol/messages_answer.hpp"

#include <nlohmann/json.hpp>

#include "sluice/protocol/json_fields.hpp"
#include "sluice/stream/sse_events.hpp"

namespace sluice::protocol::messages {

namespace {

using nlohmann::json;
using namespace std::string_view_literals;
using json_fields::count_field;
using json_fields::dump;
using json_fields::field;
using json_fields::text_field;

constexpr std::size_t kQuoted = 200;  // bytes of a body not understood, quoted

std::string message_id(std::string_view openai_id) {
  return openai_id.starts_with("msg_") ? std::string(openai_id) : "msg_" + std::string(openai_id);
}

// Anthropic's usage for OpenAI's: Anthropic counts prompt tokens read from
// its cache apart from input_tokens, OpenAI counts them in.
json anthropic_usage(std::uint64_t prompt, std::uint64_t cached, std::uint64_t completion) {
  if (cached > prompt) cached = prompt;
  return {{"input_tokens", prompt - cached},
          {"output_tokens", completion},
          {"cache_read_input_tokens", cached}};
}

json usage_of(const json* usage) {
  if (!usage) return anthropic_usage(0, 0, 0);
  const auto* details = field(*usage, "prompt_tokens_details");
  return anthropic_usage(count_field(*usage, "prompt_tokens"),
                         details ? count_field(*details, "cached_tokens") : 0,
                         count_field(*usage, "completion_tokens"));
}

// The error of an OpenAI error answer ({"error":{...}}, or the older
// {"object":"error","message":...} of some OpenAI-compatible servers), or
// null when it is none.
const json* error_of(const json& answer) {
  if (text_field(answer, "object") == "error") return &answer;
  const auto* error = field(answer, "error");
  return error && error->is_object() ? error : nullptr;
}

// The error's message, in Anthropic's words where a client looks for them.
std::string error_message(const json& error) {
  std::string message(text_field(error, "message"));
  if (text_field(error, "code") == "context_length_exceeded") {
    return "prompt is too long: " + message;
  }
  return message;
}

// Anthropic's error type for an OpenAI error read without its status: from
// the error's type and code, as OpenAI and sluice word them.
std::string_view type_of(const json& error) {
  const auto type = text_field(error, "type");
  const auto code = text_field(error, "code");
  if (code == "overloaded") return "overloaded_error";
  if (code == "model_not_found" || code == "unknown_url" || type == "not_found_error") {
    return "not_found_error";
  }
  if (code == "request_too_large") return "request_too_large";
  if (type == "authentication_error" || code == "invalid_api_key") return "authentication_error";
  if (type == "permission_error") return "permission_error";
  if (type == "rate_limit_error" || type == "insufficient_quota" || type == "tokens" ||
      type == "requests" || code == "rate_limit_exceeded" || code == "insufficient_quota") {
    return "rate_limit_error";
  }
  if (type == "invalid_request_error") return "invalid_request_error";
  return "api_error";
}

std::string not_understood(std::string_view body) {
  return error_body("api_error", "The upstream's answer was not understood: " +
                                     std::string(body.substr(0, kQuoted)));
}

// A chat message's content (a string, or text parts) as text.
std::string text_of(const json* content) {
  if (!content) return {};
  if (content->is_string()) return content->get<std::string>();
  std::string text;
  if (content->is_array()) {
    for (const auto& part : *content) {
      if (text_field(part, "type") == "text") text += text_field(part, "text");
    }
  }
  return text;
}

void append_event(std::string& out, std::string_view name, const json& payload) {
  out.append("event: "sv).append(name).append("\ndata: "sv).append(dump(payload)).append("\n\n"sv);
}

}  // namespace

std::string_view error_type(unsigned status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
  }
}

std::string error_body(std::string_view type, std::string_view message) {
  return dump({{"type", "error"}, {"error", {{"type", type}, {"message", message}}}});
}

std::string error_event(std::string_view type, std::string_view message) {
  return "event: error\ndata: " + error_body(type, message) + "\n\n";
}

std::string_view stop_reason(std::string_view finish_reason) {
  if (finish_reason == "length") return "max_tokens";
  if (finish_reason == "tool_calls" || finish_reason == "function_call") return "tool_use";
  if (finish_reason == "content_filter") return "refusal";
  return "end_turn";
}

std::string translate_error_body(std::string_view openai_body, unsigned status) {
  const auto answer = json::parse(openai_body, nullptr, false);
  const auto* error = answer.is_discarded() ? nullptr : error_of(answer);
  const auto* error_text = answer.is_discarded() ? nullptr : field(answer, "error");
  std::string message;
  if (error) {
    message = error_message(*error);
  } else if (error_text && error_text->is_string()) {
    message = error_text->get<std::string>();  // some servers' shorter shape
  } else if (!openai_body.empty()) {
    message = std::string(openai_body.substr(0, kQuoted));
  } else {
    message = "The upstream answered " + std::to_string(status) + " without a body.";
  }
  return error_body(error_type(status), message);
}

std::string translate_answer_body(std::string_view openai_body, bool* understood) {
  if (understood) *understood = true;
  auto fail = [&] {
    if (understood) *understood = false;
    return not_understood(openai_body);
  };
  const auto answer = json::parse(openai_body, nullptr, false);
  if (answer.is_discarded()) return fail();
  if (const auto* error = error_of(answer)) {
    return error_body(type_of(*error), error_message(*error));
  }
  const auto* choices = field(answer, "choices");
  if (!choices || !choices->is_array() || choices->empty()) return fail();
  const auto& choice = (*choices)[0];
  const auto* message = field(choice, "message");
  if (!message || !message->is_object()) return fail();
  const auto finish = text_field(choice, "finish_reason");

  json content = json::array();
  // reasoning_content is not carried over: see the header.
  auto text = text_of(field(*message, "content"));
  const auto refusal = text_field(*message, "refusal");
  text += refusal;
  if (!text.empty()) content.push_back({{"type", "text"}, {"text", std::move(text)}});
  if (const auto* calls = field(*message, "tool_calls")) {
    if (!calls->is_array()) return fail();
    for (const auto& call : *calls) {
      const auto* function = field(call, "function");
      if (!function) return fail();
      const auto arguments = text_field(*function, "arguments");
      json input = arguments.empty() ? json::object() : json::parse(arguments, nullptr, false);
      if (input.is_discarded() || !input.is_object()) {
        if (finish != "length") return fail();
        input = json::object();
      }
      content.push_back({{"type", "tool_use"},
                         {"id", text_field(call, "id")},
                         {"name", text_field(*function, "name")},
                         {"input", std::move(input)}});
    }
  }

  json out = json::object();
  out["id"] = message_id(text_field(answer, "id"));
  out["type"] = "message";
  out["role"] = "assistant";
  out["model"] = text_field(answer, "model");
  out["content"] = std::move(content);
  out["stop_reason"] = refusal.empty() ? stop_reason(finish) : "refusal"sv;
  out["stop_sequence"] = nullptr;
  out["usage"] = usage_of(field(answer, "usage"));
  return dump(out);
}

// ---------------------------------------------------------------------------
// Events

void EventTranslator::take_usage(const json& usage) {
  prompt_tokens_ = count_field(usage, "prompt_tokens");
  const auto* details = field(usage, "prompt_tokens_details");
  cached_tokens_ = details ? count_field(*details, "cached_tokens") : 0;
  completion_tokens_ = count_field(usage, "completion_tokens");
}

void EventTranslator::start_message(const json& chunk, std::string& out) {
  started_ = true;
  id_ = message_id(text_field(chunk, "id"));
  // Usage is zero here: OpenAI reports it in its last chunk, which
  // message_delta carries. Sent at once, so the client sees the answer
  // begin even while a reasoning model thinks before its first word.
  append_event(out, "message_start",
               {{"type", "message_start"},
                {"message",
                 {{"id", id_},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", text_field(chunk, "model")},
                  {"content", json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", anthropic_usage(0, 0, 0)}}}});
}

void EventTranslator::stop_block(std::string& out) {
  if (open_ == Block::none) return;
  append_event(out, "content_block_stop", {{"type", "content_block_stop"}, {"index", open_index_}});
  open_ = Block::none;
  open_tool_ = -1;
}

void EventTranslator::add_text(std::string_view text, std::string& out) {
  if (text.empty()) return;  // the role chunk's "", say
  if (open_ != Block::text) {
    stop_block(out);
    open_ = Block::text;
    open_index_ = next_index_++;
    append_event(out, "content_block_start",
                 {{"type", "content_block_start"},
                  {"index", open_index_},
                  {"content_block", {{"type", "text"}, {"text", ""}}}});
  }
  append_event(out, "content_block_delta",
               {{"type", "content_block_delta"},
                {"index", open_index_},
                {"delta", {{"type", "text_delta"}, {"text", text}}}});
}

void EventTranslator::add_tool_call(const json& call, std::size_t position, std::string& out) {
  // OpenAI numbers each call; a server that does not numbers them by their
  // place in the chunk.
  const auto* at = field(call, "index");
  const std::int64_t index =
      at && at->is_number_integer() ? at->get<std::int64_t>() : static_cast<std::int64_t>(position);
  const json none = json::object();
  const auto* found_function = field(call, "function");
  const auto& function = found_function ? *found_function : none;
  if (!tool_blocks_.contains(index)) {
    stop_block(out);
    open_ = Block::tool_use;
    open_index_ = next_index_++;
    open_tool_ = index;
    tool_blocks_[index] = open_index_;
    // The id comes with a call's first fragment; one made up from the
    // message's stands in should a server leave it out, as the client
    // needs one to answer with the tool's result.
    std::string id(text_field(call, "id"));
    if (id.empty()) id = "toolu_" + id_ + "_" + std::to_string(index);
    append_event(out, "content_block_start",
                 {{"type", "content_block_start"},
                  {"index", open_index_},
                  {"content_block",
                   {{"type", "tool_use"},
                    {"id", id},
                    {"name", text_field(function, "name")},
                    {"input", json::object()}}}});
  }
  const auto arguments = text_field(function, "arguments");
  if (arguments.empty()) return;
  if (open_ != Block::tool_use || open_tool_ != index) {
    fail("api_error",
         "The upstream sent arguments of a tool call after a later content block began, "
         "which an Anthropic event stream cannot carry.",
         out);
    return;
  }
  append_event(out, "content_block_delta",
               {{"type", "content_block_delta"},
                {"index", open_index_},
                {"delta", {{"type", "input_json_delta"}, {"partial_json", arguments}}}});
}

void EventTranslator::on_chunk(const json& chunk, std::string& out) {
  const auto* choices = field(chunk, "choices");
  const bool has_choices = choices && choices->is_array() && !choices->empty();
  const auto* usage = field(chunk, "usage");
  // A chunk with neither (Azure's first, with its prompt filter results)
  // says nothing a Messages client reads.
  if (!has_choices && !usage) return;
  if (!started_) start_message(chunk, out);
  if (usage) take_usage(*usage);
  if (!has_choices) return;
  for (const auto& choice : *choices) {
    // One answer only: a Messages request cannot ask for more (no `n`).
    if (const auto* index = field(choice, "index"); index && *index != 0) continue;
    if (const auto* delta = field(choice, "delta")) {
      // reasoning_content is not carried over: see the header.
      add_text(text_field(*delta, "content"), out);
      if (const auto refusal = text_field(*delta, "refusal"); !refusal.empty()) {
        refused_ = true;
        add_text(refusal, out);
      }
      if (const auto* calls = field(*delta, "tool_calls"); calls && calls->is_array()) {
        for (std::size_t i = 0; i < calls->size() && !finished_; ++i) {
          add_tool_call((*calls)[i], i, out);
        }
        if (finished_) return;
      }
    }
    if (const auto* finish = field(choice, "finish_reason"); finish && finish->is_string()) {
      stop_reason_ = stop_reason(finish->get<std::string>());
      stop_block(out);
    }
  }
}

void EventTranslator::finish(std::string& out) {
  if (!started_) start_message(json::object(), out);
  stop_block(out);
  std::string_view reason = stop_reason_.empty() ? "end_turn"sv : std::string_view(stop_reason_);
  if (refused_ && reason == "end_turn") reason = "refusal";
  append_event(out, "message_delta",
               {{"type", "message_delta"},
                {"delta", {{"stop_reason", reason}, {"stop_sequence", nullptr}}},
                {"usage", anthropic_usage(prompt_tokens_, cached_tokens_, completion_tokens_)}});
  append_event(out, "message_stop", {{"type", "message_stop"}});
  finished_ = true;
}

void EventTranslator::fail(std::string_view type, std::string_view message, std::string& out) {
  out.append(error_event(type, message));
  finished_ = true;
}

void EventTranslator::event(std::string_view upstream_event, std::string& out) {
  if (finished_) return;
  const auto data = stream::event_data(upstream_event);
  if (data.empty()) return;
  if (data == "[DONE]") {
    finish(out);
    return;
  }
  const auto payload = json::parse(data, nullptr, false);
  // A payload that is no JSON object says nothing the client could use.
  if (payload.is_discarded() || !payload.is_object()) return;
  if (const auto* error = error_of(payload)) {
    fail(type_of(*error), error_message(*error), out);
    return;
  }
  on_chunk(payload, out);
}

void EventTranslator::end_of_events(std::string& out) {
  if (finished_) return;
  fail("api_error", "The upstream stream ended before [DONE].", out);
}

// ---------------------------------------------------------------------------
// The relay's translator

unsigned AnswerTranslator::status(unsigned upstream_status) {
  if (upstream_status_ == 0) upstream_status_ = upstream_status;
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
  if (upstream_status_ >= 400) {
    out = translate_error_body(upstream_body, upstream_status_);
    return;
  }
  bool understood = true;
  out = translate_answer_body(upstream_body, &understood);
  not_understood_ = !understood;
}

}  // namespace sluice::protocol::messages

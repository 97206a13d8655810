#include "sluice/cache/replay.hpp"

#include <map>
#include <nlohmann/json.hpp>

namespace sluice::cache {

namespace {

using json = nlohmann::json;

json parse_object(std::string_view text) {
  auto value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return value.is_object() ? value : json();
}

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The `data:` payloads of the dispatched events, in order; sets `saw_error`
// for an `event: error`.
std::vector<std::string> event_payloads(std::string_view sse, bool& saw_error) {
  std::vector<std::string> payloads;
  std::string data;
  bool has_data = false;
  std::string event_type;
  std::size_t pos = 0;
  while (pos < sse.size()) {
    auto end = sse.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) break;  // an unterminated last line is never dispatched
    std::string_view line = sse.substr(pos, end - pos);
    pos = end + 1;
    if (sse[end] == '\r' && pos < sse.size() && sse[pos] == '\n') ++pos;
    if (line.empty()) {
      if (event_type == "error") saw_error = true;
      if (has_data) payloads.push_back(std::move(data));
      data.clear();
      has_data = false;
      event_type.clear();
      continue;
    }
    if (line.front() == ':') continue;
    auto colon = line.find(':');
    std::string_view name = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
    if (name == "data") {
      if (has_data) data += '\n';
      data.append(value);
      has_data = true;
    } else if (name == "event") {
      event_type = value;
    }
  }
  return payloads;
}

void append_string(json& target, const char* field, const json& piece) {
  if (!piece.is_string()) return;
  if (!target.contains(field) || !target[field].is_string()) target[field] = "";
  target[field] = target[field].get<std::string>() + piece.get<std::string>();
}

// One choice of a chat stream, put together from its deltas.
struct ChatChoice {
  json message = json::object();
  std::map<std::int64_t, json> tool_calls;
  json finish_reason;
};

void merge_tool_call(std::map<std::int64_t, json>& calls, const json& delta) {
  auto index = delta.value("index", std::int64_t{0});
  auto& call = calls[index];
  if (call.is_null()) call = json{{"function", {{"name", ""}, {"arguments", ""}}}};
  for (const char* field : {"id", "type"}) {
    if (delta.contains(field) && delta[field].is_string()) call[field] = delta[field];
  }
  if (auto function = delta.find("function"); function != delta.end() && function->is_object()) {
    for (const char* field : {"name", "arguments"}) {
      if (function->contains(field)) append_string(call["function"], field, (*function)[field]);
    }
  }
}

bool has_logprobs(const json& choice) {
  auto found = choice.find("logprobs");
  return found != choice.end() && !found->is_null();
}

// Calls `take(index, choice)` for every choice of every chunk, in order;
// false when a choice is not an object or carries logprobs.
template <class Take>
bool for_each_choice(const std::vector<json>& chunks, Take take) {
  for (const auto& chunk : chunks) {
    auto list = chunk.find("choices");
    if (list == chunk.end() || !list->is_array()) continue;
    for (const auto& choice : *list) {
      if (!choice.is_object() || has_logprobs(choice)) return false;
      take(choice.value("index", std::int64_t{0}), choice);
    }
  }
  return true;
}

const json* finish_reason(const json& choice) {
  auto reason = choice.find("finish_reason");
  return reason == choice.end() || reason->is_null() ? nullptr : &*reason;
}

void merge_delta(ChatChoice& state, const json& delta) {
  for (const auto& [field, value] : delta.items()) {
    if (field == "tool_calls" && value.is_array()) {
      for (const auto& call : value) merge_tool_call(state.tool_calls, call);
    } else if (field == "content" || field == "refusal") {
      append_string(state.message, field.c_str(), value);
    } else if (field == "function_call" && value.is_object()) {
      for (const char* part : {"name", "arguments"}) {
        if (value.contains(part)) append_string(state.message["function_call"], part, value[part]);
      }
    } else if (!value.is_null()) {
      state.message[field] = value;
    }
  }
}

json assemble_chat(const std::vector<json>& chunks) {
  std::map<std::int64_t, ChatChoice> choices;
  bool whole = for_each_choice(chunks, [&](std::int64_t index, const json& choice) {
    auto& state = choices[index];
    if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
      merge_delta(state, *delta);
    }
    if (const json* reason = finish_reason(choice)) state.finish_reason = *reason;
  });
  if (!whole) return json();
  json out_choices = json::array();
  for (auto& [index, state] : choices) {
    auto& message = state.message;
    if (!message.contains("role")) message["role"] = "assistant";
    if (!message.contains("content")) message["content"] = nullptr;
    if (!state.tool_calls.empty()) {
      message["tool_calls"] = json::array();
      for (auto& [call_index, call] : state.tool_calls) message["tool_calls"].push_back(call);
    }
    out_choices.push_back({{"index", index},
                           {"message", std::move(message)},
                           {"logprobs", nullptr},
                           {"finish_reason", state.finish_reason}});
  }
  return out_choices;
}

json assemble_completions(const std::vector<json>& chunks) {
  std::map<std::int64_t, json> choices;
  bool whole = for_each_choice(chunks, [&](std::int64_t index, const json& choice) {
    auto& state = choices[index];
    if (state.is_null()) {
      state = {{"index", index}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    }
    if (choice.contains("text")) append_string(state, "text", choice["text"]);
    if (const json* reason = finish_reason(choice)) state["finish_reason"] = *reason;
  });
  if (!whole) return json();
  json out_choices = json::array();
  for (auto& [index, choice] : choices) out_choices.push_back(std::move(choice));
  return out_choices;
}

std::string event(const json& payload) { return "data: " + dump(payload) + "\n\n"; }

}  // namespace

std::optional<CachedResponse> from_json_body(std::string_view body, Endpoint endpoint) {
  auto parsed = parse_object(body);
  auto choices = parsed.find("choices");
  if (parsed.is_null() || choices == parsed.end() || !choices->is_array() || choices->empty()) {
    return std::nullopt;
  }
  return CachedResponse{endpoint, std::string(body)};
}

std::optional<CachedResponse> from_event_stream(std::string_view sse, Endpoint endpoint) {
  try {
    bool saw_error = false;
    bool saw_done = false;
    std::vector<json> chunks;
    for (auto& payload : event_payloads(sse, saw_error)) {
      if (saw_done) return std::nullopt;  // nothing follows [DONE]
      if (payload == "[DONE]") {
        saw_done = true;
        continue;
      }
      auto chunk = parse_object(payload);
      if (chunk.is_null() || (chunk.contains("error") && !chunk["error"].is_null())) {
        return std::nullopt;
      }
      chunks.push_back(std::move(chunk));
    }
    if (saw_error || !saw_done || chunks.empty()) return std::nullopt;

    json choices =
        endpoint == Endpoint::chat ? assemble_chat(chunks) : assemble_completions(chunks);
    if (!choices.is_array() || choices.empty()) return std::nullopt;
    const auto& first = chunks.front();
    json response = {{"id", first.value("id", "")},
                     {"object", endpoint == Endpoint::chat ? "chat.completion" : "text_completion"},
                     {"created", first.value("created", std::int64_t{0})},
                     {"model", first.value("model", "")},
                     {"choices", std::move(choices)}};
    for (const auto& chunk : chunks) {
      if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
        response["usage"] = *usage;
      }
      if (auto fingerprint = chunk.find("system_fingerprint");
          fingerprint != chunk.end() && !fingerprint->is_null()) {
        response["system_fingerprint"] = *fingerprint;
      }
    }
    return CachedResponse{endpoint, dump(response)};
  } catch (const json::exception&) {
    // A field of an unexpected type: not an answer to keep or replay.
    return std::nullopt;
  }
}

std::optional<std::string> render_event_stream(const CachedResponse& response, bool include_usage) {
  try {
    auto parsed = parse_object(response.body);
    const bool chat = response.endpoint == Endpoint::chat;
    json base = {{"id", parsed.value("id", "")},
                 {"object", chat ? "chat.completion.chunk" : "text_completion"},
                 {"created", parsed.value("created", std::int64_t{0})},
                 {"model", parsed.value("model", "")}};
    if (auto fingerprint = parsed.find("system_fingerprint"); fingerprint != parsed.end()) {
      base["system_fingerprint"] = *fingerprint;
    }
    std::string out;
    auto choices = parsed.value("choices", json::array());
    for (const auto& choice : choices) {
      if (!choice.is_object()) continue;
      auto index = choice.value("index", std::int64_t{0});
      json content_chunk = base;
      json finish_chunk = base;
      if (chat) {
        json delta = choice.value("message", json::object());
        if (auto calls = delta.find("tool_calls"); calls != delta.end() && calls->is_array()) {
          std::int64_t call_index = 0;
          for (auto& call : *calls) call["index"] = call_index++;
        }
        content_chunk["choices"] = json::array({{{"index", index},
                                                 {"delta", delta},
                                                 {"logprobs", nullptr},
                                                 {"finish_reason", nullptr}}});
        finish_chunk["choices"] =
            json::array({{{"index", index},
                          {"delta", json::object()},
                          {"logprobs", nullptr},
                          {"finish_reason", choice.value("finish_reason", json())}}});
      } else {
        content_chunk["choices"] = json::array({{{"index", index},
                                                 {"text", choice.value("text", "")},
                                                 {"logprobs", nullptr},
                                                 {"finish_reason", nullptr}}});
        finish_chunk["choices"] =
            json::array({{{"index", index},
                          {"text", ""},
                          {"logprobs", nullptr},
                          {"finish_reason", choice.value("finish_reason", json())}}});
      }
      out += event(content_chunk);
      out += event(finish_chunk);
    }
    if (include_usage) {
      if (auto usage = parsed.find("usage"); usage != parsed.end() && usage->is_object()) {
        json usage_chunk = base;
        usage_chunk["choices"] = json::array();
        usage_chunk["usage"] = *usage;
        out += event(usage_chunk);
      }
    }
    out += "data: [DONE]\n\n";
    return out;
  } catch (const json::exception&) {
    // A field of an unexpected type: not an answer to keep or replay.
    return std::nullopt;
  }
}

std::vector<float> embedding_from_body(std::string_view body) {
  auto parsed = parse_object(body);
  auto data = parsed.find("data");
  if (parsed.is_null() || data == parsed.end() || !data->is_array() || data->empty()) return {};
  const auto& first = (*data)[0];
  if (!first.is_object()) return {};
  auto embedding = first.find("embedding");
  if (embedding == first.end() || !embedding->is_array()) return {};
  std::vector<float> vector;
  vector.reserve(embedding->size());
  for (const auto& component : *embedding) {
    if (!component.is_number()) return {};
    vector.push_back(component.get<float>());
  }
  return unit_vector(vector);
}

}  // namespace sluice::cache

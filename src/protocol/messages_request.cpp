#include "sluice/protocol/messages_request.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "sluice/protocol/json_fields.hpp"

namespace sluice::protocol::messages {

namespace {

using json_fields::field;
using json_fields::invalid;
using json_fields::refused;
using json_fields::text_field;
using nlohmann::json;

ApiError unsupported(std::string param) {
  return refused(std::move(param), "is not supported by OpenAI's chat completions.");
}

std::string indexed(const std::string& at, std::size_t i) {
  return at + "[" + std::to_string(i) + "]";
}

// The fields that translate. Everything else is refused: Anthropic's
// fields beyond these (top_k, service_tier, container, mcp_servers,
// context_management...) change the answer in ways OpenAI cannot, and a
// field neither API knows is most likely one a newer Anthropic has.
std::optional<ApiError> check_fields(const json& body) {
  static constexpr std::string_view kTranslated[] = {
      "model", "messages", "system",   "max_tokens", "stop_sequences", "temperature",
      "top_p", "metadata", "thinking", "stream",     "tools",          "tool_choice"};
  for (const auto& [name, value] : body.items()) {
    if (value.is_null()) continue;
    bool translated = false;
    for (auto known : kTranslated) translated = translated || name == known;
    if (!translated) return unsupported(name);
  }
  return std::nullopt;
}

// The system prompt's text: a string, or text blocks joined by a blank
// line (their cache_control dropped: OpenAI caches prompt prefixes itself).
Result<std::string, ApiError> system_text(const json& system) {
  if (system.is_string()) return system.get<std::string>();
  if (!system.is_array()) return invalid("system", "must be a string or an array of text blocks.");
  std::string text;
  for (std::size_t i = 0; i < system.size(); ++i) {
    const auto& block = system[i];
    const auto at = indexed("system", i);
    if (text_field(block, "type") != "text") return unsupported(at + ".type");
    const auto* block_text = field(block, "text");
    if (!block_text || !block_text->is_string()) return invalid(at + ".text", "must be a string.");
    if (block_text->get_ref<const std::string&>().empty()) continue;
    if (!text.empty()) text += "\n\n";
    text += block_text->get_ref<const std::string&>();
  }
  return text;
}

// An image block as an image_url part: base64 bytes as a data: URL, a URL
// as it is. Files (source type "file") live in Anthropic's Files API,
// which OpenAI cannot read.
Result<json, ApiError> image_part(const json& block, const std::string& at) {
  const auto* source = field(block, "source");
  if (!source || !source->is_object()) return invalid(at + ".source", "must be an object.");
  const auto type = text_field(*source, "type");
  std::string url;
  if (type == "base64") {
    const auto* media_type = field(*source, "media_type");
    const auto* data = field(*source, "data");
    if (!media_type || !media_type->is_string() || !data || !data->is_string()) {
      return invalid(at + ".source", "must have a media_type and data.");
    }
    url = "data:" + media_type->get<std::string>() + ";base64," + data->get<std::string>();
  } else if (type == "url") {
    const auto* address = field(*source, "url");
    if (!address || !address->is_string()) return invalid(at + ".source.url", "must be a string.");
    url = address->get<std::string>();
  } else {
    return unsupported(at + ".source.type");
  }
  return json{{"type", "image_url"}, {"image_url", {{"url", std::move(url)}}}};
}

// A tool_result block's content as a tool message's text. OpenAI's tool
// messages carry text only, so an image (or any other block) in a result is
// refused rather than left out of what the model sees. is_error has no
// counterpart: the content, which says what went wrong, is what remains.
Result<std::string, ApiError> tool_result_text(const json& block, const std::string& at) {
  const auto* content = field(block, "content");
  if (!content) return std::string();
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) {
    return invalid(at + ".content", "must be a string or an array of text blocks.");
  }
  std::string text;
  for (std::size_t i = 0; i < content->size(); ++i) {
    const auto& part = (*content)[i];
    const auto part_at = indexed(at + ".content", i);
    const auto type = text_field(part, "type");
    if (type == "image") {
      return refused(part_at + ".type",
                     "is an image in a tool result, which OpenAI's tool messages cannot carry.");
    }
    if (type != "text") return unsupported(part_at + ".type");
    const auto* part_text = field(part, "text");
    if (!part_text || !part_text->is_string()) {
      return invalid(part_at + ".text", "must be a string.");
    }
    if (i > 0) text += "\n";
    text += part_text->get_ref<const std::string&>();
  }
  return text;
}

// A tool_use block as a tool call: its id kept, so that the tool_result
// answering it matches, and its input as the arguments' JSON text.
Result<json, ApiError> tool_call(const json& block, const std::string& at) {
  const auto* id = field(block, "id");
  const auto* name = field(block, "name");
  if (!id || !id->is_string() || !name || !name->is_string()) {
    return invalid(at, "must have an id and a name.");
  }
  const auto* input = field(block, "input");
  if (input && !input->is_object()) return invalid(at + ".input", "must be an object.");
  return json{
      {"id", *id},
      {"type", "function"},
      {"function", {{"name", *name}, {"arguments", input ? json_fields::dump(*input) : "{}"}}}};
}

// Appends the chat messages for one Messages turn: a user turn's tool
// results first, each a `tool` message, in their order (OpenAI wants them
// right after the assistant's tool calls), then the rest of the turn.
std::optional<ApiError> add_turn(const json& message, const std::string& at, json& out) {
  const auto role = text_field(message, "role");
  if (role != "user" && role != "assistant") {
    return invalid(at + ".role", "must be user or assistant.");
  }
  const bool assistant = role == "assistant";
  const auto* content = field(message, "content");
  if (!content) return invalid(at + ".content", "is required.");
  if (content->is_string()) {
    out.push_back({{"role", role}, {"content", *content}});
    return std::nullopt;
  }
  if (!content->is_array()) {
    return invalid(at + ".content", "must be a string or an array of content blocks.");
  }
  json parts = json::array();
  json tool_calls = json::array();
  for (std::size_t i = 0; i < content->size(); ++i) {
    const auto& block = (*content)[i];
    const auto block_at = indexed(at + ".content", i);
    const auto type = text_field(block, "type");
    if (type == "text") {
      const auto* text = field(block, "text");
      if (!text || !text->is_string()) return invalid(block_at + ".text", "must be a string.");
      parts.push_back({{"type", "text"}, {"text", *text}});
    } else if (type == "image" && !assistant) {
      auto part = image_part(block, block_at);
      if (!part) return part.error();
      parts.push_back(std::move(part.value()));
    } else if (type == "tool_use" && assistant) {
      auto call = tool_call(block, block_at);
      if (!call) return call.error();
      tool_calls.push_back(std::move(call.value()));
    } else if (type == "tool_result" && !assistant) {
      const auto* id = field(block, "tool_use_id");
      if (!id || !id->is_string()) return invalid(block_at + ".tool_use_id", "must be a string.");
      auto text = tool_result_text(block, block_at);
      if (!text) return text.error();
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", text.value()}});
    } else if ((type == "thinking" || type == "redacted_thinking") && assistant) {
      // Earlier thinking is dropped: OpenAI takes no reasoning back in a
      // conversation, and the signature that vouches for it means nothing
      // to OpenAI. The turn's text and tool calls still say what was done.
    } else {
      // Documents, search results, server tool blocks, and blocks in a turn
      // whose role cannot hold them.
      return unsupported(block_at + ".type");
    }
  }
  if (parts.empty() && tool_calls.empty()) return std::nullopt;
  json chat{{"role", role}};
  if (parts.empty()) {
    chat["content"] = nullptr;
  } else if (parts.size() == 1 && parts[0]["type"] == "text") {
    chat["content"] = parts[0]["text"];
  } else {
    chat["content"] = std::move(parts);
  }
  if (!tool_calls.empty()) chat["tool_calls"] = std::move(tool_calls);
  out.push_back(std::move(chat));
  return std::nullopt;
}

// Custom tools as functions. Server tools (web search, code execution, a
// computer, a text editor: any `type` but "custom") run at Anthropic, and
// an OpenAI upstream has none of them.
Result<json, ApiError> translate_tools(const json& tools) {
  if (!tools.is_array()) return invalid("tools", "must be an array.");
  json translated = json::array();
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const auto& tool = tools[i];
    const auto at = indexed("tools", i);
    if (!tool.is_object()) return invalid(at, "must be an object.");
    if (const auto* type = field(tool, "type"); type && *type != "custom") {
      return refused(at + ".type",
                     "names a server tool, which OpenAI's chat completions cannot run.");
    }
    const auto* name = field(tool, "name");
    if (!name || !name->is_string()) return invalid(at + ".name", "must be a string.");
    const auto* schema = field(tool, "input_schema");
    if (!schema || !schema->is_object()) return invalid(at + ".input_schema", "must be an object.");
    json function{{"name", *name}, {"parameters", *schema}};
    if (const auto* description = field(tool, "description")) {
      if (!description->is_string()) return invalid(at + ".description", "must be a string.");
      function["description"] = *description;
    }
    translated.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return translated;
}

// Sets tool_choice (and parallel_tool_calls) on `out`.
std::optional<ApiError> translate_tool_choice(const json& choice, json& out) {
  if (!choice.is_object()) return invalid("tool_choice", "must be an object.");
  const auto type = text_field(choice, "type");
  if (type == "auto") {
    out["tool_choice"] = "auto";
  } else if (type == "any") {
    out["tool_choice"] = "required";
  } else if (type == "none") {
    out["tool_choice"] = "none";
  } else if (type == "tool") {
    const auto* name = field(choice, "name");
    if (!name || !name->is_string()) return invalid("tool_choice.name", "must be a string.");
    out["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
  } else {
    return invalid("tool_choice.type", "must be auto, any, tool or none.");
  }
  if (const auto* serial = field(choice, "disable_parallel_tool_use")) {
    if (!serial->is_boolean()) {
      return invalid("tool_choice.disable_parallel_tool_use", "must be a boolean.");
    }
    if (serial->get<bool>()) out["parallel_tool_calls"] = false;
  }
  return std::nullopt;
}

// The reasoning_effort for `thinking`, or "" for none.
Result<std::string, ApiError> effort_for(const json& thinking) {
  if (!thinking.is_object()) return invalid("thinking", "must be an object.");
  const auto type = text_field(thinking, "type");
  if (type == "disabled") return std::string();
  if (type != "enabled") return invalid("thinking.type", "must be enabled or disabled.");
  const auto* budget = field(thinking, "budget_tokens");
  if (!budget || !budget->is_number_unsigned() || budget->get<std::uint64_t>() == 0) {
    return invalid("thinking.budget_tokens", "must be a positive integer.");
  }
  return std::string(reasoning_effort(budget->get<std::uint64_t>()));
}

}  // namespace

std::string_view reasoning_effort(std::uint64_t budget_tokens) {
  if (budget_tokens <= 1024) return "low";
  if (budget_tokens <= 8192) return "medium";
  return "high";
}

Result<std::string, ApiError> translate_messages_request(std::string_view anthropic_body) {
  const auto body = json::parse(anthropic_body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return ApiError::invalid_request("The request body is not a JSON object.");
  }
  if (auto error = check_fields(body)) return *error;

  json out = json::object();
  if (const auto* model = field(body, "model")) out["model"] = *model;

  json messages = json::array();
  if (const auto* system = field(body, "system")) {
    auto text = system_text(*system);
    if (!text) return text.error();
    if (!text.value().empty()) messages.push_back({{"role", "system"}, {"content", text.value()}});
  }
  const auto* turns = field(body, "messages");
  if (!turns || !turns->is_array()) return invalid("messages", "must be an array.");
  if (turns->empty()) return invalid("messages", "must hold at least one message.");
  for (std::size_t i = 0; i < turns->size(); ++i) {
    if (auto error = add_turn((*turns)[i], indexed("messages", i), messages)) return *error;
  }
  out["messages"] = std::move(messages);

  // Anthropic requires max_tokens, and so does this translation: a
  // default of the gateway's would decide the answer's length for the
  // client.
  const auto* max_tokens = field(body, "max_tokens");
  if (!max_tokens) {
    return ApiError::invalid_request("`max_tokens` is required.", "max_tokens",
                                     "missing_required_parameter");
  }
  if (!max_tokens->is_number_unsigned() || max_tokens->get<std::uint64_t>() == 0) {
    return invalid("max_tokens", "must be a positive integer.");
  }
  std::string effort;
  if (const auto* thinking = field(body, "thinking")) {
    auto translated = effort_for(*thinking);
    if (!translated) return translated.error();
    effort = std::move(translated.value());
  }
  if (effort.empty()) {
    out["max_tokens"] = *max_tokens;
  } else {
    out["reasoning_effort"] = effort;
    // OpenAI's reasoning models refuse max_tokens; every server that takes
    // reasoning_effort knows its newer name.
    out["max_completion_tokens"] = *max_tokens;
  }

  if (const auto* stop = field(body, "stop_sequences")) {
    if (!stop->is_array() ||
        !std::all_of(stop->begin(), stop->end(), [](const json& s) { return s.is_string(); })) {
      return invalid("stop_sequences", "must be an array of strings.");
    }
    if (!stop->empty()) out["stop"] = *stop;
  }
  for (const auto* name : {"temperature", "top_p"}) {
    if (const auto* value = field(body, name)) {
      if (!value->is_number()) return invalid(name, "must be a number.");
      out[name] = *value;
    }
  }
  if (const auto* metadata = field(body, "metadata")) {
    if (!metadata->is_object()) return invalid("metadata", "must be an object.");
    for (const auto& [name, value] : metadata->items()) {
      if (value.is_null()) continue;
      if (name != "user_id") return unsupported("metadata." + name);
      if (!value.is_string()) return invalid("metadata.user_id", "must be a string.");
      out["user"] = value;
    }
  }
  if (const auto* stream = field(body, "stream")) {
    if (!stream->is_boolean()) return invalid("stream", "must be a boolean.");
    if (stream->get<bool>()) {
      out["stream"] = true;
      // Anthropic's stream ends with the usage (message_delta); OpenAI's
      // has it only when asked for.
      out["stream_options"] = {{"include_usage", true}};
    }
  }
  if (const auto* tools = field(body, "tools")) {
    auto translated = translate_tools(*tools);
    if (!translated) return translated.error();
    if (!translated.value().empty()) out["tools"] = std::move(translated.value());
  }
  if (const auto* choice = field(body, "tool_choice")) {
    if (auto error = translate_tool_choice(*choice, out)) return *error;
  }
  return json_fields::dump(out);
}

}  // namespace sluice::protocol::messages

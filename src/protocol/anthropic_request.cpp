#include "sluice/protocol/anthropic_request.hpp"

#include <nlohmann/json.hpp>
#include <vector>

#include "sluice/protocol/json_fields.hpp"

namespace sluice::protocol::anthropic {

namespace {

using nlohmann::json;
using namespace std::string_view_literals;

using json_fields::field;
using json_fields::invalid;
using json_fields::refused;
using json_fields::text_field;

ApiError unsupported(std::string param) {
  return refused(std::move(param), "is not supported by provider anthropic.");
}

bool is_zero(const json& value) { return value.is_number() && value.get<double>() == 0.0; }

// The fields that translate, and the neutral values of those Anthropic has
// no counterpart for (a client may send a default explicitly). Everything
// else is refused.
std::optional<ApiError> check_fields(const json& body) {
  static constexpr std::string_view kTranslated[] = {
      "model", "messages", "max_tokens", "max_completion_tokens", "stop", "temperature", "top_p",
      "reasoning_effort", "user", "stream", "tools", "tool_choice", "parallel_tool_calls",
      // The gateway itself may ask for usage: the translated stream always
      // ends with it.
      "stream_options"};
  for (const auto& [name, value] : body.items()) {
    if (value.is_null()) continue;
    bool translated = false;
    for (auto known : kTranslated) translated = translated || name == known;
    if (translated) continue;
    const bool neutral =
        (name == "n" && value.is_number_integer() && value.get<std::int64_t>() == 1) ||
        ((name == "logprobs" || name == "store") && value.is_boolean() && !value.get<bool>()) ||
        ((name == "presence_penalty" || name == "frequency_penalty") && is_zero(value)) ||
        (name == "response_format" && text_field(value, "type") == "text");
    if (!neutral) return unsupported(name);
  }
  return std::nullopt;
}

// A message's text, from a string or an array of text parts (system,
// developer and tool messages carry nothing else).
Result<std::string, ApiError> text_of(const json& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return invalid(at, "must be a string or an array of text parts.");
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const auto* part_text = part.is_object() ? field(part, "text") : nullptr;
    if (!part_text || !part_text->is_string() || text_field(part, "type") != "text") {
      return refused(at + "[" + std::to_string(i) + "]", "must be a text part here.");
    }
    if (!text.empty()) text += "\n";
    text += part_text->get_ref<const std::string&>();
  }
  return text;
}

// An image_url part as an image block: a data: URL's bytes as a base64
// source, any other URL as a URL source.
Result<json, ApiError> image_block(const json& part, const std::string& at) {
  const auto* image = field(part, "image_url");
  const json* url = image && image->is_object() ? field(*image, "url") : image;
  if (!url || !url->is_string()) return invalid(at + ".image_url.url", "must be a string.");
  const auto& text = url->get_ref<const std::string&>();
  if (!text.starts_with("data:")) {
    return json{{"type", "image"}, {"source", {{"type", "url"}, {"url", text}}}};
  }
  constexpr auto kBase64 = ";base64,"sv;
  const auto marker = text.find(kBase64);
  if (marker == std::string::npos) {
    return refused(at + ".image_url.url", "must be a base64 data: URL for provider anthropic.");
  }
  return json{{"type", "image"},
              {"source",
               {{"type", "base64"},
                {"media_type", text.substr(5, marker - 5)},
                {"data", text.substr(marker + kBase64.size())}}}};
}

// A user or assistant message's content as content blocks.
Result<json, ApiError> content_blocks(const json& content, const std::string& at) {
  json blocks = json::array();
  if (content.is_string()) {
    // Anthropic refuses empty text blocks; an empty message says nothing.
    if (!content.get_ref<const std::string&>().empty()) {
      blocks.push_back({{"type", "text"}, {"text", content}});
    }
    return blocks;
  }
  if (!content.is_array()) return invalid(at, "must be a string or an array of parts.");
  for (std::size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const auto part_at = at + "[" + std::to_string(i) + "]";
    const auto type = text_field(part, "type");
    if (type == "text") {
      const auto* text = field(part, "text");
      if (!text || !text->is_string()) return invalid(part_at + ".text", "must be a string.");
      if (!text->get_ref<const std::string&>().empty()) {
        blocks.push_back({{"type", "text"}, {"text", *text}});
      }
    } else if (type == "image_url") {
      auto block = image_block(part, part_at);
      if (!block) return block.error();
      blocks.push_back(std::move(block.value()));
    } else {
      // Audio, files and refusals have no Messages counterpart here.
      return unsupported(part_at + ".type");
    }
  }
  return blocks;
}

// An assistant's tool calls as tool_use blocks, their ids kept so the
// tool results that follow still match.
std::optional<ApiError> add_tool_uses(const json& calls, const std::string& at, json& blocks) {
  if (!calls.is_array()) return invalid(at, "must be an array.");
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto& call = calls[i];
    const auto call_at = at + "[" + std::to_string(i) + "]";
    const auto* function = call.is_object() ? field(call, "function") : nullptr;
    const auto* id = call.is_object() ? field(call, "id") : nullptr;
    const auto* name = function && function->is_object() ? field(*function, "name") : nullptr;
    if (!id || !id->is_string() || !name || !name->is_string()) {
      return invalid(call_at, "must have an id and a function name.");
    }
    if (const auto type = text_field(call, "type"); !type.empty() && type != "function")
      return unsupported(call_at + ".type");
    json input = json::object();
    if (const auto* arguments = field(*function, "arguments")) {
      if (!arguments->is_string()) {
        return invalid(call_at + ".function.arguments", "must be a string.");
      }
      const auto& text = arguments->get_ref<const std::string&>();
      if (!text.empty()) input = json::parse(text, nullptr, false);
      // Anthropic takes a tool's input as an object only.
      if (input.is_discarded() || !input.is_object()) {
        return invalid(call_at + ".function.arguments", "must be a JSON object.");
      }
    }
    blocks.push_back({{"type", "tool_use"}, {"id", *id}, {"name", *name}, {"input", input}});
  }
  return std::nullopt;
}

struct Turns {
  std::string system;
  json messages = json::array();

  // Appends `blocks` as a `role` turn, merged into the last turn when that
  // one has the same role: Anthropic wants user and assistant turns to
  // alternate, and tool results arrive as messages of their own.
  void add(std::string_view role, json blocks) {
    if (blocks.empty()) return;
    if (!messages.empty() && messages.back()["role"] == std::string(role)) {
      auto& content = messages.back()["content"];
      for (auto& block : blocks) content.push_back(std::move(block));
      return;
    }
    messages.push_back({{"role", std::string(role)}, {"content", std::move(blocks)}});
  }
};

std::optional<ApiError> add_message(const json& message, const std::string& at, Turns& turns) {
  const auto* role = message.is_object() ? field(message, "role") : nullptr;
  if (!role || !role->is_string()) return invalid(at + ".role", "must be a string.");
  const auto& name = role->get_ref<const std::string&>();
  const json* content = field(message, "content");
  if (name == "system" || name == "developer") {
    if (!content) return invalid(at + ".content", "is required.");
    auto text = text_of(*content, at + ".content");
    if (!text) return text.error();
    if (!turns.system.empty()) turns.system += "\n\n";
    turns.system += text.value();
    return std::nullopt;
  }
  if (name == "user" || name == "assistant") {
    json blocks = json::array();
    if (content) {
      auto translated = content_blocks(*content, at + ".content");
      if (!translated) return translated.error();
      blocks = std::move(translated.value());
    }
    if (name == "assistant") {
      if (const auto* calls = field(message, "tool_calls")) {
        if (auto error = add_tool_uses(*calls, at + ".tool_calls", blocks)) return error;
      }
    }
    turns.add(name, std::move(blocks));
    return std::nullopt;
  }
  if (name == "tool") {
    const auto* id = field(message, "tool_call_id");
    if (!id || !id->is_string()) return invalid(at + ".tool_call_id", "must be a string.");
    auto text = text_of(content ? *content : json(""), at + ".content");
    if (!text) return text.error();
    json blocks = json::array();
    blocks.push_back({{"type", "tool_result"}, {"tool_use_id", *id}, {"content", text.value()}});
    turns.add("user", std::move(blocks));
    return std::nullopt;
  }
  // The legacy `function` role among them.
  return unsupported(at + ".role");
}

Result<json, ApiError> translate_tools(const json& tools) {
  if (!tools.is_array()) return invalid("tools", "must be an array.");
  json translated = json::array();
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const auto& tool = tools[i];
    const auto at = "tools[" + std::to_string(i) + "]";
    if (text_field(tool, "type") != "function") return unsupported(at + ".type");
    const auto* function = field(tool, "function");
    const auto* name = function && function->is_object() ? field(*function, "name") : nullptr;
    if (!name || !name->is_string()) return invalid(at + ".function.name", "must be a string.");
    json entry{{"name", *name}};
    if (const auto* description = field(*function, "description")) {
      entry["description"] = *description;
    }
    // Anthropic requires a schema; OpenAI's default is a function with no
    // parameters.
    const auto* parameters = field(*function, "parameters");
    entry["input_schema"] =
        parameters ? *parameters : json{{"type", "object"}, {"properties", json::object()}};
    translated.push_back(std::move(entry));
  }
  return translated;
}

Result<json, ApiError> translate_tool_choice(const json& choice) {
  if (choice.is_string()) {
    const auto& mode = choice.get_ref<const std::string&>();
    if (mode == "auto") return json{{"type", "auto"}};
    if (mode == "required") return json{{"type", "any"}};
    if (mode == "none") return json{{"type", "none"}};
    return invalid("tool_choice", "must be auto, required, none or a function.");
  }
  const auto* function = choice.is_object() ? field(choice, "function") : nullptr;
  const auto* name = function && function->is_object() ? field(*function, "name") : nullptr;
  if (text_field(choice, "type") != "function" || !name || !name->is_string()) {
    return invalid("tool_choice", "must be auto, required, none or a function.");
  }
  return json{{"type", "tool"}, {"name", *name}};
}

Result<std::uint64_t, ApiError> positive_count(const json& value, const std::string& name) {
  if (!value.is_number_unsigned() || value.get<std::uint64_t>() == 0) {
    return invalid(name, "must be a positive integer.");
  }
  return value.get<std::uint64_t>();
}

}  // namespace

std::optional<std::uint64_t> thinking_budget(std::string_view effort) {
  if (effort == "minimal" || effort == "low") return 1024;
  if (effort == "medium") return 4096;
  if (effort == "high") return 16384;
  return std::nullopt;
}

Result<std::string, ApiError> translate_chat_request(std::string_view openai_body) {
  const auto body = json::parse(openai_body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return ApiError::invalid_request("The request body is not a JSON object.");
  }
  if (auto error = check_fields(body)) return *error;

  json out = json::object();
  if (const auto* model = field(body, "model")) out["model"] = *model;

  const auto* messages = field(body, "messages");
  if (!messages || !messages->is_array()) return invalid("messages", "must be an array.");
  Turns turns;
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const auto at = "messages[" + std::to_string(i) + "]";
    if (auto error = add_message((*messages)[i], at, turns)) return *error;
  }
  if (turns.messages.empty()) {
    return invalid("messages", "must hold a user or assistant message for provider anthropic.");
  }
  if (!turns.system.empty()) out["system"] = turns.system;
  out["messages"] = std::move(turns.messages);

  // OpenAI's newer name wins, as it does at OpenAI.
  std::uint64_t max_tokens = kDefaultMaxTokens;
  for (const auto* name : {"max_tokens", "max_completion_tokens"}) {
    if (const auto* value = field(body, name)) {
      auto count = positive_count(*value, name);
      if (!count) return count.error();
      max_tokens = count.value();
    }
  }
  if (const auto* effort = field(body, "reasoning_effort")) {
    const auto* name = effort->is_string() ? &effort->get_ref<const std::string&>() : nullptr;
    const bool known = name && (*name == "none" || thinking_budget(*name));
    if (!known) return invalid("reasoning_effort", "must be none, minimal, low, medium or high.");
    if (auto budget = thinking_budget(*name)) {
      out["thinking"] = {{"type", "enabled"}, {"budget_tokens", *budget}};
      // The budget counts against max_tokens, and Anthropic wants it
      // smaller: the answer keeps the room the client asked for.
      if (max_tokens <= *budget) max_tokens += *budget;
    }
  }
  out["max_tokens"] = max_tokens;

  if (const auto* stop = field(body, "stop")) {
    if (stop->is_string()) {
      out["stop_sequences"] = json::array({*stop});
    } else if (stop->is_array() && std::all_of(stop->begin(), stop->end(),
                                               [](const json& s) { return s.is_string(); })) {
      out["stop_sequences"] = *stop;
    } else {
      return invalid("stop", "must be a string or an array of strings.");
    }
  }
  // Passed as they are: Anthropic's range for temperature is 0 to 1, and
  // it answers a value outside with its own 400, which the client gets.
  for (const auto* name : {"temperature", "top_p"}) {
    if (const auto* value = field(body, name)) {
      if (!value->is_number()) return invalid(name, "must be a number.");
      out[name] = *value;
    }
  }
  if (const auto* user = field(body, "user")) {
    if (!user->is_string()) return invalid("user", "must be a string.");
    out["metadata"] = {{"user_id", *user}};
  }
  if (const auto* stream = field(body, "stream")) {
    if (!stream->is_boolean()) return invalid("stream", "must be a boolean.");
    if (stream->get<bool>()) out["stream"] = true;
  }

  if (const auto* tools = field(body, "tools")) {
    auto translated = translate_tools(*tools);
    if (!translated) return translated.error();
    if (!translated.value().empty()) out["tools"] = std::move(translated.value());
  }
  std::optional<json> tool_choice;
  if (const auto* choice = field(body, "tool_choice")) {
    auto translated = translate_tool_choice(*choice);
    if (!translated) return translated.error();
    tool_choice = std::move(translated.value());
  }
  if (const auto* parallel = field(body, "parallel_tool_calls")) {
    if (!parallel->is_boolean()) return invalid("parallel_tool_calls", "must be a boolean.");
    if (!parallel->get<bool>()) {
      if (!tool_choice) tool_choice = json{{"type", "auto"}};
      // Anthropic's `none` takes no such flag: no tool is called anyway.
      if ((*tool_choice)["type"] != "none") (*tool_choice)["disable_parallel_tool_use"] = true;
    }
  }
  if (tool_choice) out["tool_choice"] = std::move(*tool_choice);

  return json_fields::dump(out);
}

}  // namespace sluice::protocol::anthropic

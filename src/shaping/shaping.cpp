#include "sluice/shaping/shaping.hpp"

#include <algorithm>
#include <cctype>

namespace sluice::shaping {

namespace {

constexpr std::string_view kCompletionLimitFields[] = {"max_tokens", "max_completion_tokens",
                                                       "max_output_tokens"};

std::string_view string_or_empty(const Json& value) {
  return value.is_string() ? std::string_view(value.get_ref<const std::string&>())
                           : std::string_view();
}

std::string_view role_of(const Json& message) {
  if (!message.is_object()) return {};
  auto role = message.find("role");
  return role == message.end() ? std::string_view() : string_or_empty(*role);
}

bool is_system_role(std::string_view role) { return role == "system" || role == "developer"; }

// A field the client set: present and not null.
bool is_set(const Json& object, std::string_view key) {
  auto it = object.find(key);
  return it != object.end() && !it->is_null();
}

// Calls `visit` with each piece of text a message contributes to the prompt.
// Also takes the items of a Responses API `input` array, which carry text in
// `content`, `arguments` (function calls) and `output` (their results).
template <typename Visit>
void visit_message_text(const Json& message, Visit&& visit) {
  if (message.is_string()) {
    visit(string_or_empty(message));
    return;
  }
  if (!message.is_object()) return;
  if (auto content = message.find("content"); content != message.end()) {
    if (content->is_string()) {
      visit(string_or_empty(*content));
    } else if (content->is_array()) {
      for (const auto& part : *content) {
        if (part.is_string()) {
          visit(string_or_empty(part));
        } else if (part.is_object()) {
          if (auto text = part.find("text"); text != part.end()) visit(string_or_empty(*text));
        }
      }
    }
  }
  if (auto calls = message.find("tool_calls"); calls != message.end() && calls->is_array()) {
    for (const auto& call : *calls) {
      if (!call.is_object()) continue;
      auto function = call.find("function");
      if (function == call.end() || !function->is_object()) continue;
      if (auto arguments = function->find("arguments"); arguments != function->end()) {
        visit(string_or_empty(*arguments));
      }
    }
  }
  for (std::string_view key : {"arguments", "output"}) {
    if (auto text = message.find(key); text != message.end()) visit(string_or_empty(*text));
  }
}

// Calls `visit` with the text of the request's prompt: every message (system
// and developer ones only with `include_system`), or `prompt` and `input`
// for the other endpoints (and `instructions`, the Responses API's system
// prompt).
template <typename Visit>
void visit_prompt_text(const Json& request, bool include_system, Visit&& visit) {
  if (auto messages = request.find("messages"); messages != request.end() && messages->is_array()) {
    for (const auto& message : *messages) {
      if (!include_system && is_system_role(role_of(message))) continue;
      visit_message_text(message, visit);
    }
  }
  for (std::string_view key : {"prompt", "input"}) {
    auto field = request.find(key);
    if (field == request.end()) continue;
    if (field->is_array()) {
      for (const auto& item : *field) {
        if (!include_system && is_system_role(role_of(item))) continue;
        visit_message_text(item, visit);
      }
    } else {
      visit(string_or_empty(*field));
    }
  }
  if (include_system) {
    if (auto instructions = request.find("instructions"); instructions != request.end()) {
      visit(string_or_empty(*instructions));
    }
  }
}

bool offers_tools(const Json& request) {
  for (std::string_view key : {"tools", "functions"}) {
    auto field = request.find(key);
    if (field != request.end() && field->is_array() && !field->empty()) return true;
  }
  return false;
}

bool contains_lowered(std::string_view text, std::string_view lowered_phrase) {
  auto found =
      std::search(text.begin(), text.end(), lowered_phrase.begin(), lowered_phrase.end(),
                  [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; });
  return found != text.end();
}

// Phrases are matched against the conversation, not the system prompt: an
// application's fixed instructions would otherwise decide every request.
bool conversation_contains_any(const Json& request, const std::vector<std::string>& phrases) {
  bool found = false;
  visit_prompt_text(request, /*include_system=*/false, [&](std::string_view text) {
    for (const auto& phrase : phrases) {
      if (found) return;
      found = contains_lowered(text, phrase);
    }
  });
  return found;
}

// One piece of the history that is kept or dropped as a whole.
struct Unit {
  std::size_t begin = 0;
  std::size_t end = 0;
  bool pinned = false;  // a system message under keep_system
};

bool has_tool_calls(const Json& message) {
  if (!message.is_object()) return false;
  auto calls = message.find("tool_calls");
  if (calls != message.end() && calls->is_array() && !calls->empty()) return true;
  return is_set(message, "function_call");  // the deprecated single-call form
}

// Splits the history into units: an assistant message with tool calls
// together with the tool results that follow it, every other message alone.
std::vector<Unit> history_units(const Json& messages, bool keep_system) {
  std::vector<Unit> units;
  const std::size_t count = messages.size();
  for (std::size_t index = 0; index < count;) {
    Unit unit{index, index + 1, keep_system && is_system_role(role_of(messages[index]))};
    if (has_tool_calls(messages[index])) {
      while (unit.end < count) {
        auto role = role_of(messages[unit.end]);
        if (role != "tool" && role != "function") break;
        ++unit.end;
      }
    }
    units.push_back(unit);
    index = unit.end;
  }
  return units;
}

void apply_defaults(const config::ShapingDefaults& defaults, std::string_view endpoint,
                    Json& request, ShapeReport& report) {
  if (defaults.max_tokens) {
    bool client_set =
        std::any_of(std::begin(kCompletionLimitFields), std::end(kCompletionLimitFields),
                    [&](std::string_view key) { return is_set(request, key); });
    if (!client_set) {
      request[endpoint == "/responses" ? "max_output_tokens" : "max_tokens"] = *defaults.max_tokens;
      report.add(kDefaultMaxTokens);
    }
  }
  if (defaults.reasoning_effort) {
    if (endpoint == "/chat/completions") {
      if (!is_set(request, "reasoning_effort")) {
        request["reasoning_effort"] = *defaults.reasoning_effort;
        report.add(kDefaultReasoning);
      }
    } else if (endpoint == "/responses") {
      Json& reasoning = request["reasoning"];
      if (reasoning.is_null()) reasoning = Json::object();
      if (reasoning.is_object() && !is_set(reasoning, "effort")) {
        reasoning["effort"] = *defaults.reasoning_effort;
        report.add(kDefaultReasoning);
      }
    }
  }
}

// Parsed bodies hold non-negative integers as unsigned; documents built
// in code may hold them signed.
bool exceeds(const Json& value, std::uint64_t limit) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>() > limit;
  if (value.is_number_integer()) {
    auto number = value.get<std::int64_t>();
    return number > 0 && static_cast<std::uint64_t>(number) > limit;
  }
  if (value.is_number_float()) return value.get<double>() > static_cast<double>(limit);
  return false;
}

void apply_caps(const config::ShapingCaps& caps, Json& request, ShapeReport& report) {
  if (!caps.max_tokens) return;
  for (std::string_view key : kCompletionLimitFields) {
    auto field = request.find(key);
    if (field != request.end() && exceeds(*field, *caps.max_tokens)) {
      *field = *caps.max_tokens;
      report.add(kCappedMaxTokens);
    }
  }
}

}  // namespace

void ShapeReport::add(std::string_view change) {
  if (!contains(change)) changes.push_back(change);
}

bool ShapeReport::contains(std::string_view change) const {
  return std::find(changes.begin(), changes.end(), change) != changes.end();
}

std::string ShapeReport::joined() const {
  std::string text;
  for (auto change : changes) {
    if (!text.empty()) text += ',';
    text += change;
  }
  return text;
}

std::uint64_t estimate_tokens(std::uint64_t characters) { return (characters + 3) / 4; }

std::uint64_t count_characters(std::string_view utf8) {
  // Every byte but UTF-8 continuation bytes starts a character.
  return static_cast<std::uint64_t>(std::count_if(utf8.begin(), utf8.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xc0u) != 0x80u;
  }));
}

std::uint64_t message_characters(const Json& message) {
  std::uint64_t characters = 0;
  visit_message_text(message, [&](std::string_view text) { characters += count_characters(text); });
  return characters;
}

std::uint64_t estimate_prompt_tokens(const Json& request) {
  std::uint64_t characters = 0;
  visit_prompt_text(request, /*include_system=*/true,
                    [&](std::string_view text) { characters += count_characters(text); });
  return estimate_tokens(characters);
}

bool trim_history(const config::TrimHistory& limits, Json& request) {
  if (!request.is_object()) return false;
  auto found = request.find("messages");
  if (found == request.end() || !found->is_array() || found->empty()) return false;
  Json& messages = *found;

  std::vector<std::uint64_t> characters(messages.size());
  std::uint64_t total_characters = 0;
  for (std::size_t index = 0; index < messages.size(); ++index) {
    characters[index] = message_characters(messages[index]);
    total_characters += characters[index];
  }
  std::size_t kept_messages = messages.size();
  auto within_limits = [&] {
    return (limits.max_messages == 0 || kept_messages <= limits.max_messages) &&
           (limits.max_prompt_tokens == 0 ||
            estimate_tokens(total_characters) <= limits.max_prompt_tokens);
  };
  if (within_limits()) return false;

  std::vector<Unit> units = history_units(messages, limits.keep_system);
  // The turn in progress: the last user message and whatever follows it
  // (the assistant's tool calls and their results), or without a user
  // message the last unit.
  std::size_t protected_from = units.back().begin;
  for (std::size_t index = messages.size(); index-- > 0;) {
    if (role_of(messages[index]) == "user") {
      protected_from = index;
      break;
    }
  }

  std::vector<bool> dropped(messages.size(), false);
  bool any_dropped = false;
  for (const Unit& unit : units) {
    if (within_limits() || unit.begin >= protected_from) break;
    if (unit.pinned) continue;
    for (std::size_t index = unit.begin; index < unit.end; ++index) {
      dropped[index] = true;
      total_characters -= characters[index];
    }
    kept_messages -= unit.end - unit.begin;
    any_dropped = true;
  }
  if (!any_dropped) return false;

  Json kept = Json::array();
  for (std::size_t index = 0; index < messages.size(); ++index) {
    if (!dropped[index]) kept.push_back(std::move(messages[index]));
  }
  messages = std::move(kept);
  return true;
}

ShapeReport apply_shaping(const config::Shaping& shaping, std::string_view endpoint,
                          Json& request) {
  ShapeReport report;
  // Only the endpoints that generate text take completion limits and
  // reasoning effort; embeddings, moderations, images and audio are left
  // alone.
  const bool generates_text =
      endpoint == "/chat/completions" || endpoint == "/completions" || endpoint == "/responses";
  if (!request.is_object() || !generates_text) return report;
  if (shaping.trim_history && endpoint == "/chat/completions" &&
      trim_history(*shaping.trim_history, request)) {
    report.add(kTrimmed);
  }
  apply_defaults(shaping.defaults, endpoint, request, report);
  apply_caps(shaping.caps, request, report);
  return report;
}

bool rule_matches(const config::RuleCondition& when, const Json& request) {
  if (when.prompt_tokens_below && estimate_prompt_tokens(request) >= *when.prompt_tokens_below) {
    return false;
  }
  if (when.no_tools && *when.no_tools == offers_tools(request)) return false;
  if (!when.contains_any.empty() && !conversation_contains_any(request, when.contains_any)) {
    return false;
  }
  return true;
}

const std::string* choose_rule_target(const std::vector<config::Rule>& rules, const Json& request) {
  for (const auto& rule : rules) {
    if (!rule.when || rule_matches(*rule.when, request)) return &rule.model;
  }
  return nullptr;
}

std::optional<std::uint64_t> requested_max_tokens(const Json& request) {
  for (std::string_view key : kCompletionLimitFields) {
    auto field = request.find(key);
    if (field == request.end()) continue;
    if (field->is_number_unsigned()) return field->get<std::uint64_t>();
    if (field->is_number_integer() && field->get<std::int64_t>() >= 0) {
      return static_cast<std::uint64_t>(field->get<std::int64_t>());
    }
  }
  return std::nullopt;
}

ShapedRequest shape_request(const config::Config& config, const config::Model& requested,
                            std::string_view endpoint, std::string_view body) {
  ShapedRequest shaped;
  shaped.target = &requested;
  // The body was validated by the same parser; without exceptions all the
  // same, as errors on the data path are values.
  Json request = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    if (!requested.rules.empty()) shaped.target = nullptr;
    return shaped;
  }

  if (!requested.rules.empty()) {
    const std::string* name = choose_rule_target(requested.rules, request);
    shaped.target = name ? config.find_model(*name) : nullptr;
    if (!shaped.target) return shaped;
    shaped.routed = true;
  }
  auto shape_with = [&](const config::Model& model) {
    if (!model.shaping) return;
    for (auto change : apply_shaping(*model.shaping, endpoint, request).changes) {
      shaped.report.add(change);
    }
  };
  shape_with(requested);
  if (shaped.target != &requested) shape_with(*shaped.target);

  if (shaped.report.changed()) {
    shaped.body = request.dump(-1, ' ', false, Json::error_handler_t::replace);
    shaped.max_tokens = requested_max_tokens(request);
  }
  return shaped;
}

}  // namespace sluice::shaping

#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"

// Request shaping and rule routing: decisions over a parsed request body and
// the model's config, no sockets. A model without `shaping` or `rules` never
// gets here, so its body is never parsed into a document.
namespace sluice::shaping {

// Key order is kept, so a shaped body differs from the client's only where
// shaping changed it.
using Json = nlohmann::ordered_json;

// The change tokens, as they appear in the x-sluice-shaped header and the
// access log, each named after the config key that caused it.
inline constexpr std::string_view kTrimmed = "trimmed";              // trim_history
inline constexpr std::string_view kDefaultMaxTokens = "max_tokens";  // defaults.max_tokens
inline constexpr std::string_view kDefaultReasoning =
    "reasoning_effort";  // defaults.reasoning_effort
inline constexpr std::string_view kCappedMaxTokens = "max_tokens_capped";  // caps.max_tokens

// The changes made to one request, in the order they were made, each once.
struct ShapeReport {
  std::vector<std::string_view> changes;

  void add(std::string_view change);
  bool changed() const { return !changes.empty(); }
  bool contains(std::string_view change) const;
  std::string joined() const;  // "trimmed,max_tokens"
};

// Tokens estimated from text: Unicode characters / 4, rounded up. The usual
// rule of thumb for English; no tokenizer is loaded.
std::uint64_t estimate_tokens(std::uint64_t characters);
std::uint64_t count_characters(std::string_view utf8);

// Characters of one chat message that count towards its prompt: the content
// (a string, or the text of each part of an array) and the arguments of its
// tool calls.
std::uint64_t message_characters(const Json& message);
// The estimated prompt tokens of a request: its messages, or for the other
// endpoints `prompt`, `input` and `instructions`.
std::uint64_t estimate_prompt_tokens(const Json& request);

// Drops the oldest messages of `request.messages` until both limits hold:
// never a system/developer message when keep_system, never the last user
// message or anything after it, and an assistant message with tool calls
// only together with the tool results that follow it. When the limits cannot
// be met that way the rest is kept as it is. Returns whether anything was
// dropped.
bool trim_history(const config::TrimHistory& limits, Json& request);

// Applies a model's shaping to a request for `endpoint` ("/chat/completions",
// "/completions", "/responses"): history trimming (chat only), then defaults
// for the fields the client left out, then caps on the ones it set. Requests
// to other endpoints (embeddings, moderations, images, audio) are left alone.
ShapeReport apply_shaping(const config::Shaping& shaping, std::string_view endpoint, Json& request);

// Whether every condition of `when` holds for the request.
bool rule_matches(const config::RuleCondition& when, const Json& request);
// The model named by the first matching rule; nullptr when none matches.
const std::string* choose_rule_target(const std::vector<config::Rule>& rules, const Json& request);

// The completion limit the request allows (max_tokens,
// max_completion_tokens or max_output_tokens), for the token estimate.
std::optional<std::uint64_t> requested_max_tokens(const Json& request);

// True when the pipeline has work for this stage.
inline bool shapes(const config::Model& model) {
  return model.shaping.has_value() || !model.rules.empty();
}

// The whole stage for one request to `requested` (shapes() is true).
struct ShapedRequest {
  // The model whose deployments serve the request: `requested`, or the pick
  // of its rules; nullptr when it has rules and none matched.
  const config::Model* target = nullptr;
  bool routed = false;  // target was picked by a rule
  ShapeReport report;
  // The body to send instead of the client's; empty when nothing changed.
  std::string body;
  std::optional<std::uint64_t> max_tokens;  // of the body that goes upstream
};

// Order: rules (on the client's request), the requested model's shaping,
// then the target's. `body` has passed inspect_request_body already.
ShapedRequest shape_request(const config::Config& config, const config::Model& requested,
                            std::string_view endpoint, std::string_view body);

}  // namespace sluice::shaping

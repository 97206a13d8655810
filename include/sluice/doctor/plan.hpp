#pragma once

// What the active mode sends to one deployment, decided before anything is
// sent so that its cost can be stated and agreed to.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice::doctor {

struct PlanLimits {
  unsigned max_requests = 60;  // per deployment
  unsigned max_prompt_tokens = 16384;
  unsigned max_concurrency = 16;
};

struct Plan {
  unsigned network_each = 0;  // requests over fresh connections, and as many over kept-alive ones
  std::vector<unsigned> prompt_sizes;  // tokens, increasing
  unsigned per_size = 0;
  std::vector<unsigned> levels;   // concurrency, increasing; level c is a burst of c requests
  unsigned level_one_rounds = 0;  // level 1 is sent this many times, for a steadier base

  unsigned requests() const;
  // Estimated input tokens of the whole plan (prompt text plus each
  // request's framing).
  std::uint64_t input_tokens() const;
};

// The plan that fits `limits`, growing the repeats while the budget allows;
// nullopt with the reason when even the smallest plan does not fit.
std::optional<Plan> make_plan(const PlanLimits& limits, std::string& why);

// The small request's prompt size, steps 1 and 3.
inline constexpr unsigned kSmallPromptTokens = 16;

// Synthetic English-like text of about `tokens` tokens (four characters
// each, as the gateway's estimate counts them), opened by `nonce` so that a
// provider's prompt cache cannot answer it.
std::string synthetic_prompt(unsigned tokens, std::uint64_t nonce);

// A streamed chat completion of one output token: `model_literal` is the
// model's JSON string, quotes included.
std::string probe_body(const std::string& model_literal, const std::string& prompt);

}  // namespace sluice::doctor

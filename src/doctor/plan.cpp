#include "sluice/doctor/plan.hpp"

#include <algorithm>
#include <array>
#include <string_view>

#include "sluice/common/json_scan.hpp"

namespace sluice::doctor {

namespace {

constexpr std::array<unsigned, 5> kPromptSizes{16, 256, 1024, 4096, 16384};
constexpr std::array<unsigned, 5> kLevels{1, 2, 4, 8, 16};
// A chat request's own tokens besides its text (roles, separators).
constexpr unsigned kFramingTokens = 8;

}  // namespace

unsigned Plan::requests() const {
  unsigned total = 2 * network_each + per_size * static_cast<unsigned>(prompt_sizes.size());
  for (unsigned level : levels) total += level == 1 ? level_one_rounds : level;
  return total;
}

std::uint64_t Plan::input_tokens() const {
  std::uint64_t small = kSmallPromptTokens + kFramingTokens;
  std::uint64_t total = 2 * network_each * small;
  for (unsigned size : prompt_sizes) total += per_size * std::uint64_t{size + kFramingTokens};
  for (unsigned level : levels) total += (level == 1 ? level_one_rounds : level) * small;
  return total;
}

std::optional<Plan> make_plan(const PlanLimits& limits, std::string& why) {
  if (limits.max_requests == 0) {
    why = "--max-requests 0 would send nothing; give at least 1 (default 60 per deployment)";
    return std::nullopt;
  }
  if (limits.max_concurrency == 0 || limits.max_prompt_tokens < kSmallPromptTokens) {
    why = "--max-concurrency must be at least 1 and --max-prompt-tokens at least " +
          std::to_string(kSmallPromptTokens);
    return std::nullopt;
  }
  Plan plan;
  plan.network_each = 1;
  plan.per_size = 1;
  plan.level_one_rounds = 1;
  for (unsigned size : kPromptSizes) {
    if (size <= limits.max_prompt_tokens) plan.prompt_sizes.push_back(size);
  }
  // The cap itself is measured too, when it falls between two sizes.
  if (plan.prompt_sizes.back() < limits.max_prompt_tokens &&
      plan.prompt_sizes.back() < kPromptSizes.back()) {
    plan.prompt_sizes.push_back(limits.max_prompt_tokens);
  }
  for (unsigned level : kLevels) {
    if (level <= limits.max_concurrency) plan.levels.push_back(level);
  }
  if (plan.levels.back() < limits.max_concurrency && plan.levels.back() < kLevels.back()) {
    plan.levels.push_back(limits.max_concurrency);
  }
  // Too small a budget loses the highest levels first, then the largest
  // prompts, keeping two of each for a slope and a knee while it can.
  while (plan.requests() > limits.max_requests && plan.levels.size() > 2) plan.levels.pop_back();
  while (plan.requests() > limits.max_requests && plan.prompt_sizes.size() > 2) {
    plan.prompt_sizes.pop_back();
  }
  if (plan.requests() > limits.max_requests) {
    why = "--max-requests " + std::to_string(limits.max_requests) + " is below the " +
          std::to_string(plan.requests()) + " requests the smallest diagnosis needs";
    return std::nullopt;
  }
  // The rest of the budget repeats the measurements, a round of each in turn.
  for (bool grew = true; grew;) {
    grew = false;
    const auto try_grow = [&](unsigned& count, unsigned most) {
      if (count >= most) return;
      ++count;
      if (plan.requests() > limits.max_requests) {
        --count;
        return;
      }
      grew = true;
    };
    try_grow(plan.network_each, 5);
    try_grow(plan.per_size, 3);
    try_grow(plan.level_one_rounds, 5);
  }
  return plan;
}

std::string synthetic_prompt(unsigned tokens, std::uint64_t nonce) {
  static constexpr std::array<std::string_view, 16> kWords{"the", "sun", "set", "and", "our", "old",
                                                           "dog", "ran", "far", "off", "for", "his",
                                                           "red", "cap", "one", "day"};
  std::string text = "run " + std::to_string(nonce) + ":";
  text.reserve(std::size_t{tokens} * 4 + 8);
  std::uint64_t state = nonce | 1;
  while (text.size() < std::size_t{tokens} * 4) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    text += ' ';
    text += kWords[state % kWords.size()];
  }
  text.resize(std::size_t{tokens} * 4);
  return text;
}

std::string probe_body(const std::string& model_literal, const std::string& prompt) {
  std::string body = R"({"model":)" + model_literal + R"(,"messages":[{"role":"user","content":)";
  append_json_string(body, prompt);
  body += R"(}],"max_tokens":1,"stream":true})";
  return body;
}

}  // namespace sluice::doctor

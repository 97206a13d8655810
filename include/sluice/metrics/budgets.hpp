#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "sluice/common/clock.hpp"

namespace sluice::metrics {

// Latency budgets: how long each stage of a request may take before it is
// counted (sluice_budget_exceeded_total) and flagged in the access log.
enum class BudgetStage : std::uint8_t { gateway, upstream_ttfb, total };
inline constexpr std::array<BudgetStage, 3> kBudgetStages = {
    BudgetStage::gateway, BudgetStage::upstream_ttfb, BudgetStage::total};

// The label value and log name of a stage: "gateway", "upstream_ttfb", "total".
std::string_view to_string(BudgetStage stage);

// Stage durations; absent ones are neither limited (in budgets) nor checked
// (in measurements).
struct StageDurations {
  std::optional<Clock::duration> gateway;        // time spent in sluice itself
  std::optional<Clock::duration> upstream_ttfb;  // request sent -> first upstream byte
  std::optional<Clock::duration> total;          // request received -> last byte sent
};
using LatencyBudgets = StageDurations;

// The stages over budget, as a small set (no allocation).
class BudgetOverruns {
 public:
  bool contains(BudgetStage stage) const { return (bits_ >> static_cast<unsigned>(stage)) & 1u; }
  bool empty() const { return bits_ == 0; }
  void insert(BudgetStage stage) {
    bits_ |= static_cast<std::uint8_t>(1u << static_cast<unsigned>(stage));
  }
  bool operator==(const BudgetOverruns&) const = default;

 private:
  std::uint8_t bits_ = 0;
};

// A stage is over when it was measured, has a budget, and took strictly
// longer than the budget.
BudgetOverruns over_budget(const LatencyBudgets& budgets, const StageDurations& measured);

}  // namespace sluice::metrics

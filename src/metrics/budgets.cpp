#include "sluice/metrics/budgets.hpp"

namespace sluice::metrics {

std::string_view to_string(BudgetStage stage) {
  switch (stage) {
    case BudgetStage::gateway:
      return "gateway";
    case BudgetStage::upstream_ttfb:
      return "upstream_ttfb";
    case BudgetStage::total:
      return "total";
  }
  return "unknown";
}

BudgetOverruns over_budget(const LatencyBudgets& budgets, const StageDurations& measured) {
  BudgetOverruns overruns;
  auto check = [&](BudgetStage stage, const std::optional<Clock::duration>& budget,
                   const std::optional<Clock::duration>& value) {
    if (budget && value && *value > *budget) overruns.insert(stage);
  };
  check(BudgetStage::gateway, budgets.gateway, measured.gateway);
  check(BudgetStage::upstream_ttfb, budgets.upstream_ttfb, measured.upstream_ttfb);
  check(BudgetStage::total, budgets.total, measured.total);
  return overruns;
}

}  // namespace sluice::metrics

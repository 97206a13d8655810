#include <gtest/gtest.h>

#include <chrono>

#include "sluice/metrics/budgets.hpp"

namespace sluice::metrics {
namespace {

using namespace std::chrono_literals;

TEST(Budgets, StagesOverTheirBudgetAreReported) {
  LatencyBudgets budgets;
  budgets.gateway = 1ms;
  budgets.upstream_ttfb = 2s;
  budgets.total = 30s;
  StageDurations measured;
  measured.gateway = std::chrono::microseconds(1500);
  measured.upstream_ttfb = 1s;
  measured.total = 31s;
  const BudgetOverruns over = over_budget(budgets, measured);
  EXPECT_TRUE(over.contains(BudgetStage::gateway));
  EXPECT_FALSE(over.contains(BudgetStage::upstream_ttfb));
  EXPECT_TRUE(over.contains(BudgetStage::total));
  EXPECT_FALSE(over.empty());
}

TEST(Budgets, ExactlyOnBudgetIsWithin) {
  LatencyBudgets budgets;
  budgets.upstream_ttfb = 2s;
  StageDurations measured;
  measured.upstream_ttfb = 2s;
  EXPECT_TRUE(over_budget(budgets, measured).empty());
  measured.upstream_ttfb = 2s + std::chrono::nanoseconds(1);
  EXPECT_TRUE(over_budget(budgets, measured).contains(BudgetStage::upstream_ttfb));
}

TEST(Budgets, UnsetBudgetsAndUnmeasuredStagesAreNeverOver) {
  LatencyBudgets none;
  StageDurations slow;
  slow.gateway = 1h;
  slow.upstream_ttfb = 1h;
  slow.total = 1h;
  EXPECT_TRUE(over_budget(none, slow).empty());

  LatencyBudgets tight;
  tight.gateway = 0ms;
  tight.upstream_ttfb = 0ms;
  tight.total = 0ms;
  EXPECT_TRUE(over_budget(tight, StageDurations{}).empty());  // e.g. no upstream was reached
}

TEST(Budgets, StageNames) {
  EXPECT_EQ(to_string(BudgetStage::gateway), "gateway");
  EXPECT_EQ(to_string(BudgetStage::upstream_ttfb), "upstream_ttfb");
  EXPECT_EQ(to_string(BudgetStage::total), "total");
  BudgetOverruns a;
  BudgetOverruns b;
  EXPECT_EQ(a, b);
  a.insert(BudgetStage::total);
  EXPECT_NE(a, b);
  b.insert(BudgetStage::total);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace sluice::metrics

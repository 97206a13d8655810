#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "router/router_fixtures.hpp"
#include "sluice/router/router.hpp"

namespace sluice::router {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

config::Model model(std::string name, config::Strategy strategy,
                    std::initializer_list<const char*> ids) {
  config::Model m;
  m.name = std::move(name);
  m.strategy = strategy;
  for (const char* id : ids) {
    config::Deployment d;
    d.id = id;
    d.base_url = config::Url{"https", "api.example.test", 443, ""};
    d.upstream_model = "upstream-model";
    m.deployments.push_back(std::move(d));
  }
  return m;
}

AttemptResult retriable(bool timed_out = false, std::optional<Millis> retry_after = {}) {
  AttemptResult result;
  result.kind = ResultKind::retriable;
  result.timed_out = timed_out;
  result.retry_after = retry_after;
  return result;
}

AttemptResult of_kind(ResultKind kind) {
  AttemptResult result;
  result.kind = kind;
  return result;
}

AttemptResult success(Micros ttft) {
  AttemptResult result;
  result.kind = ResultKind::success;
  result.ttft = ttft;
  return result;
}

config::Router with_retries(unsigned retries) {
  config::Router policy;
  policy.retries = retries;
  policy.cooldown.fails = 1000;  // keep cooldowns out of the way unless a test wants them
  return policy;
}

config::Router hedging(config::Hedge::Mode mode, Millis after = 0ms) {
  auto policy = with_retries(2);
  policy.hedge.mode = mode;
  policy.hedge.after = after;
  return policy;
}

// Runs a plan in which every attempt fails the same way; returns the
// deployment ids in the order they were tried.
std::vector<std::string> fail_everything(Plan& plan, const AttemptResult& result) {
  std::vector<std::string> order;
  TimePoint now = kBase;
  while (auto attempt = plan.next(now)) {
    order.push_back(attempt->deployment->id);
    plan.report(*attempt, result, now);
    if (!plan.can_retry()) break;
    now += 1s;
  }
  return order;
}

TEST(Plan, ClientErrorEndsThePlanAfterOneAttempt) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, with_retries(3));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  auto attempt = plan.next(kBase);
  ASSERT_TRUE(attempt);
  plan.report(*attempt, of_kind(ResultKind::client_error), kBase);
  EXPECT_FALSE(plan.can_retry());
  EXPECT_FALSE(plan.next(kBase));
  EXPECT_EQ(plan.attempts_made(), 1u);
  EXPECT_EQ(router.state("a")->in_flight(), 0);
}

TEST(Plan, ClientErrorIsNotADeploymentFailure) {
  auto policy = with_retries(3);
  policy.cooldown.fails = 1;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a"})}, policy);
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  auto attempt = plan.next(kBase);
  plan.report(*attempt, of_kind(ResultKind::client_error), kBase);
  EXPECT_FALSE(router.state("a")->cooling_down(kBase));
  EXPECT_EQ(router.state("a")->failures_total(), 0u);
}

TEST(Plan, RetriableFailureCountsTowardCooldown) {
  auto policy = with_retries(3);
  policy.cooldown.fails = 1;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, policy);
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  auto attempt = plan.next(kBase);
  ASSERT_EQ(attempt->deployment->id, "a");
  plan.report(*attempt, retriable(), kBase);
  EXPECT_TRUE(router.state("a")->cooling_down(kBase));
  EXPECT_EQ(router.state("a")->in_flight(), 0);
}

TEST(Plan, AttemptsAreBoundedByRetriesPlusOne) {
  for (unsigned retries : {0u, 1u, 2u, 4u}) {
    auto cfg = make_config({model("m", config::Strategy::latency, {"a", "b", "c", "d", "e", "f"})},
                           with_retries(retries));
    Router router(cfg);
    Plan plan = router.plan(cfg->models[0], true, 9);
    EXPECT_EQ(fail_everything(plan, retriable()).size(), retries + 1);
    EXPECT_EQ(plan.attempts_made(), retries + 1);
    EXPECT_FALSE(plan.can_retry());
    EXPECT_FALSE(plan.next(kBase + 1h));
  }
}

TEST(Plan, FailoverTriesEveryDeploymentOnceBeforeRepeating) {
  auto cfg = make_config({model("m", config::Strategy::latency, {"a", "b", "c"})}, with_retries(5));
  Router router(cfg);
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    Plan plan = router.plan(cfg->models[0], true, seed);
    const auto order = fail_everything(plan, retriable());
    ASSERT_EQ(order.size(), 6u);
    EXPECT_EQ(std::set<std::string>(order.begin(), order.begin() + 3).size(), 3u);
    EXPECT_EQ(std::set<std::string>(order.begin() + 3, order.end()).size(), 3u);
  }
}

TEST(Plan, TimedOutDeploymentIsNeverRetriedStraightAway) {
  auto cfg = make_config({model("m", config::Strategy::latency, {"a", "b"})}, with_retries(7));
  Router router(cfg);
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    Plan plan = router.plan(cfg->models[0], true, seed);
    const auto order = fail_everything(plan, retriable(/*timed_out=*/true));
    ASSERT_EQ(order.size(), 8u);
    for (std::size_t i = 1; i < order.size(); ++i) {
      ASSERT_NE(order[i], order[i - 1]) << "seed " << seed << " attempt " << i;
    }
  }
}

TEST(Plan, OnlyDeploymentIsRetriedEvenAfterATimeout) {
  auto cfg = make_config({model("m", config::Strategy::latency, {"only"})}, with_retries(2));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  EXPECT_EQ(fail_everything(plan, retriable(true)),
            (std::vector<std::string>{"only", "only", "only"}));
}

TEST(Plan, FallbacksFollowTheExhaustedGroupThenItStartsOver) {
  auto requested = model("main", config::Strategy::priority, {"a", "b"});
  requested.fallbacks = {"missing", "backup", "second"};
  auto cfg = make_config({requested, model("backup", config::Strategy::priority, {"c"}),
                          model("second", config::Strategy::priority, {"d"})},
                         with_retries(5));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);

  std::vector<std::string> order;
  std::vector<bool> fallback;
  std::vector<std::string> groups;
  TimePoint now = kBase;
  while (auto attempt = plan.next(now)) {
    order.push_back(attempt->deployment->id);
    fallback.push_back(attempt->fallback);
    groups.push_back(attempt->model->name);
    plan.report(*attempt, retriable(), now);
    now += 1s;
  }
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "c", "d", "a", "b"}));
  EXPECT_EQ(fallback, (std::vector<bool>{false, false, true, true, false, false}));
  EXPECT_EQ(groups, (std::vector<std::string>{"main", "main", "backup", "second", "main", "main"}));
}

TEST(Plan, ContextWindowExceededSwitchesToContextWindowFallbacks) {
  auto small = model("small", config::Strategy::priority, {"s1", "s2"});
  small.fallbacks = {"other"};
  small.context_window_fallbacks = {"large"};
  auto cfg = make_config({small, model("other", config::Strategy::priority, {"o"}),
                          model("large", config::Strategy::priority, {"l1", "l2"})},
                         with_retries(4));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);

  auto first = plan.next(kBase);
  ASSERT_EQ(first->deployment->id, "s1");
  plan.report(*first, of_kind(ResultKind::context_window_exceeded), kBase);
  EXPECT_TRUE(plan.can_retry());
  EXPECT_EQ(router.state("s1")->in_flight(), 0);
  EXPECT_FALSE(router.state("s1")->cooling_down(kBase));

  auto second = plan.next(kBase);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->deployment->id, "l1");
  EXPECT_EQ(second->model->name, "large");
  EXPECT_TRUE(second->fallback);

  // Only one switch: a second overflow ends the request.
  plan.report(*second, of_kind(ResultKind::context_window_exceeded), kBase);
  EXPECT_FALSE(plan.can_retry());
  EXPECT_FALSE(plan.next(kBase));
}

TEST(Plan, ContextWindowExceededWithoutFallbacksEndsThePlan) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, with_retries(4));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  auto attempt = plan.next(kBase);
  plan.report(*attempt, of_kind(ResultKind::context_window_exceeded), kBase);
  EXPECT_FALSE(plan.can_retry());
  EXPECT_FALSE(plan.next(kBase));
}

TEST(Plan, FirstAttemptOnEachDeploymentDoesNotWait) {
  auto cfg =
      make_config({model("m", config::Strategy::priority, {"a", "b", "c"})}, with_retries(2));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  TimePoint now = kBase;
  while (auto attempt = plan.next(now)) {
    EXPECT_EQ(attempt->wait, 0ms) << attempt->deployment->id;
    plan.report(*attempt, retriable(), now);
  }
  EXPECT_EQ(plan.attempts_made(), 3u);
}

TEST(Plan, BackoffWaitsGrowWithinBoundsAndVary) {
  auto policy = with_retries(4);
  policy.backoff.base = 100ms;
  policy.backoff.max = 300ms;
  auto cfg = make_config({model("m", config::Strategy::latency, {"only"})}, policy);
  Router router(cfg);

  // Upper bounds for attempts 2..5: base, 2 base, 4 base capped at max, max.
  const std::vector<Millis> ceilings = {100ms, 200ms, 300ms, 300ms};
  std::vector<std::set<Millis::rep>> seen(ceilings.size());
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    Plan plan = router.plan(cfg->models[0], true, seed);
    auto first = plan.next(kBase);
    ASSERT_EQ(first->wait, 0ms);
    plan.report(*first, retriable(), kBase);
    for (std::size_t repeat = 0; repeat < ceilings.size(); ++repeat) {
      auto attempt = plan.next(kBase);
      ASSERT_TRUE(attempt);
      ASSERT_GE(attempt->wait, 0ms);
      ASSERT_LE(attempt->wait, ceilings[repeat]) << "repeat " << repeat;
      seen[repeat].insert(attempt->wait.count());
      plan.report(*attempt, retriable(), kBase);
    }
  }
  for (const auto& waits : seen) EXPECT_GT(waits.size(), 20u);
  // Full jitter up to the doubled ceiling reaches past the first one.
  EXPECT_GT(*seen[1].rbegin(), 100);
  EXPECT_GT(*seen[2].rbegin(), 200);
}

TEST(Plan, RetryAfterIsHonouredAndCappedAtBackoffMax) {
  auto policy = with_retries(3);
  policy.backoff.base = 10ms;
  policy.backoff.max = 4000ms;
  auto cfg = make_config({model("m", config::Strategy::latency, {"only"})}, policy);
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);

  auto first = plan.next(kBase);
  plan.report(*first, retriable(false, 2000ms), kBase);
  auto second = plan.next(kBase);
  EXPECT_EQ(second->wait, 2000ms);

  plan.report(*second, retriable(false, 60000ms), kBase);
  auto third = plan.next(kBase);
  EXPECT_EQ(third->wait, 4000ms);

  plan.report(*third, retriable(), kBase);  // no Retry-After: plain backoff again
  auto fourth = plan.next(kBase);
  EXPECT_LE(fourth->wait, 40ms);
}

TEST(Plan, RetryAfterDoesNotDelayAnotherDeployment) {
  auto policy = with_retries(3);
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, policy);
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  auto first = plan.next(kBase);
  ASSERT_EQ(first->deployment->id, "a");
  plan.report(*first, retriable(false, 3000ms), kBase);
  auto second = plan.next(kBase);
  ASSERT_EQ(second->deployment->id, "b");
  EXPECT_EQ(second->wait, 0ms);
}

TEST(Plan, SlotsAreHeldUntilReportOrFinish) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, with_retries(3));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], false, 1);
  auto first = plan.next(kBase);
  EXPECT_EQ(router.state("a")->in_flight(), 1);
  plan.report(*first, retriable(), kBase);
  EXPECT_EQ(router.state("a")->in_flight(), 0);

  auto second = plan.next(kBase);
  plan.report(*second, success(40ms), kBase);
  EXPECT_EQ(router.state("b")->in_flight(), 1);  // still relaying
  EXPECT_FALSE(plan.can_retry());
  EXPECT_FALSE(plan.next(kBase));
  plan.finish(*second, true, 900ms, kBase + 1s);
  EXPECT_EQ(router.state("b")->in_flight(), 0);
}

TEST(Plan, SuccessFeedsTheTtftWindowAndNonStreamFinishTheTotalWindow) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a"})}, with_retries(1));
  Router router(cfg);
  auto& state = *router.state("a");

  Plan non_stream = router.plan(cfg->models[0], false, 1);
  auto attempt = non_stream.next(kBase);
  non_stream.report(*attempt, success(40ms), kBase);
  non_stream.finish(*attempt, true, 900ms, kBase);
  EXPECT_EQ(state.ttft.summary(kBase, 60s).p50, 40ms);
  EXPECT_EQ(state.total.summary(kBase, 60s).samples, 1u);
  EXPECT_EQ(state.total.summary(kBase, 60s).p50, 900ms);

  Plan stream = router.plan(cfg->models[0], true, 2);
  attempt = stream.next(kBase);
  stream.report(*attempt, success(60ms), kBase);
  stream.finish(*attempt, true, 5000ms, kBase);
  EXPECT_EQ(state.ttft.summary(kBase, 60s).samples, 2u);
  EXPECT_EQ(state.total.summary(kBase, 60s).samples, 1u);
}

TEST(Plan, MidstreamFailureCountsTowardCooldown) {
  auto policy = with_retries(1);
  policy.cooldown.fails = 1;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a"})}, policy);
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], false, 1);
  auto attempt = plan.next(kBase);
  plan.report(*attempt, success(10ms), kBase);
  plan.finish(*attempt, false, 2s, kBase + 2s);
  EXPECT_TRUE(router.state("a")->cooling_down(kBase + 2s));
  EXPECT_EQ(router.state("a")->total.summary(kBase + 2s, 60s).samples, 0u);
  EXPECT_EQ(router.state("a")->in_flight(), 0);
}

TEST(Plan, ResponseCutByTheClientIsNoFailureOfTheDeployment) {
  auto policy = with_retries(1);
  policy.cooldown.fails = 1;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a"})}, policy);
  Router router(cfg);
  auto& state = *router.state("a");
  for (int i = 0; i < 3; ++i) {
    Plan plan = router.plan(cfg->models[0], false, 1);
    auto attempt = plan.next(kBase);
    plan.report(*attempt, success(10ms), kBase);
    plan.left_by_client(*attempt);
  }
  EXPECT_EQ(state.in_flight(), 0);
  EXPECT_EQ(state.failures_total(), 0u);
  EXPECT_EQ(state.recent_error_rate(kBase), 0.0);
  EXPECT_FALSE(state.cooling_down(kBase));
  EXPECT_EQ(state.ttft.summary(kBase, 60s).samples, 3u);
  // A cut response's duration is no latency anyone would get.
  EXPECT_EQ(state.total.summary(kBase, 60s).samples, 0u);
}

TEST(Plan, DestroyedPlanGivesBackWhatItsAttemptsHold) {
  auto policy = hedging(config::Hedge::Mode::fixed, 100ms);
  policy.cooldown.fails = 1;
  policy.cooldown.duration = 1s;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, policy);
  Router router(cfg);
  auto& a = *router.state("a");
  auto& b = *router.state("b");
  {
    // A failure cools `a` down; once that ran out, the next attempt on it
    // is its probe.
    Plan plan = router.plan(cfg->models[0], true, 1);
    plan.report(*plan.next(kBase), retriable(), kBase);
  }
  {
    Plan plan = router.plan(cfg->models[0], true, 2);
    auto probe = plan.next(kBase + 2s);
    ASSERT_EQ(probe->deployment->id, "a");
    ASSERT_TRUE(probe->probe);
    auto hedge = plan.next_hedge(kBase + 2s);
    ASSERT_TRUE(hedge);
    EXPECT_EQ(a.in_flight(), 1);
    EXPECT_EQ(b.in_flight(), 1);
    EXPECT_FALSE(a.probe_available(kBase + 2s));
    // Unwound without a report, as by an exception.
  }
  EXPECT_EQ(a.in_flight(), 0);
  EXPECT_EQ(b.in_flight(), 0);
  EXPECT_TRUE(a.probe_available(kBase + 2s));

  // What was reported is not given back twice.
  {
    Plan plan = router.plan(cfg->models[0], true, 3);
    auto probe = plan.next(kBase + 3s);
    ASSERT_TRUE(probe->probe);
    plan.report(*probe, success(10ms), kBase + 3s);
    plan.finish(*probe, true, 1s, kBase + 4s);
  }
  EXPECT_EQ(a.in_flight(), 0);
  EXPECT_FALSE(a.cooling_down(kBase + 4s));
  EXPECT_FALSE(a.awaiting_probe(kBase + 4s));
}

TEST(Plan, FullDeploymentIsPassedOver) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, with_retries(1));
  cfg->models[0].deployments[0].max_parallel = 1;
  Router router(cfg);
  Plan first = router.plan(cfg->models[0], true, 1);
  Plan second = router.plan(cfg->models[0], true, 2);
  EXPECT_EQ(first.next(kBase)->deployment->id, "a");
  EXPECT_EQ(second.next(kBase)->deployment->id, "b");
}

TEST(Plan, NothingAvailableEndsThePlan) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a"})}, with_retries(2));
  cfg->models[0].deployments[0].max_parallel = 1;
  Router router(cfg);
  Plan holder = router.plan(cfg->models[0], true, 1);
  ASSERT_TRUE(holder.next(kBase));
  Plan plan = router.plan(cfg->models[0], true, 2);
  EXPECT_FALSE(plan.next(kBase));
  EXPECT_FALSE(plan.can_retry());
}

TEST(Plan, RpmBudgetIsTakenByNext) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, with_retries(1));
  cfg->models[0].deployments[0].rpm = 2;
  Router router(cfg);
  for (std::uint64_t seed = 0; seed < 2; ++seed) {
    Plan plan = router.plan(cfg->models[0], true, seed);
    auto attempt = plan.next(kBase);
    EXPECT_EQ(attempt->deployment->id, "a");
    plan.abandon(*attempt);
  }
  Plan third = router.plan(cfg->models[0], true, 3);
  EXPECT_EQ(third.next(kBase)->deployment->id, "b");
}

TEST(Plan, ADeploymentAtItsSharedLimitIsNoAttemptAndIsNotChosenAgain) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, with_retries(0));
  cfg->models[0].deployments[0].max_parallel = 1;
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  auto refused = plan.next(kBase);
  ASSERT_EQ(refused->deployment->id, "a");
  plan.at_shared_limit(*refused);
  // Its slot is given back, and the one attempt retries 0 allows is still
  // there, for the other deployment.
  EXPECT_EQ(router.state("a")->in_flight(), 0);
  EXPECT_TRUE(plan.can_retry());
  auto next = plan.next(kBase);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->deployment->id, "b");
  EXPECT_EQ(next->wait, Millis{0});
  plan.at_shared_limit(*next);
  // Both full elsewhere: the plan ends instead of asking again.
  EXPECT_FALSE(plan.next(kBase));
}

TEST(Plan, ExpiredCooldownLetsExactlyOneProbeThrough) {
  auto policy = with_retries(1);
  policy.cooldown.fails = 1;
  policy.cooldown.duration = 30s;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, policy);
  Router router(cfg);
  router.state("a")->record_failure(policy.cooldown, kBase);
  const TimePoint after = kBase + 30s;

  Plan prober = router.plan(cfg->models[0], true, 1);
  auto probe = prober.next(after);
  ASSERT_EQ(probe->deployment->id, "a");
  EXPECT_TRUE(probe->probe);

  Plan other = router.plan(cfg->models[0], true, 2);
  auto regular = other.next(after);
  EXPECT_EQ(regular->deployment->id, "b");
  EXPECT_FALSE(regular->probe);

  prober.report(*probe, success(20ms), after + 1s);
  EXPECT_FALSE(router.state("a")->cooldown_until().has_value());
  Plan later = router.plan(cfg->models[0], true, 3);
  auto back = later.next(after + 2s);
  EXPECT_EQ(back->deployment->id, "a");
  EXPECT_FALSE(back->probe);
}

TEST(Plan, FailedProbeCoolsTheDeploymentAgain) {
  auto policy = with_retries(1);
  policy.cooldown.fails = 3;
  policy.cooldown.duration = 30s;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, policy);
  Router router(cfg);
  for (int i = 0; i < 3; ++i) router.state("a")->record_failure(policy.cooldown, kBase);

  Plan prober = router.plan(cfg->models[0], true, 1);
  auto probe = prober.next(kBase + 30s);
  ASSERT_TRUE(probe->probe);
  prober.report(*probe, retriable(), kBase + 31s);
  EXPECT_TRUE(router.state("a")->cooling_down(kBase + 31s));

  // The retry goes elsewhere, and so do new requests.
  EXPECT_EQ(prober.next(kBase + 31s)->deployment->id, "b");
  Plan next_request = router.plan(cfg->models[0], true, 2);
  EXPECT_EQ(next_request.next(kBase + 40s)->deployment->id, "b");
}

TEST(Plan, AbandonedProbeFreesTheProbeForAnotherRequest) {
  auto policy = with_retries(1);
  policy.cooldown.fails = 1;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})}, policy);
  Router router(cfg);
  router.state("a")->record_failure(policy.cooldown, kBase);
  const TimePoint after = kBase + policy.cooldown.duration;

  Plan first = router.plan(cfg->models[0], true, 1);
  auto probe = first.next(after);
  ASSERT_TRUE(probe->probe);
  first.abandon(*probe);
  EXPECT_EQ(router.state("a")->in_flight(), 0);

  Plan second = router.plan(cfg->models[0], true, 2);
  auto again = second.next(after);
  EXPECT_EQ(again->deployment->id, "a");
  EXPECT_TRUE(again->probe);
}

TEST(Plan, AllCoolingStillGetsOneAttemptOnTheSoonest) {
  auto policy = with_retries(3);
  policy.cooldown.fails = 1;
  policy.cooldown.duration = 30s;
  auto requested = model("m", config::Strategy::priority, {"a", "b"});
  requested.fallbacks = {"backup"};
  auto cfg = make_config({requested, model("backup", config::Strategy::priority, {"c"})}, policy);
  Router router(cfg);
  router.state("a")->record_failure(policy.cooldown, kBase + 2s);
  router.state("b")->record_failure(policy.cooldown, kBase);

  Plan plan = router.plan(cfg->models[0], true, 1);
  auto first = plan.next(kBase + 5s);
  EXPECT_EQ(first->deployment->id, "b");
  EXPECT_FALSE(first->probe);
  plan.report(*first, retriable(), kBase + 5s);
  // Once the group has had its try, a healthy fallback beats the other cooling one.
  EXPECT_EQ(plan.next(kBase + 5s)->deployment->id, "c");
}

// ---------------------------------------------------------------------------
// hedging

TEST(PlanHedge, HedgeGoesToAnotherDeploymentOnlyOnce) {
  auto cfg = make_config({model("m", config::Strategy::latency, {"a", "b", "c"})},
                         hedging(config::Hedge::Mode::fixed, 500ms));
  Router router(cfg);
  for (std::uint64_t seed = 0; seed < 30; ++seed) {
    Plan plan = router.plan(cfg->models[0], true, seed);
    auto main = plan.next(kBase);
    ASSERT_TRUE(main);
    EXPECT_FALSE(main->hedge);
    EXPECT_EQ(main->hedge_after, 500ms);

    auto hedge = plan.next_hedge(kBase + 500ms);
    ASSERT_TRUE(hedge);
    EXPECT_TRUE(hedge->hedge);
    EXPECT_NE(hedge->deployment, main->deployment);
    EXPECT_FALSE(hedge->hedge_after.has_value());
    EXPECT_EQ(hedge->state->in_flight(), 1);
    EXPECT_EQ(plan.attempts_made(), 1u);
    EXPECT_FALSE(plan.next_hedge(kBase + 600ms));

    // The hedge won: the main attempt is abandoned and gives its slot back.
    plan.abandon(*main);
    plan.report(*hedge, success(300ms), kBase + 800ms);
    plan.finish(*hedge, true, 1s, kBase + 1s);
    EXPECT_EQ(main->state->in_flight(), 0);
    EXPECT_EQ(hedge->state->in_flight(), 0);
  }
}

TEST(PlanHedge, PrimaryThatLostToItsHedgeLeavesItsWaitAsATtftSample) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})},
                         hedging(config::Hedge::Mode::fixed, 500ms));
  Router router(cfg);
  auto& a = *router.state("a");
  auto& b = *router.state("b");

  Plan lost_primary = router.plan(cfg->models[0], true, 1);
  auto main = lost_primary.next(kBase);
  auto hedge = lost_primary.next_hedge(kBase + 500ms);
  lost_primary.report(*hedge, success(300ms), kBase + 800ms);
  lost_primary.lost_race(*main, 800ms, kBase + 800ms);
  lost_primary.finish(*hedge, true, 1s, kBase + 1s);
  const auto window = a.ttft.summary(kBase + 1s, 60s);
  EXPECT_EQ(window.samples, 1u);
  EXPECT_EQ(window.p50, 800ms);
  EXPECT_EQ(a.failures_total(), 0u);
  EXPECT_EQ(a.in_flight(), 0);

  // A hedge that lost began late: its wait is no sample of `b`.
  Plan lost_hedge = router.plan(cfg->models[0], true, 2);
  main = lost_hedge.next(kBase + 2s);
  hedge = lost_hedge.next_hedge(kBase + 2500ms);
  lost_hedge.report(*main, success(600ms), kBase + 2600ms);
  lost_hedge.lost_race(*hedge, 100ms, kBase + 2600ms);
  lost_hedge.finish(*main, true, 1s, kBase + 3s);
  EXPECT_EQ(b.ttft.summary(kBase + 3s, 60s).samples, 1u);  // its win above
  EXPECT_EQ(b.in_flight(), 0);
  EXPECT_EQ(b.failures_total(), 0u);
}

// Both deployments answer in 50-150 ms, but stall for 2 s on one request in
// 25. Hedging after the P95 should hedge about one request in twenty: those
// whose primary waits past it. A primary abandoned without a sample each
// time its hedge wins takes the stalls out of the window, its P95 sinks to
// the fast answers', and every stall is hedged on top of the slowest fast
// answers (about 9% of the requests).
TEST(PlanHedge, HedgeRateStaysNearFivePercentOnDeploymentsThatStall) {
  auto policy = hedging(config::Hedge::Mode::p95);
  policy.window = 200;
  auto cfg = make_config({model("m", config::Strategy::round_robin, {"a", "b"})}, policy);
  Router router(cfg);
  std::mt19937_64 random(42);
  std::uniform_int_distribution<int> fast_ms(50, 150);
  std::bernoulli_distribution stalls(0.04);
  auto latency = [&]() -> Micros {
    return stalls(random) ? 2000ms : milliseconds(fast_ms(random));
  };

  constexpr int kWarmUp = 2000, kMeasured = 4000;
  int hedged = 0;
  TimePoint now = kBase;
  for (int i = 0; i < kWarmUp + kMeasured; ++i, now += 20ms) {
    Plan plan = router.plan(cfg->models[0], true, static_cast<std::uint64_t>(i));
    auto main = plan.next(now);
    ASSERT_TRUE(main);
    const Micros primary = latency();
    if (!main->hedge_after || primary <= *main->hedge_after) {
      plan.report(*main, success(primary), now + primary);
      plan.finish(*main, true, primary, now + primary);
      continue;
    }
    if (i >= kWarmUp) ++hedged;
    const Micros after = *main->hedge_after;
    auto hedge = plan.next_hedge(now + after);
    ASSERT_TRUE(hedge);
    const Micros hedge_done = after + latency();
    const auto& winner = hedge_done < primary ? *hedge : *main;
    const auto& loser = hedge_done < primary ? *main : *hedge;
    const Micros won_at = std::min(hedge_done, primary);
    const Micros loser_began = &loser == &*hedge ? after : Micros{0};
    plan.report(winner, success(&winner == &*hedge ? won_at - after : won_at), now + won_at);
    plan.lost_race(loser, won_at - loser_began, now + won_at);
    plan.finish(winner, true, won_at, now + won_at);
  }
  const double rate = static_cast<double>(hedged) / kMeasured;
  EXPECT_GT(rate, 0.035);
  EXPECT_LT(rate, 0.07) << "the window's P95 sank: "
                        << router.state("a")->ttft.summary(now, 60s).p95.count() << " us";
}

TEST(PlanHedge, HedgeDoesNotCountAgainstRetries) {
  auto policy = hedging(config::Hedge::Mode::fixed, 100ms);
  policy.retries = 1;
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b", "c"})}, policy);
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  auto main = plan.next(kBase);
  auto hedge = plan.next_hedge(kBase);
  ASSERT_TRUE(hedge);
  plan.report(*main, retriable(), kBase);
  plan.report(*hedge, retriable(), kBase);
  EXPECT_TRUE(plan.can_retry());
  auto retry = plan.next(kBase);
  ASSERT_TRUE(retry);
  // Both deployments already used in this group count as tried.
  EXPECT_EQ(retry->deployment->id, "c");
  EXPECT_FALSE(retry->hedge_after.has_value());  // already hedged once
}

TEST(PlanHedge, NoHedgeInAOneDeploymentGroup) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a"})},
                         hedging(config::Hedge::Mode::fixed, 100ms));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  auto main = plan.next(kBase);
  EXPECT_FALSE(main->hedge_after.has_value());
  EXPECT_FALSE(plan.next_hedge(kBase));
}

TEST(PlanHedge, OffMeansNoHedgeAfter) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})},
                         hedging(config::Hedge::Mode::off));
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1);
  EXPECT_FALSE(plan.next(kBase)->hedge_after.has_value());
}

TEST(PlanHedge, P95HedgeAfterIsTheDeploymentsTtftP95) {
  auto cfg = make_config({model("m", config::Strategy::priority, {"a", "b"})},
                         hedging(config::Hedge::Mode::p95));
  Router router(cfg);
  auto& state = *router.state("a");
  for (int ms = 1; ms <= 4; ++ms) state.ttft.add(milliseconds(ms * 10), kBase);

  Plan too_few = router.plan(cfg->models[0], true, 1);
  auto attempt = too_few.next(kBase);
  EXPECT_FALSE(attempt->hedge_after.has_value());
  too_few.abandon(*attempt);

  for (int ms = 5; ms <= 20; ++ms) state.ttft.add(milliseconds(ms * 10), kBase);
  Plan plan = router.plan(cfg->models[0], true, 2);
  attempt = plan.next(kBase);
  ASSERT_TRUE(attempt->hedge_after.has_value());
  EXPECT_EQ(*attempt->hedge_after,
            std::chrono::duration_cast<Millis>(state.ttft.summary(kBase, 60s).p95));
  EXPECT_EQ(*attempt->hedge_after, 190ms);
}

}  // namespace
}  // namespace sluice::router

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "router/router_fixtures.hpp"
#include "sluice/router/adaptive.hpp"
#include "sluice/router/concurrency_limit.hpp"
#include "sluice/router/quality.hpp"
#include "sluice/router/router.hpp"

namespace sluice::router {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

config::Model model_with_auto_deadlines() {
  config::Model m;
  m.name = "m";
  m.strategy = config::Strategy::priority;
  config::Deployment d;
  d.id = "a";
  d.base_url = config::Url{"https", "api.example.test", 443, ""};
  d.upstream_model = "upstream-model";
  d.timeouts.ttft_auto = true;
  d.timeouts.idle_auto = true;
  m.deployments.push_back(std::move(d));
  return m;
}

config::Router adaptive_policy(unsigned window, unsigned min_samples) {
  config::Router policy;
  policy.window = window;
  policy.adaptive.min_samples = min_samples;
  policy.cooldown.fails = 1000;
  return policy;
}

void add_samples(LatencyWindow& window, milliseconds each, unsigned count, TimePoint at) {
  for (unsigned i = 0; i < count; ++i) window.add(each, at);
}

TEST(LatencyWindowQuantile, NearestRankP99) {
  LatencyWindow window(100);
  for (int i = 1; i <= 100; ++i) window.add(milliseconds(i), kBase);
  const auto p99 = window.quantile(kBase, 60s, 99);
  EXPECT_EQ(p99.samples, 100u);
  EXPECT_EQ(p99.value, 99ms);
  EXPECT_EQ(window.quantile(kBase, 60s, 100).value, 100ms);
  // Stale samples are left out.
  EXPECT_EQ(window.quantile(kBase + 61s, 60s, 99).samples, 0u);
}

TEST(AdaptiveDeadline, StaticDefaultUntilMinSamples) {
  LatencyWindow window(20);
  const config::AdaptiveDeadline policy{2.0, 500ms, 60s};
  add_samples(window, 400ms, 19, kBase);
  auto deadline = deadline_from(window, 10s, policy, 20, kBase);
  EXPECT_FALSE(deadline.measured);
  EXPECT_EQ(deadline.value, 10s);
  EXPECT_EQ(deadline.samples, 19u);

  window.add(400ms, kBase);
  deadline = deadline_from(window, 10s, policy, 20, kBase);
  EXPECT_TRUE(deadline.measured);
  EXPECT_EQ(deadline.value, 800ms);
}

TEST(AdaptiveDeadline, ClampedToFloorAndCeiling) {
  const config::AdaptiveDeadline policy{2.0, 500ms, 60s};
  LatencyWindow fast(4);
  add_samples(fast, 100ms, 4, kBase);
  EXPECT_EQ(deadline_from(fast, 10s, policy, 4, kBase).value, 500ms);
  LatencyWindow slow(4);
  add_samples(slow, 45s, 4, kBase);
  EXPECT_EQ(deadline_from(slow, 10s, policy, 4, kBase).value, 60s);
}

TEST(AdaptiveDeadline, FollowsTheP99NotTheMedian) {
  const config::AdaptiveDeadline policy{3.0, 1s, 120s};
  LatencyWindow window(100);
  add_samples(window, 100ms, 98, kBase);
  add_samples(window, 2s, 2, kBase);
  // P99 of 100 samples is the 99th smallest: one of the two slow ones.
  EXPECT_EQ(deadline_from(window, 30s, policy, 20, kBase).value, 6s);
}

TEST(AdaptiveDeadline, MinSamplesIsCappedAtTheWindow) {
  const config::AdaptiveDeadline policy{2.0, 500ms, 60s};
  LatencyWindow window(5);
  add_samples(window, 1s, 5, kBase);
  EXPECT_TRUE(deadline_from(window, 10s, policy, 20, kBase).measured);
}

TEST(AdaptiveDeadline, CachedForASecondThenRecomputed) {
  auto cfg = make_config({model_with_auto_deadlines()}, adaptive_policy(4, 4));
  Router router(cfg);
  const auto& deployment = cfg->models[0].deployments[0];
  auto& state = *router.state("a");

  // Nothing measured: the keys' static defaults.
  auto values = current_deadlines(deployment, cfg->router.adaptive, state, kBase);
  EXPECT_EQ(values.ttft, 10s);
  EXPECT_EQ(values.idle, 30s);

  add_samples(state.ttft, 1s, 4, kBase);
  add_samples(state.gaps, 2s, 4, kBase);
  values = current_deadlines(deployment, cfg->router.adaptive, state, kBase + 999ms);
  EXPECT_EQ(values.ttft, 10s) << "still the cached value";
  values = current_deadlines(deployment, cfg->router.adaptive, state, kBase + 1s);
  EXPECT_EQ(values.ttft, 2s);
  EXPECT_EQ(values.idle, 6s);
}

TEST(AdaptiveDeadline, StaticKeysAreReturnedAsConfigured) {
  auto m = model_with_auto_deadlines();
  m.deployments[0].timeouts.ttft_auto = false;
  m.deployments[0].timeouts.ttft = 7s;
  auto cfg = make_config({m}, adaptive_policy(4, 4));
  Router router(cfg);
  auto& state = *router.state("a");
  add_samples(state.ttft, 1s, 4, kBase);
  const auto values =
      current_deadlines(cfg->models[0].deployments[0], cfg->router.adaptive, state, kBase);
  EXPECT_EQ(values.ttft, 7s);
}

TEST(AdaptiveDeadline, TimeoutsAreCensoredSamplesSoTheDeadlineCannotRatchetDown) {
  auto cfg = make_config({model_with_auto_deadlines()}, adaptive_policy(10, 10));
  Router router(cfg);
  auto& state = *router.state("a");
  add_samples(state.ttft, 1s, 10, kBase);
  const auto& deployment = cfg->models[0].deployments[0];
  EXPECT_EQ(deadline_from(state.ttft, 10s, cfg->router.adaptive.ttft, 10, kBase).value, 2s);

  // The deployment slows down: every attempt now times out at the 2 s
  // deadline. Each timeout counts as a sample of 2 s, so the deadline
  // climbs instead of staying where the fast samples put it.
  TimePoint now = kBase + 2s;
  for (int i = 0; i < 10; ++i, now += 2s) {
    Plan plan = router.plan(cfg->models[0], true, 1);
    auto attempt = plan.next(now);
    ASSERT_TRUE(attempt);
    AttemptResult timed_out;
    timed_out.kind = ResultKind::retriable;
    timed_out.timed_out = true;
    timed_out.censored_ttft = current_deadlines(deployment, cfg->router.adaptive, state, now).ttft;
    plan.report(*attempt, timed_out, now);
  }
  const auto after = deadline_from(state.ttft, 10s, cfg->router.adaptive.ttft, 10, now);
  EXPECT_GE(after.value, 4s);
}

TEST(QualityGuard, JudgesTheAnswersEnd) {
  const config::Quality policy{true, 0};
  AnswerFacts good;
  good.stream = true;
  good.complete = true;
  good.saw_done = true;
  good.saw_finish_reason = true;
  good.completion_tokens = 12;
  EXPECT_EQ(judge_answer(good, policy), QualityFailure::none);

  auto no_done = good;
  no_done.saw_done = false;
  EXPECT_EQ(judge_answer(no_done, policy), QualityFailure::truncated);

  auto no_finish_reason = good;
  no_finish_reason.saw_finish_reason = false;
  EXPECT_EQ(judge_answer(no_finish_reason, policy), QualityFailure::truncated);

  auto cut_json = good;
  cut_json.stream = false;
  cut_json.json_ends_object = false;
  EXPECT_EQ(judge_answer(cut_json, policy), QualityFailure::truncated);

  auto empty = good;
  empty.completion_tokens = 0;
  EXPECT_EQ(judge_answer(empty, policy), QualityFailure::empty);

  auto stalled = good;
  stalled.complete = false;
  stalled.stalled = true;
  EXPECT_EQ(judge_answer(stalled, policy), QualityFailure::stalled);

  // A break of another kind is a failure already, not the guard's.
  auto broken = good;
  broken.complete = false;
  broken.saw_done = false;
  EXPECT_EQ(judge_answer(broken, policy), QualityFailure::none);
}

TEST(QualityGuard, LengthStopWellShortOfMaxTokens) {
  const config::Quality policy{true, 0};
  AnswerFacts facts;
  facts.complete = true;
  facts.finish_length = true;
  facts.completion_tokens = 50;
  EXPECT_EQ(judge_answer(facts, policy), QualityFailure::none) << "no max_tokens asked for";
  facts.max_tokens = 100;
  EXPECT_EQ(judge_answer(facts, policy), QualityFailure::length_early);
  facts.completion_tokens = 91;
  EXPECT_EQ(judge_answer(facts, policy), QualityFailure::none) << "within 10%";
  facts.completion_tokens = 50;
  facts.finish_length = false;
  EXPECT_EQ(judge_answer(facts, policy), QualityFailure::none) << "a stop of its own";
}

TEST(QualityGuard, SlowTokensOnlyWhenAsked) {
  AnswerFacts slow;
  slow.stream = true;
  slow.complete = true;
  slow.saw_done = true;
  slow.saw_finish_reason = true;
  slow.completion_tokens = 10;
  slow.streaming_time = 5s;  // 2 tokens a second
  EXPECT_EQ(judge_answer(slow, config::Quality{true, 0}), QualityFailure::none);
  EXPECT_EQ(judge_answer(slow, config::Quality{true, 5}), QualityFailure::slow_tokens);
  EXPECT_EQ(judge_answer(slow, config::Quality{true, 1}), QualityFailure::none);
}

TEST(QualityGuard, FailuresCountTowardTheCooldown) {
  auto policy = adaptive_policy(10, 10);
  policy.cooldown.fails = 2;
  auto cfg = make_config({model_with_auto_deadlines()}, policy);
  Router router(cfg);
  for (int i = 0; i < 2; ++i) {
    Plan plan = router.plan(cfg->models[0], true, 1);
    auto attempt = plan.next(kBase);
    ASSERT_TRUE(attempt);
    AttemptResult ok;
    ok.ttft = 10ms;
    plan.report(*attempt, ok, kBase);
    // The guard found the answer wanting: the attempt finishes as a failure.
    plan.finish(*attempt, false, 20ms, kBase);
  }
  EXPECT_TRUE(router.state("a")->cooling_down(kBase));
  EXPECT_DOUBLE_EQ(router.state("a")->recent_error_rate(kBase), 1.0);
}

// An upstream with `slots` requests served at once, each for `service`
// (its first byte `first_byte` after it is served), and the rest waiting in
// order: TTFT = first_byte + the wait. Offered load always exceeds what it
// serves. Runs for `duration` from `from` in 1 ms steps on a fake clock
// (requests in flight at the start of a run are forgotten); returns the
// limit at every step of the last third.
std::vector<unsigned> run_queueing_upstream(ConcurrencyLimit& limit,
                                            const config::AdaptiveConcurrency& policy,
                                            unsigned slots, milliseconds first_byte,
                                            milliseconds service, milliseconds duration,
                                            milliseconds from = milliseconds{0}) {
  struct Request {
    milliseconds sent;
    std::optional<milliseconds> started;
    bool reported = false;
  };
  std::vector<Request> in_flight;
  std::vector<unsigned> settled;
  unsigned busy = 0;
  for (milliseconds t = from; t < from + duration; t += 1ms) {
    const TimePoint now = kBase + t;
    std::erase_if(in_flight, [&](const Request& r) {
      const bool done = r.started && t >= *r.started + service;
      if (done) --busy;
      return done;
    });
    while (in_flight.size() < limit.current()) in_flight.push_back({t, std::nullopt});
    for (auto& request : in_flight) {
      if (busy >= slots) break;
      if (!request.started) {
        request.started = t;
        ++busy;
      }
    }
    for (auto& request : in_flight) {
      if (request.started && !request.reported && t >= *request.started + first_byte) {
        request.reported = true;
        limit.on_sample(t - request.sent, static_cast<int>(in_flight.size()), now, policy);
      }
    }
    if (t >= from + duration * 2 / 3) settled.push_back(limit.current());
  }
  return settled;
}

TEST(ConcurrencyLimit, SettlesNearTheUpstreamsSlots) {
  const config::AdaptiveConcurrency policy{1, 512, 1.5, 60s};
  ConcurrencyLimit limit(policy);
  EXPECT_EQ(limit.current(), ConcurrencyLimit::kInitial);
  const auto settled = run_queueing_upstream(limit, policy, 20, 50ms, 250ms, 30s);
  const auto [lowest, highest] = std::minmax_element(settled.begin(), settled.end());
  EXPECT_GE(*lowest, 14u);
  EXPECT_LE(*highest, 26u);
  // The baseline is the uncongested first byte, measured at the low limit.
  EXPECT_GE(limit.baseline(), 50ms);
  EXPECT_LT(limit.baseline(), 75ms);
}

TEST(ConcurrencyLimit, FindsMoreSlotsWhenThereAreMore) {
  const config::AdaptiveConcurrency policy{1, 512, 1.5, 60s};
  ConcurrencyLimit limit(policy);
  const auto settled = run_queueing_upstream(limit, policy, 100, 50ms, 250ms, 40s);
  const auto [lowest, highest] = std::minmax_element(settled.begin(), settled.end());
  EXPECT_GE(*lowest, 70u);
  EXPECT_LE(*highest, 130u);
}

TEST(ConcurrencyLimit, StaysWithinMinAndMax) {
  const config::AdaptiveConcurrency policy{4, 10, 1.5, 60s};
  ConcurrencyLimit limit(policy);
  EXPECT_EQ(limit.current(), 10u);
  const auto settled = run_queueing_upstream(limit, policy, 1, 50ms, 250ms, 10s);
  for (unsigned value : settled) {
    EXPECT_GE(value, 4u);
    EXPECT_LE(value, 10u);
  }
}

TEST(ConcurrencyLimit, ProbesAgainToFollowALastingSlowdown) {
  const config::AdaptiveConcurrency policy{1, 512, 1.5, 5s};
  ConcurrencyLimit limit(policy);
  run_queueing_upstream(limit, policy, 20, 50ms, 250ms, 10s);
  const auto before = limit.baseline();
  // The same upstream, four times slower for good: the baseline follows at
  // the next probe instead of cutting the limit to the floor.
  const auto settled = run_queueing_upstream(limit, policy, 20, 200ms, 1000ms, 30s, 10s);
  EXPECT_GE(limit.baseline(), before * 3);
  // Most of the time near the slots again (the probes, every 5 s here, take
  // a few seconds at the floor at this speed).
  auto sorted = settled;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GE(sorted[sorted.size() / 2], 12u);
}

TEST(ConcurrencyLimit, AutoMaxParallelSkipsADeploymentAtItsLimit) {
  auto m = model_with_auto_deadlines();
  m.deployments[0].max_parallel_auto = true;
  auto policy = adaptive_policy(10, 10);
  policy.adaptive.concurrency = {1, 2, 1.5, 60s};
  auto cfg = make_config({m}, policy);
  Router router(cfg);
  EXPECT_EQ(router.state("a")->max_parallel(cfg->models[0].deployments[0]), 2u);
  Plan first = router.plan(cfg->models[0], true, 1);
  Plan second = router.plan(cfg->models[0], true, 2);
  Plan third = router.plan(cfg->models[0], true, 3);
  EXPECT_TRUE(first.next(kBase));
  EXPECT_TRUE(second.next(kBase));
  EXPECT_FALSE(third.next(kBase)) << "both slots of the limit are taken";
}

config::Model two_for_prompt_classes() {
  config::Model m;
  m.name = "m";
  m.strategy = config::Strategy::latency;
  for (const char* id : {"short_fast", "long_fast"}) {
    config::Deployment d;
    d.id = id;
    d.base_url = config::Url{"https", std::string(id) + ".example.test", 443, ""};
    d.upstream_model = "upstream-model";
    m.deployments.push_back(std::move(d));
  }
  return m;
}

void feed_class(DeploymentState& state, std::size_t prompt_class, milliseconds each) {
  for (int i = 0; i < 6; ++i) {
    state.ttft.add(each, kBase);
    state.ttft_by_class[prompt_class].add(each, kBase);
  }
}

TEST(PromptClasses, ClassesByEstimatedInputTokens) {
  EXPECT_EQ(prompt_class_of(0), 0u);
  EXPECT_EQ(prompt_class_of(999), 0u);
  EXPECT_EQ(prompt_class_of(1000), 1u);
  EXPECT_EQ(prompt_class_of(7999), 1u);
  EXPECT_EQ(prompt_class_of(8000), 2u);
  EXPECT_EQ(prompt_class_of(31999), 2u);
  EXPECT_EQ(prompt_class_of(32000), 3u);
}

TEST(PromptClasses, LatencyIsComparedWithinTheRequestsClass) {
  auto policy = adaptive_policy(20, 10);
  policy.prompt_classes = true;
  policy.latency_buffer = 0;
  auto cfg = make_config({two_for_prompt_classes()}, policy);
  Router router(cfg);
  auto& short_fast = *router.state("short_fast");
  auto& long_fast = *router.state("long_fast");
  feed_class(short_fast, 0, 10ms);
  feed_class(short_fast, 3, 900ms);
  feed_class(long_fast, 0, 80ms);
  feed_class(long_fast, 3, 100ms);
  // Too few samples of their own in the middle classes: they borrow.
  for (auto* state : {&short_fast, &long_fast}) {
    for (std::size_t middle : {1u, 2u}) state->ttft_by_class[middle].add(500ms, kBase);
  }

  RandomBits random(7);
  const auto& group = cfg->models[0];
  const auto chosen = [&](std::size_t prompt_class) {
    return router.choose(group, true, {}, kBase, random, prompt_class)->id;
  };
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(chosen(0), "short_fast");
    EXPECT_EQ(chosen(3), "long_fast");
    // 1k-8k has too few samples: the class below decides. 8k-32k has too
    // few, and so has the class below it: the class above decides.
    EXPECT_EQ(chosen(1), "short_fast");
    EXPECT_EQ(chosen(2), "long_fast");
  }
  // Whole windows: short_fast's P50 mixes both sizes.
  EXPECT_EQ(ttft_summary(short_fast, kNoPromptClass, kBase, 60s, 5).samples, 12u);
}

TEST(PromptClasses, ADeploymentWithNothingOfTheRequestsSizeGoesFirst) {
  auto policy = adaptive_policy(20, 10);
  policy.prompt_classes = true;
  auto cfg = make_config({two_for_prompt_classes()}, policy);
  Router router(cfg);
  // short_fast looked slow on long prompts and has never had a short one.
  feed_class(*router.state("short_fast"), 3, 900ms);
  feed_class(*router.state("long_fast"), 0, 100ms);
  RandomBits random(3);
  EXPECT_EQ(router.choose(cfg->models[0], true, {}, kBase, random, 0)->id, "short_fast");
}

TEST(PromptClasses, AdaptiveDeadlineReadsTheClassWindow) {
  auto m = model_with_auto_deadlines();
  auto policy = adaptive_policy(20, 5);
  policy.prompt_classes = true;
  auto cfg = make_config({m}, policy);
  Router router(cfg);
  auto& state = *router.state("a");
  for (int i = 0; i < 5; ++i) {
    state.ttft.add(100ms, kBase);
    state.ttft_by_class[0].add(100ms, kBase);
    state.ttft.add(4s, kBase);
    state.ttft_by_class[3].add(4s, kBase);
  }
  const auto& deployment = cfg->models[0].deployments[0];
  EXPECT_EQ(current_deadlines(deployment, cfg->router.adaptive, state, kBase, 0).ttft, 500ms)
      << "2 x 100 ms, raised to the floor";
  EXPECT_EQ(current_deadlines(deployment, cfg->router.adaptive, state, kBase, 3).ttft, 8s);
  EXPECT_EQ(current_deadlines(deployment, cfg->router.adaptive, state, kBase).ttft, 8s)
      << "the whole window's P99";
}

TEST(PromptClasses, PlansFeedTheirClassWindow) {
  auto policy = adaptive_policy(20, 5);
  policy.prompt_classes = true;
  auto cfg = make_config({model_with_auto_deadlines()}, policy);
  Router router(cfg);
  Plan plan = router.plan(cfg->models[0], true, 1, 2);
  auto attempt = plan.next(kBase);
  ASSERT_TRUE(attempt);
  EXPECT_EQ(attempt->prompt_class, 2u);
  AttemptResult ok;
  ok.ttft = 30ms;
  plan.report(*attempt, ok, kBase);
  plan.finish(*attempt, true, 40ms, kBase);
  EXPECT_EQ(router.state("a")->ttft_by_class[2].fresh_samples(kBase, 60s), 1u);
  EXPECT_EQ(router.state("a")->ttft.fresh_samples(kBase, 60s), 1u);

  // Off: no class, whatever the caller passes.
  auto off = make_config({model_with_auto_deadlines()}, adaptive_policy(20, 5));
  Router plain(off);
  EXPECT_EQ(plain.plan(off->models[0], true, 1, 2).prompt_class(), kNoPromptClass);
}

}  // namespace
}  // namespace sluice::router

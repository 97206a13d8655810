#include <gtest/gtest.h>

#include <chrono>

#include "router/router_fixtures.hpp"
#include "sluice/router/deployment_state.hpp"

namespace sluice::router {
namespace {

using namespace std::chrono_literals;

config::Cooldown policy(unsigned fails, config::Duration within, config::Duration duration) {
  config::Cooldown cooldown;
  cooldown.fails = fails;
  cooldown.within = within;
  cooldown.duration = duration;
  return cooldown;
}

TEST(DeploymentState, InFlightIsBoundedByMaxParallel) {
  DeploymentState state(8, kBase);
  EXPECT_TRUE(state.try_acquire(2));
  EXPECT_TRUE(state.try_acquire(2));
  EXPECT_FALSE(state.try_acquire(2));
  EXPECT_EQ(state.in_flight(), 2);
  state.release();
  EXPECT_EQ(state.in_flight(), 1);
  EXPECT_TRUE(state.try_acquire(2));
}

TEST(DeploymentState, ZeroMaxParallelIsUnlimited) {
  DeploymentState state(8, kBase);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(state.try_acquire(0));
  EXPECT_EQ(state.in_flight(), 1000);
}

TEST(DeploymentState, RpmIsABurstThenOneEveryIntervalAsAKeysRpm) {
  DeploymentState state(8, kBase);
  // rpm 3: a burst of three, then one every 20 s.
  EXPECT_TRUE(state.rpm_available(3, kBase + 1s));
  EXPECT_TRUE(state.try_take_rpm(3, kBase + 1s));
  EXPECT_TRUE(state.try_take_rpm(3, kBase + 1s));
  EXPECT_TRUE(state.try_take_rpm(3, kBase + 1s));
  EXPECT_FALSE(state.rpm_available(3, kBase + 1s));
  EXPECT_FALSE(state.try_take_rpm(3, kBase + 20s));

  EXPECT_TRUE(state.rpm_available(3, kBase + 21s));
  EXPECT_TRUE(state.try_take_rpm(3, kBase + 21s));
  EXPECT_FALSE(state.try_take_rpm(3, kBase + 21s));
  EXPECT_FALSE(state.rpm_available(3, kBase + 40s));
  EXPECT_TRUE(state.rpm_available(3, kBase + 41s));
}

TEST(DeploymentState, ZeroRpmIsUnlimited) {
  DeploymentState state(8, kBase);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(state.try_take_rpm(0, kBase));
  EXPECT_TRUE(state.rpm_available(0, kBase));
}

TEST(DeploymentState, RpmWorksForClocksBeforeTheEpoch) {
  DeploymentState state(8, kBase);
  EXPECT_TRUE(state.try_take_rpm(1, kBase - 10s));
  EXPECT_FALSE(state.try_take_rpm(1, kBase - 5s));
  EXPECT_FALSE(state.try_take_rpm(1, kBase + 49s));
  EXPECT_TRUE(state.try_take_rpm(1, kBase + 50s));
}

TEST(DeploymentState, CoolsDownAfterFailsWithinTheWindow) {
  DeploymentState state(8, kBase);
  const auto cooldown = policy(3, 60s, 30s);
  state.record_failure(cooldown, kBase);
  state.record_failure(cooldown, kBase + 10s);
  EXPECT_FALSE(state.cooling_down(kBase + 10s));
  EXPECT_FALSE(state.cooldown_until().has_value());

  state.record_failure(cooldown, kBase + 20s);
  EXPECT_TRUE(state.cooling_down(kBase + 20s));
  ASSERT_TRUE(state.cooldown_until().has_value());
  EXPECT_EQ(*state.cooldown_until(), kBase + 50s);
  EXPECT_TRUE(state.cooling_down(kBase + 49s));
  EXPECT_FALSE(state.claim_probe(kBase + 49s));
}

TEST(DeploymentState, FailuresSpreadBeyondTheWindowDoNotCoolDown) {
  DeploymentState state(8, kBase);
  const auto cooldown = policy(3, 60s, 30s);
  state.record_failure(cooldown, kBase);
  state.record_failure(cooldown, kBase + 40s);
  state.record_failure(cooldown, kBase + 80s);  // the window from 0 s has closed
  state.record_failure(cooldown, kBase + 100s);
  EXPECT_FALSE(state.cooling_down(kBase + 100s));
  EXPECT_FALSE(state.cooldown_until().has_value());

  // The window opened at 80 s holds 80 s, 100 s and now 110 s.
  state.record_failure(cooldown, kBase + 110s);
  EXPECT_TRUE(state.cooling_down(kBase + 110s));
}

TEST(DeploymentState, ExactlyOneProbeAfterTheCooldownAndItsSuccessEndsIt) {
  DeploymentState state(8, kBase);
  const auto cooldown = policy(1, 60s, 30s);
  state.record_failure(cooldown, kBase);
  EXPECT_FALSE(state.awaiting_probe(kBase + 29s));

  const TimePoint after = kBase + 30s;
  EXPECT_FALSE(state.cooling_down(after));
  EXPECT_TRUE(state.awaiting_probe(after));
  EXPECT_TRUE(state.probe_available(after));
  EXPECT_TRUE(state.claim_probe(after));
  EXPECT_FALSE(state.claim_probe(after));
  EXPECT_FALSE(state.claim_probe(after + 5s));
  EXPECT_FALSE(state.probe_available(after));
  EXPECT_TRUE(state.awaiting_probe(after));

  state.record_success(after + 1s);
  EXPECT_FALSE(state.awaiting_probe(after + 1s));
  EXPECT_FALSE(state.cooldown_until().has_value());
  EXPECT_FALSE(state.claim_probe(after + 2s));  // nothing to probe any more
}

TEST(DeploymentState, FailedProbeStartsAnotherCooldownAtOnce) {
  DeploymentState state(8, kBase);
  const auto cooldown = policy(3, 60s, 30s);
  for (int i = 0; i < 3; ++i) state.record_failure(cooldown, kBase);
  ASSERT_TRUE(state.claim_probe(kBase + 30s));

  state.record_failure(cooldown, kBase + 31s);  // one failure, not three
  EXPECT_TRUE(state.cooling_down(kBase + 31s));
  EXPECT_EQ(*state.cooldown_until(), kBase + 61s);
  EXPECT_FALSE(state.claim_probe(kBase + 60s));
  EXPECT_TRUE(state.claim_probe(kBase + 61s));
}

TEST(DeploymentState, ReleasedProbeCanBeClaimedAgain) {
  DeploymentState state(8, kBase);
  state.record_failure(policy(1, 60s, 10s), kBase);
  ASSERT_TRUE(state.claim_probe(kBase + 10s));
  state.release_probe();
  EXPECT_TRUE(state.awaiting_probe(kBase + 10s));
  EXPECT_TRUE(state.claim_probe(kBase + 10s));
}

TEST(DeploymentState, FailuresDuringACooldownDoNotExtendIt) {
  DeploymentState state(8, kBase);
  const auto cooldown = policy(1, 60s, 30s);
  state.record_failure(cooldown, kBase);
  state.record_failure(cooldown, kBase + 20s);
  EXPECT_EQ(*state.cooldown_until(), kBase + 30s);
}

TEST(DeploymentState, SuccessDuringACooldownDoesNotEndIt) {
  DeploymentState state(8, kBase);
  state.record_failure(policy(1, 60s, 30s), kBase);
  state.record_success(kBase + 5s);
  EXPECT_TRUE(state.cooling_down(kBase + 5s));
}

TEST(DeploymentState, ZeroFailsDisablesCooldown) {
  DeploymentState state(8, kBase);
  for (int i = 0; i < 10; ++i) state.record_failure(policy(0, 60s, 30s), kBase);
  EXPECT_FALSE(state.cooling_down(kBase));
  EXPECT_FALSE(state.cooldown_until().has_value());
}

TEST(DeploymentState, MidstreamFailureCountsTowardCooldownButNotAsAnAttempt) {
  DeploymentState state(8, kBase);
  const auto cooldown = policy(2, 60s, 30s);
  state.record_success(kBase);
  state.record_midstream_failure(cooldown, kBase + 1s);
  EXPECT_EQ(state.attempts_total(), 1u);
  EXPECT_EQ(state.failures_total(), 1u);
  state.record_failure(cooldown, kBase + 2s);
  EXPECT_TRUE(state.cooling_down(kBase + 2s));
  EXPECT_EQ(state.attempts_total(), 2u);
  EXPECT_EQ(state.failures_total(), 2u);
}

TEST(DeploymentState, RecentErrorRateCoversTheCurrentAndPreviousMinute) {
  DeploymentState state(8, kBase);
  const auto cooldown = policy(100, 60s, 30s);
  EXPECT_EQ(state.recent_error_rate(kBase), 0.0);
  state.record_success(kBase + 1s);
  state.record_success(kBase + 2s);
  state.record_success(kBase + 3s);
  state.record_failure(cooldown, kBase + 4s);
  EXPECT_DOUBLE_EQ(state.recent_error_rate(kBase + 5s), 0.25);
  EXPECT_DOUBLE_EQ(state.recent_error_rate(kBase + 90s), 0.25);  // previous minute
  EXPECT_EQ(state.recent_error_rate(kBase + 150s), 0.0);

  state.record_failure(cooldown, kBase + 150s);  // a new minute starts from scratch
  EXPECT_DOUBLE_EQ(state.recent_error_rate(kBase + 150s), 1.0);
  EXPECT_EQ(state.attempts_total(), 5u);
  EXPECT_EQ(state.failures_total(), 2u);
}

}  // namespace
}  // namespace sluice::router

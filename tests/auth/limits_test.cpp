// The per-key limiters on an explicit clock: no sleeps, every instant named.

#include "sluice/auth/limits.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace sluice::auth {
namespace {

using namespace std::chrono_literals;

// An arbitrary instant; the limiters must not care where the clock starts.
const TimePoint kStart = TimePoint{} + 1000h;

// ---------------------------------------------------------------------------
// Gcra (rpm)

TEST(Gcra, ABurstOfExactlyRpmPassesThenTheNextWaitsOneInterval) {
  Gcra rpm(600);  // one request every 100ms
  for (int index = 0; index < 600; ++index) {
    ASSERT_TRUE(rpm.try_acquire(kStart).allowed) << index;
  }
  Decision denied = rpm.try_acquire(kStart);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.retry_after, 100ms);
  EXPECT_EQ(denied.remaining, 0u);
  EXPECT_EQ(denied.reset_after, 60s);

  EXPECT_FALSE(rpm.try_acquire(kStart + 99ms).allowed);
  Decision again = rpm.try_acquire(kStart + 100ms);
  EXPECT_TRUE(again.allowed);
  EXPECT_EQ(again.remaining, 0u);
  EXPECT_FALSE(rpm.try_acquire(kStart + 100ms).allowed);
  EXPECT_TRUE(rpm.try_acquire(kStart + 200ms).allowed);
}

TEST(Gcra, RemainingAndResetAfter) {
  Gcra rpm(600);
  Decision first = rpm.try_acquire(kStart);
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 599u);
  EXPECT_EQ(first.reset_after, 100ms);
  EXPECT_EQ(first.retry_after, 0ns);

  for (int index = 0; index < 9; ++index) rpm.try_acquire(kStart);
  EXPECT_EQ(rpm.remaining(kStart), 590u);
  EXPECT_EQ(rpm.reset_after(kStart), 1s);
  // Half a second later five requests' worth have come back.
  EXPECT_EQ(rpm.remaining(kStart + 500ms), 595u);
  EXPECT_EQ(rpm.reset_after(kStart + 500ms), 500ms);
  // And after the reset time the budget is whole, not more than whole.
  EXPECT_EQ(rpm.remaining(kStart + 10s), 600u);
  EXPECT_EQ(rpm.reset_after(kStart + 10s), 0ns);
}

TEST(Gcra, FreshBudgetIsWhole) {
  Gcra rpm(60);
  EXPECT_EQ(rpm.remaining(kStart), 60u);
  EXPECT_EQ(rpm.reset_after(kStart), 0ns);
  EXPECT_EQ(rpm.limit(), 60u);
}

TEST(Gcra, IdleTimeDoesNotBankMoreThanAMinute) {
  Gcra rpm(3);
  EXPECT_TRUE(rpm.try_acquire(kStart).allowed);
  const TimePoint later = kStart + 1h;
  for (int index = 0; index < 3; ++index) EXPECT_TRUE(rpm.try_acquire(later).allowed);
  EXPECT_FALSE(rpm.try_acquire(later).allowed);
}

TEST(Gcra, RpmThatDoesNotDivideAMinute) {
  Gcra rpm(7);
  for (int index = 0; index < 7; ++index) ASSERT_TRUE(rpm.try_acquire(kStart).allowed);
  Decision denied = rpm.try_acquire(kStart);
  EXPECT_FALSE(denied.allowed);
  EXPECT_NEAR(std::chrono::duration<double>(denied.retry_after).count(), 60.0 / 7, 1e-6);
}

TEST(Gcra, RefundGivesTheRequestBack) {
  Gcra rpm(2);
  EXPECT_TRUE(rpm.try_acquire(kStart).allowed);
  EXPECT_TRUE(rpm.try_acquire(kStart).allowed);
  rpm.refund();
  EXPECT_EQ(rpm.remaining(kStart), 1u);
  EXPECT_TRUE(rpm.try_acquire(kStart).allowed);
  EXPECT_FALSE(rpm.try_acquire(kStart).allowed);
}

TEST(Gcra, ZeroMeansUnlimited) {
  Gcra rpm(0);
  for (int index = 0; index < 10000; ++index) ASSERT_TRUE(rpm.try_acquire(kStart).allowed);
}

// ---------------------------------------------------------------------------
// TokenBucket (tpm)

TEST(TokenBucket, ReserveCountsDownAndResets) {
  TokenBucket tpm(600);  // 10 tokens a second
  Decision first = tpm.reserve(100, kStart);
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 500u);
  EXPECT_EQ(first.reset_after, 10s);
  EXPECT_EQ(tpm.remaining(kStart + 5s), 550u);
  EXPECT_EQ(tpm.remaining(kStart + 10s), 600u);
  EXPECT_EQ(tpm.reset_after(kStart + 10s), 0ns);
}

TEST(TokenBucket, SettlingWithFewerTokensGivesBudgetBack) {
  TokenBucket tpm(600);
  tpm.reserve(300, kStart);
  EXPECT_EQ(tpm.remaining(kStart), 300u);
  tpm.settle(300, 100, kStart);
  EXPECT_EQ(tpm.remaining(kStart), 500u);
}

TEST(TokenBucket, SettlingWithMoreTokensTakesMore) {
  TokenBucket tpm(600);
  tpm.reserve(100, kStart);
  tpm.settle(100, 250, kStart);
  EXPECT_EQ(tpm.remaining(kStart), 350u);
  EXPECT_EQ(tpm.reset_after(kStart), 25s);
}

TEST(TokenBucket, SettlingNeverFillsBeyondFull) {
  TokenBucket tpm(600);
  tpm.reserve(100, kStart);
  tpm.settle(100, 0, kStart + 2s);
  EXPECT_EQ(tpm.remaining(kStart + 2s), 600u);
  // A give-back long after the budget refilled changes nothing either.
  tpm.reserve(100, kStart + 1h);
  tpm.settle(100, 0, kStart + 2h);
  EXPECT_EQ(tpm.remaining(kStart + 2h), 600u);
  EXPECT_TRUE(tpm.reserve(600, kStart + 2h).allowed);
  EXPECT_FALSE(tpm.reserve(1, kStart + 2h).allowed);
}

TEST(TokenBucket, DeniedOnceExhaustedAndRecoversOverTime) {
  TokenBucket tpm(600);
  EXPECT_TRUE(tpm.reserve(600, kStart).allowed);
  Decision denied = tpm.reserve(1, kStart);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 0u);
  EXPECT_EQ(denied.reset_after, 60s);
  EXPECT_GT(denied.retry_after, 0ns);
  EXPECT_LE(denied.retry_after, 1ms);

  Decision later = tpm.reserve(1, kStart + 100ms);
  EXPECT_TRUE(later.allowed);
  EXPECT_EQ(later.remaining, 0u);
}

TEST(TokenBucket, OneLargeRequestGoesThroughAndTheOthersWaitOutItsDebt) {
  TokenBucket tpm(600);
  Decision big = tpm.reserve(6000, kStart);  // ten minutes' worth
  EXPECT_TRUE(big.allowed);
  EXPECT_EQ(big.remaining, 0u);
  EXPECT_EQ(big.reset_after, 600s);

  Decision denied = tpm.reserve(10, kStart + 1s);
  EXPECT_FALSE(denied.allowed);
  EXPECT_NEAR(std::chrono::duration<double>(denied.retry_after).count(), 539.0, 0.001);
  EXPECT_FALSE(tpm.reserve(10, kStart + 539s).allowed);
  EXPECT_TRUE(tpm.reserve(10, kStart + 540s + 1ms).allowed);
}

TEST(TokenBucket, ZeroMeansUnlimited) {
  TokenBucket tpm(0);
  EXPECT_TRUE(tpm.reserve(1'000'000'000, kStart).allowed);
  EXPECT_TRUE(tpm.reserve(1'000'000'000, kStart).allowed);
  tpm.settle(1, 1'000'000'000'000ULL, kStart);
  EXPECT_TRUE(tpm.reserve(1, kStart).allowed);
}

TEST(TokenBucket, HugeCountsDoNotOverflow) {
  TokenBucket tpm(1);
  EXPECT_TRUE(tpm.reserve(std::numeric_limits<std::uint64_t>::max(), kStart).allowed);
  EXPECT_FALSE(tpm.reserve(1, kStart).allowed);
  tpm.settle(1, std::numeric_limits<std::uint64_t>::max(), kStart);
  EXPECT_FALSE(tpm.reserve(1, kStart + 1h).allowed);
  EXPECT_EQ(tpm.remaining(kStart), 0u);

  TokenBucket generous(std::numeric_limits<std::uint64_t>::max());
  EXPECT_TRUE(generous.reserve(std::numeric_limits<std::uint64_t>::max(), kStart).allowed);
}

// ---------------------------------------------------------------------------
// ParallelLimit

TEST(ParallelLimit, AcquireUpToMaxThenRelease) {
  ParallelLimit limit(2);
  EXPECT_TRUE(limit.try_acquire());
  EXPECT_TRUE(limit.try_acquire());
  EXPECT_FALSE(limit.try_acquire());
  EXPECT_EQ(limit.in_flight(), 2u);
  limit.release();
  EXPECT_TRUE(limit.try_acquire());
}

TEST(ParallelLimit, ZeroMeansUnlimitedButCounts) {
  ParallelLimit limit(0);
  for (int index = 0; index < 1000; ++index) ASSERT_TRUE(limit.try_acquire());
  EXPECT_EQ(limit.in_flight(), 1000u);
}

TEST(ParallelLimit, FourThreadsNeverExceedMax) {
  constexpr unsigned kMax = 3;
  ParallelLimit limit(kMax);
  std::atomic<unsigned> holding{0};
  std::atomic<unsigned> most_seen{0};
  std::atomic<unsigned> acquired{0};

  std::vector<std::thread> threads;
  for (int thread = 0; thread < 4; ++thread) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20000; ++round) {
        if (!limit.try_acquire()) continue;
        unsigned now_holding = holding.fetch_add(1) + 1;
        unsigned seen = most_seen.load();
        while (now_holding > seen && !most_seen.compare_exchange_weak(seen, now_holding)) {
        }
        acquired.fetch_add(1);
        holding.fetch_sub(1);
        limit.release();
      }
    });
  }
  for (auto& thread : threads) thread.join();

  EXPECT_LE(most_seen.load(), kMax);
  EXPECT_GT(acquired.load(), 0u);
  EXPECT_EQ(limit.in_flight(), 0u);
}

// ---------------------------------------------------------------------------
// LimiterRegistry

config::Auth auth_with(std::vector<std::pair<std::string, config::ApiKeyLimits>> keys) {
  config::Auth auth;
  unsigned char seed = 0;
  for (auto& [name, limits] : keys) {
    config::ApiKey key;
    key.name = name;
    key.key_sha256.fill(++seed);
    key.limits = limits;
    auth.keys.push_back(std::move(key));
  }
  return auth;
}

TEST(LimiterRegistry, OneStatePerKey) {
  LimiterRegistry registry(auth_with({{"a", {60, 0, 0}}, {"b", {0, 1000, 4}}}), nullptr);
  EXPECT_EQ(registry.size(), 2u);
  ASSERT_NE(registry.find("a"), nullptr);
  EXPECT_EQ(registry.find("a")->requests.limit(), 60u);
  EXPECT_EQ(registry.find("b")->tokens.limit(), 1000u);
  EXPECT_EQ(registry.find("b")->parallel.limit(), 4u);
  EXPECT_EQ(registry.find("c"), nullptr);
}

TEST(LimiterRegistry, RebuildCarriesUnchangedKeysAndResetsChangedOnes) {
  LimiterRegistry first(auth_with({{"same", {60, 1000, 2}}, {"changed", {60, 0, 0}}, {"gone", {}}}),
                        nullptr);
  first.find("same")->requests.try_acquire(kStart);
  first.find("same")->tokens.reserve(400, kStart);
  ASSERT_TRUE(first.find("same")->parallel.try_acquire());
  first.find("changed")->requests.try_acquire(kStart);

  LimiterRegistry second(
      auth_with({{"same", {60, 1000, 2}}, {"changed", {120, 0, 0}}, {"new", {10, 0, 0}}}), &first);

  KeyLimits* same = second.find("same");
  EXPECT_EQ(same, first.find("same"));
  EXPECT_EQ(same->requests.remaining(kStart), 59u);
  EXPECT_EQ(same->tokens.remaining(kStart), 600u);
  EXPECT_EQ(same->parallel.in_flight(), 1u);

  KeyLimits* changed = second.find("changed");
  EXPECT_NE(changed, first.find("changed"));
  EXPECT_EQ(changed->requests.limit(), 120u);
  EXPECT_EQ(changed->requests.remaining(kStart), 120u);

  EXPECT_EQ(second.find("gone"), nullptr);
  EXPECT_EQ(second.find("new")->requests.remaining(kStart), 10u);
}

TEST(LimiterRegistry, CarriedStateOutlivesThePreviousRegistry) {
  auto first = std::make_unique<LimiterRegistry>(auth_with({{"a", {1, 0, 0}}}), nullptr);
  first->find("a")->requests.try_acquire(kStart);
  LimiterRegistry second(auth_with({{"a", {1, 0, 0}}}), first.get());
  first.reset();
  EXPECT_FALSE(second.find("a")->requests.try_acquire(kStart).allowed);
}

}  // namespace
}  // namespace sluice::auth

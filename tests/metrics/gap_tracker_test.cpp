#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "sluice/metrics/gap_tracker.hpp"

namespace sluice::metrics {
namespace {

using namespace std::chrono_literals;
using std::chrono::microseconds;

const TimePoint kStart = Clock::now();

TEST(GapTracker, NoGapsBeforeTheSecondEvent) {
  GapTracker tracker;
  EXPECT_EQ(tracker.gaps(), 0u);
  EXPECT_FALSE(tracker.p50());
  EXPECT_FALSE(tracker.max());
  tracker.on_event(kStart);
  EXPECT_EQ(tracker.gaps(), 0u);
  EXPECT_FALSE(tracker.p50());
  EXPECT_FALSE(tracker.last_gap());
  tracker.on_event(kStart + 30ms);
  EXPECT_EQ(tracker.gaps(), 1u);
  EXPECT_EQ(tracker.p50(), Clock::duration(30ms));
  EXPECT_EQ(tracker.max(), Clock::duration(30ms));
  EXPECT_EQ(tracker.last_gap(), Clock::duration(30ms));
}

TEST(GapTracker, ExactPercentilesWhileTheReservoirHoldsEveryGap) {
  GapTracker tracker;
  TimePoint now = kStart;
  tracker.on_event(now);
  // Gaps 1..9 ms in a shuffled order.
  for (int gap_ms : {5, 1, 9, 3, 7, 2, 8, 4, 6}) {
    now += std::chrono::milliseconds(gap_ms);
    tracker.on_event(now);
  }
  EXPECT_EQ(tracker.gaps(), 9u);
  EXPECT_EQ(tracker.p50(), Clock::duration(5ms));
  EXPECT_EQ(tracker.max(), Clock::duration(9ms));
  EXPECT_EQ(tracker.quantile(1.0), Clock::duration(9ms));
  EXPECT_EQ(tracker.quantile(0.0), Clock::duration(1ms));  // rank clamps to the smallest
  EXPECT_EQ(tracker.quantile(0.9), Clock::duration(9ms));  // nearest rank: ceil(8.1) = 9th
}

TEST(GapTracker, EvenCountTakesTheLowerMiddle) {
  GapTracker tracker;
  for (auto gap : {10ms, 20ms, 30ms, 40ms}) tracker.record_gap(gap);
  EXPECT_EQ(tracker.p50(), Clock::duration(20ms));
}

TEST(GapTracker, MaxStaysExactPastTheReservoir) {
  GapTracker tracker(42);
  for (int i = 0; i < 100'000; ++i) tracker.record_gap(i == 77'777 ? 2s : 10ms);
  EXPECT_EQ(tracker.gaps(), 100'000u);
  EXPECT_EQ(tracker.max(), Clock::duration(2s));
  EXPECT_EQ(tracker.p50(), Clock::duration(10ms));
}

// 20,000 gaps spread uniformly over 0..19.999 ms: the true median is 10 ms.
// A 64-sample reservoir estimates it with a standard error of about 1.25 ms
// here; allow 4 sigma.
double reservoir_p50_ms(const std::vector<int>& gaps_us, std::uint64_t seed) {
  GapTracker tracker(seed);
  for (int micros : gaps_us) tracker.record_gap(microseconds(micros));
  EXPECT_EQ(tracker.max(), Clock::duration(microseconds(19'999)));
  return std::chrono::duration<double, std::milli>(*tracker.p50()).count();
}

TEST(GapTracker, ReservoirMedianIsCloseForLongStreams) {
  std::vector<int> shuffled(20'000);
  for (int i = 0; i < 20'000; ++i) shuffled[i] = (i * 7919) % 20'000;  // a fixed permutation
  EXPECT_NEAR(reservoir_p50_ms(shuffled, 7), 10.0, 5.0);
}

TEST(GapTracker, ReservoirSamplesTheWholeStreamNotItsEnds) {
  // Gaps that grow through the stream: a reservoir that kept the first
  // gaps would report about 0.03 ms, one that kept the last about 19.97 ms.
  std::vector<int> growing(20'000);
  for (int i = 0; i < 20'000; ++i) growing[i] = i;
  for (std::uint64_t seed : {1u, 2u, 3u}) EXPECT_NEAR(reservoir_p50_ms(growing, seed), 10.0, 5.0);
}

TEST(GapTracker, NegativeGapsCountAsZeroAndHugeOnesSaturate) {
  GapTracker tracker;
  tracker.record_gap(-5ms);
  EXPECT_EQ(tracker.p50(), Clock::duration::zero());
  GapTracker huge;
  huge.record_gap(std::chrono::hours(100));
  EXPECT_EQ(huge.max(), Clock::duration(std::chrono::hours(100)));  // exact
  EXPECT_GT(*huge.p50(), Clock::duration(std::chrono::hours(1)));   // saturated, ~71 min
}

TEST(GapTracker, FitsInsideARequest) {
  static_assert(sizeof(GapTracker) <= 320);
  SUCCEED();
}

}  // namespace
}  // namespace sluice::metrics

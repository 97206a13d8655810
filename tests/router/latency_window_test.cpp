#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "router/router_fixtures.hpp"
#include "sluice/router/deployment_state.hpp"

namespace sluice::router {
namespace {

using namespace std::chrono_literals;
using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(LatencyWindow, EmptyWindowHasNoSamples) {
  LatencyWindow window(8);
  const auto summary = window.summary(kBase, 60s);
  EXPECT_EQ(summary.samples, 0u);
  EXPECT_EQ(summary.p50, 0us);
  EXPECT_EQ(summary.p95, 0us);
}

TEST(LatencyWindow, NearestRankPercentilesOnTwentySamples) {
  LatencyWindow window(20);
  std::vector<int> ms;
  for (int i = 1; i <= 20; ++i) ms.push_back(i);
  std::shuffle(ms.begin(), ms.end(), std::mt19937_64(7));
  for (int value : ms) window.add(milliseconds(value), kBase);

  const auto summary = window.summary(kBase, 60s);
  EXPECT_EQ(summary.samples, 20u);
  EXPECT_EQ(summary.p50, 10ms);  // rank ceil(0.50 * 20) = 10
  EXPECT_EQ(summary.p95, 19ms);  // rank ceil(0.95 * 20) = 19
}

TEST(LatencyWindow, NearestRankPercentilesOnTenSamples) {
  LatencyWindow window(16);
  for (int value : {90, 10, 70, 30, 50, 100, 20, 80, 40, 60})
    window.add(milliseconds(value), kBase);

  const auto summary = window.summary(kBase, 60s);
  EXPECT_EQ(summary.samples, 10u);
  EXPECT_EQ(summary.p50, 50ms);   // rank 5
  EXPECT_EQ(summary.p95, 100ms);  // rank ceil(9.5) = 10
}

TEST(LatencyWindow, SingleSampleIsBothPercentiles) {
  LatencyWindow window(4);
  window.add(1234us, kBase);
  const auto summary = window.summary(kBase, 60s);
  EXPECT_EQ(summary.samples, 1u);
  EXPECT_EQ(summary.p50, 1234us);
  EXPECT_EQ(summary.p95, 1234us);
}

TEST(LatencyWindow, RingKeepsOnlyTheLastCapacitySamples) {
  LatencyWindow window(5);
  for (int value : {1000, 1001, 1002, 1003, 1004, 1005, 1006})
    window.add(milliseconds(value), kBase);
  for (int value : {1, 2, 3, 4, 5}) window.add(milliseconds(value), kBase);

  const auto summary = window.summary(kBase, 60s);
  EXPECT_EQ(summary.samples, 5u);
  EXPECT_EQ(summary.p50, 3ms);
  EXPECT_EQ(summary.p95, 5ms);  // the large old samples are gone
}

TEST(LatencyWindow, OldSamplesAgeOut) {
  LatencyWindow window(8);
  window.add(500ms, kBase);
  window.add(20ms, kBase + 30s);

  const auto at_60s = window.summary(kBase + 60s, 60s);
  EXPECT_EQ(at_60s.samples, 2u);  // exactly max_age old still counts
  EXPECT_EQ(at_60s.p95, 500ms);

  window.add(30ms, kBase + 61s);
  const auto at_61s = window.summary(kBase + 61s, 60s);
  EXPECT_EQ(at_61s.samples, 2u);
  EXPECT_EQ(at_61s.p95, 30ms);  // the 500 ms sample is 61 s old

  EXPECT_EQ(window.summary(kBase + 200s, 60s).samples, 0u);
}

TEST(LatencyWindow, ZeroSampleIsNotMistakenForAnEmptySlot) {
  LatencyWindow window(4);
  window.add(0us, kBase);
  const auto summary = window.summary(kBase, 60s);
  EXPECT_EQ(summary.samples, 1u);
  EXPECT_EQ(summary.p50, 0us);
}

TEST(LatencyWindow, HourLongSampleIsExact) {
  LatencyWindow window(4);
  window.add(3600s + 1us, kBase);
  EXPECT_EQ(window.summary(kBase, 60s).p50, 3600s + 1us);
}

TEST(LatencyWindow, NegativeSampleCountsAsZero) {
  LatencyWindow window(4);
  window.add(-5ms, kBase);
  EXPECT_EQ(window.summary(kBase, 60s).p50, 0us);
}

TEST(LatencyWindow, AgesStayCorrectMonthsApart) {
  constexpr auto kHundredDays = std::chrono::hours(24 * 100);
  LatencyWindow window(4);
  window.add(10ms, kBase);
  EXPECT_EQ(window.summary(kBase + kHundredDays, 60s).samples, 0u);

  window.add(20ms, kBase + kHundredDays);
  const auto later = window.summary(kBase + kHundredDays + 1s, 60s);
  EXPECT_EQ(later.samples, 1u);
  EXPECT_EQ(later.p50, 20ms);
}

TEST(LatencyWindow, SampleStampedSlightlyAfterTheReadersClockIsFresh) {
  LatencyWindow window(4);
  window.add(10ms, kBase + 100ms);
  EXPECT_EQ(window.summary(kBase, 60s).samples, 1u);
}

TEST(LatencyWindow, CapacityIsClamped) {
  EXPECT_EQ(LatencyWindow(5000).capacity(), LatencyWindow::kMaxCapacity);
  EXPECT_EQ(LatencyWindow(0).capacity(), 1u);

  LatencyWindow huge(5000);
  for (int i = 0; i < 3000; ++i) huge.add(1ms, kBase);
  EXPECT_EQ(huge.summary(kBase, 60s).samples, LatencyWindow::kMaxCapacity);
}

TEST(LatencyWindow, ConcurrentAddsStayWithinCapacity) {
  constexpr unsigned kCapacity = 64;
  LatencyWindow window(kCapacity);
  std::atomic<bool> writers_done{false};
  std::atomic<bool> reader_saw_too_many{false};
  std::atomic<bool> reader_saw_foreign_value{false};

  std::thread reader([&] {
    while (!writers_done.load()) {
      const auto summary = window.summary(kBase, 60s);
      if (summary.samples > kCapacity) reader_saw_too_many = true;
      if (summary.samples > 0 && (summary.p50 < 1ms || summary.p95 > 4ms)) {
        reader_saw_foreign_value = true;
      }
    }
  });
  std::vector<std::thread> writers;
  for (int thread = 1; thread <= 4; ++thread) {
    writers.emplace_back([&window, thread] {
      for (int i = 0; i < 20000; ++i) window.add(milliseconds(thread), kBase);
    });
  }
  for (auto& writer : writers) writer.join();
  writers_done = true;
  reader.join();

  EXPECT_FALSE(reader_saw_too_many);
  EXPECT_FALSE(reader_saw_foreign_value);
  const auto summary = window.summary(kBase, 60s);
  EXPECT_EQ(summary.samples, kCapacity);
  EXPECT_GE(summary.p50, 1ms);
  EXPECT_LE(summary.p95, 4ms);
}

}  // namespace
}  // namespace sluice::router

#include "stall_probe.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "process_pause.hpp"

namespace sluice::bench {
namespace {

using namespace std::chrono_literals;

const Clock::time_point kStart{std::chrono::seconds(1000)};

TEST(LateWakeups, TakesAWakeUpPastTheThresholdForAStallFromTheSleepsStart) {
  LateWakeups seen(500us);
  seen.woke(kStart, 250us, kStart + 250us);
  seen.woke(kStart + 1ms, 250us, kStart + 1ms + 740us);   // 490 µs late
  seen.woke(kStart + 2ms, 250us, kStart + 2ms + 1900us);  // 1,650 µs late
  ASSERT_EQ(seen.stalls().size(), 1u);
  EXPECT_EQ(seen.stalls()[0].from, kStart + 2ms);
  EXPECT_EQ(seen.stalls()[0].to, kStart + 2ms + 1900us);
}

std::vector<TimedSample> samples_over(
    std::initializer_list<std::pair<Clock::duration, Clock::duration>> times) {
  std::vector<TimedSample> samples;
  for (const auto& [from, to] : times) {
    samples.push_back(
        {kStart + from, kStart + to, nanoseconds_between(kStart + from, kStart + to)});
  }
  return samples;
}

TEST(SetApartStalled, CountsTheSamplesAStallOverlappedAndKeepsTheOthers) {
  // A long stall, a short one that starts inside it, and one later.
  const std::vector<Stall> stalls = {{kStart + 10ms, kStart + 20ms},
                                     {kStart + 11ms, kStart + 12ms},
                                     {kStart + 30ms, kStart + 31ms}};
  RunResult result;
  result.ttft_samples = samples_over({
      {0ms, 1ms},       // before every stall
      {9ms, 10ms},      // ends as the long stall starts
      {15ms, 16ms},     // inside the long stall, after the short one ended
      {20500us, 29ms},  // between stalls
      {29ms, 35ms},     // around the last one
      {40ms, 41ms},     // after every stall
  });
  // Gaps between events: the same sorting, on the other kind of sample.
  result.stretch_samples = samples_over({{21ms, 29ms}, {30500us, 32ms}, {45ms, 46ms}});
  set_apart_stalled(result, stalls);
  EXPECT_EQ(result.ttft_touched, 3u);
  EXPECT_EQ(result.ttft_untouched.count(), 3u);
  // The longest untouched wait is the one between the stalls.
  EXPECT_NEAR(static_cast<double>(result.ttft_untouched.max()), 8.5e6, 8.5e3);
  EXPECT_EQ(result.stretch_touched, 1u);
  EXPECT_EQ(result.stretch_untouched.count(), 2u);
  EXPECT_NEAR(static_cast<double>(result.stretch_untouched.max()), 8e6, 8e3);
}

TEST(SetApartStalled, KeepsEverySampleWithoutStalls) {
  RunResult result;
  result.ttft_samples = samples_over({{0ms, 1ms}, {2ms, 5ms}});
  result.stretch_samples = samples_over({{1ms, 2ms}});
  set_apart_stalled(result, {});
  EXPECT_EQ(result.ttft_touched, 0u);
  EXPECT_EQ(result.ttft_untouched.count(), 2u);
  EXPECT_EQ(result.stretch_touched, 0u);
  EXPECT_EQ(result.stretch_untouched.count(), 1u);
}

// The whole process stopped for 30 ms (by a child, with SIGSTOP and
// SIGCONT): to every probe thread, on whichever CPU, that is a CPU that
// served none of them.
TEST(StallProbe, SeesTheTimeTheProcessWasGivenNoCpu) {
  StallProbe probe;
  std::this_thread::sleep_for(20ms);
  const auto stopped_at = Clock::now();
  const pid_t child = pause_this_process(0us, 30ms);
  ASSERT_GE(child, 0);
  waitpid(child, nullptr, 0);
  std::this_thread::sleep_for(20ms);
  const std::vector<Stall> stalls = probe.stop();

  ASSERT_FALSE(stalls.empty());
  EXPECT_TRUE(std::is_sorted(stalls.begin(), stalls.end(),
                             [](const Stall& a, const Stall& b) { return a.from < b.from; }));
  const auto longest = std::max_element(
      stalls.begin(), stalls.end(),
      [](const Stall& a, const Stall& b) { return a.to - a.from < b.to - b.from; });
  EXPECT_GE(longest->to - longest->from, 25ms);
  EXPECT_GE(longest->to, stopped_at);
}

}  // namespace
}  // namespace sluice::bench

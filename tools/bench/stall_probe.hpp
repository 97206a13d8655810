#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "load_runner.hpp"
#include "options.hpp"

namespace sluice::bench {

// A time in which one CPU served none of the threads waiting for it: the
// hypervisor ran another machine's work on it, or the kernel or this
// machine's own threads kept it. Every process on that CPU waited alike.
struct Stall {
  Clock::time_point from;
  Clock::time_point to;
};

// The stalls one sleeping thread sees: a wake-up more than `threshold` after
// the sleep's end means the CPU was away, at some time between the sleep's
// start and the wake-up. The whole of that is taken as the stall, so that a
// stall that began early in a sleep is never cut short.
class LateWakeups {
 public:
  explicit LateWakeups(Clock::duration threshold) : threshold_(threshold) {}

  void woke(Clock::time_point asleep_at, Clock::duration asked, Clock::time_point woke_at) {
    if (woke_at - asleep_at - asked > threshold_) stalls_.push_back({asleep_at, woke_at});
  }
  std::vector<Stall>& stalls() { return stalls_; }

 private:
  Clock::duration threshold_;
  std::vector<Stall> stalls_;
};

// One sleeping thread per CPU, each bound to its CPU, for as long as the
// probe lives. A sleep is short (kProbeSleep), so each thread costs its CPU a
// few thousand wake-ups a second: a probe is for the runs that ask for it.
inline constexpr auto kProbeSleep = std::chrono::microseconds(250);
inline constexpr auto kStallThreshold = std::chrono::microseconds(500);

class StallProbe {
 public:
  StallProbe();
  ~StallProbe();
  StallProbe(const StallProbe&) = delete;
  StallProbe& operator=(const StallProbe&) = delete;

  // Ends the probe; every CPU's stalls, in order of their start.
  std::vector<Stall> stop();

 private:
  std::atomic<bool> stopping_{false};
  std::vector<LateWakeups> seen_;  // one per thread, read only after the joins
  std::vector<std::thread> threads_;
};

// Sorts the TTFT and gap stretch samples of `result` by whether a stall
// overlapped their times: the others go into result.ttft_untouched and
// result.stretch_untouched, and ttft_touched and stretch_touched count the
// rest. `stalls` in order of their start.
void set_apart_stalled(RunResult& result, const std::vector<Stall>& stalls);

}  // namespace sluice::bench

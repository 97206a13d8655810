#include "stall_probe.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace sluice::bench {

namespace {

std::vector<int> usable_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    }
  }
  // Unknown: one unbound thread still sees the stalls of whichever CPU runs it.
  if (cpus.empty()) cpus.push_back(-1);
  return cpus;
}

void bind_to(std::thread& thread, int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(thread.native_handle(), sizeof set, &set);
}

}  // namespace

StallProbe::StallProbe() {
  const std::vector<int> cpus = usable_cpus();
  seen_.assign(cpus.size(), LateWakeups(kStallThreshold));
  threads_.reserve(cpus.size());
  for (std::size_t i = 0; i < cpus.size(); ++i) {
    threads_.emplace_back([this, &seen = seen_[i]] {
      while (!stopping_.load(std::memory_order_relaxed)) {
        const auto asleep_at = Clock::now();
        std::this_thread::sleep_for(kProbeSleep);
        seen.woke(asleep_at, kProbeSleep, Clock::now());
      }
    });
    bind_to(threads_.back(), cpus[i]);
  }
}

StallProbe::~StallProbe() { stop(); }

std::vector<Stall> StallProbe::stop() {
  stopping_.store(true, std::memory_order_relaxed);
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  std::vector<Stall> all;
  for (auto& seen : seen_) {
    all.insert(all.end(), seen.stalls().begin(), seen.stalls().end());
    seen.stalls().clear();
  }
  std::sort(all.begin(), all.end(), [](const Stall& a, const Stall& b) { return a.from < b.from; });
  return all;
}

void set_apart_stalled(RunResult& result, const std::vector<Stall>& stalls) {
  // The stalls that start no later than `to`, the latest first, and the
  // longest reach of any stall so far: a window is touched when one of the
  // stalls starting before its end reaches past its start.
  std::vector<Clock::time_point> reach_so_far(stalls.size());
  Clock::time_point reach = Clock::time_point::min();
  for (std::size_t i = 0; i < stalls.size(); ++i) {
    reach = std::max(reach, stalls[i].to);
    reach_so_far[i] = reach;
  }
  for (const TtftWindow& window : result.ttft_windows) {
    const auto after_end =
        std::upper_bound(stalls.begin(), stalls.end(), window.first_byte,
                         [](Clock::time_point at, const Stall& stall) { return at < stall.from; });
    const auto before = static_cast<std::size_t>(after_end - stalls.begin());
    if (before > 0 && reach_so_far[before - 1] >= window.start) {
      ++result.stall_touched;
    } else {
      result.ttft_untouched.record(nanoseconds_between(window.start, window.first_byte));
    }
  }
}

}  // namespace sluice::bench

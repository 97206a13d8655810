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
  // A sample is touched when one of the stalls that start before its end
  // reaches past its start: the furthest any of the first i stalls reaches
  // answers that for every sample at once.
  std::vector<Clock::time_point> reach_so_far(stalls.size());
  Clock::time_point reach = Clock::time_point::min();
  for (std::size_t i = 0; i < stalls.size(); ++i) {
    reach = std::max(reach, stalls[i].to);
    reach_so_far[i] = reach;
  }
  auto sort_apart = [&](const std::vector<TimedSample>& samples, LatencyHistogram& untouched,
                        std::uint64_t& touched) {
    for (const TimedSample& sample : samples) {
      const auto after_end = std::upper_bound(
          stalls.begin(), stalls.end(), sample.to,
          [](Clock::time_point at, const Stall& stall) { return at < stall.from; });
      const auto before = static_cast<std::size_t>(after_end - stalls.begin());
      if (before > 0 && reach_so_far[before - 1] >= sample.from) {
        ++touched;
      } else {
        untouched.record(sample.nanoseconds);
      }
    }
  };
  sort_apart(result.ttft_samples, result.ttft_untouched, result.ttft_touched);
  sort_apart(result.stretch_samples, result.stretch_untouched, result.stretch_touched);
}

}  // namespace sluice::bench

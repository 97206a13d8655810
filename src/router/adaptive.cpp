#include "sluice/router/adaptive.hpp"

#include <algorithm>
#include <cmath>

namespace sluice::router {

using std::chrono::microseconds;
using std::chrono::milliseconds;

Deadline deadline_from(const LatencyWindow& window, milliseconds static_default,
                       const config::AdaptiveDeadline& policy, unsigned min_samples,
                       TimePoint now) {
  Deadline deadline;
  deadline.value = static_default;
  const auto p99 = window.quantile(now, kDeadlineFreshFor, 99);
  deadline.samples = p99.samples;
  if (p99.samples == 0) return deadline;
  deadline.p99 = p99.value;
  if (p99.samples < std::max(1u, std::min(min_samples, window.capacity()))) return deadline;
  const double scaled_ms = policy.multiplier * static_cast<double>(p99.value.count()) / 1000.0;
  // Rounded up: a deadline never fires before the scaled P99 has passed.
  const auto scaled = milliseconds(static_cast<std::int64_t>(
      std::min(std::ceil(scaled_ms), static_cast<double>(policy.ceiling.count()))));
  deadline.value = std::clamp(scaled, policy.floor, policy.ceiling);
  deadline.measured = true;
  return deadline;
}

DeadlineCache::Values current_deadlines(const config::Deployment& deployment,
                                        const config::Adaptive& adaptive, DeploymentState& state,
                                        TimePoint now, std::size_t prompt_class) {
  const auto& timeouts = deployment.timeouts;
  if (!timeouts.adaptive()) return {timeouts.ttft, timeouts.idle};
  auto& cache =
      prompt_class < kPromptClasses ? state.class_deadlines[prompt_class] : state.deadlines;
  if (auto cached = cache.get(now, kDeadlineRefresh)) return *cached;
  DeadlineCache::Values values{timeouts.ttft, timeouts.idle};
  if (timeouts.ttft_auto) {
    const auto& window =
        ttft_window(state, prompt_class, now, kDeadlineFreshFor, adaptive.min_samples);
    values.ttft =
        deadline_from(window, timeouts.ttft, adaptive.ttft, adaptive.min_samples, now).value;
  }
  if (timeouts.idle_auto) {
    values.idle =
        deadline_from(state.gaps, timeouts.idle, adaptive.idle, adaptive.min_samples, now).value;
  }
  cache.put(values, now);
  return values;
}

}  // namespace sluice::router

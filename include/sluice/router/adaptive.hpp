#pragma once

#include <chrono>
#include <cstddef>

#include "sluice/common/clock.hpp"
#include "sluice/config/config.hpp"
#include "sluice/router/deployment_state.hpp"

// Deadlines that follow a deployment's measured latency (`ttft: auto`,
// `idle: auto`): clamp(multiplier x P99, floor, ceiling) over its recent
// samples, or the key's static default while there are too few of them.
namespace sluice::router {

// A deadline is recomputed at most this often; in between, requests read the
// cached value.
inline constexpr std::chrono::milliseconds kDeadlineRefresh{1000};
// Samples older than this no longer describe the deployment. Longer than the
// latency strategy's minute: a P99 needs many samples, and a deadline should
// not swing with a quiet minute.
inline constexpr std::chrono::milliseconds kDeadlineFreshFor{300'000};

struct Deadline {
  std::chrono::milliseconds value{0};
  bool measured = false;             // from the samples, not the static default
  std::size_t samples = 0;           // fresh samples in the window
  std::chrono::microseconds p99{0};  // when there were any
};

// One deadline over `window`. `min_samples` is capped at the window's
// capacity, which is all it can hold.
Deadline deadline_from(const LatencyWindow& window, std::chrono::milliseconds static_default,
                       const config::AdaptiveDeadline& policy, unsigned min_samples, TimePoint now);

// The first-byte and stall deadlines of `deployment` now, for a request of
// `prompt_class`: its static ones, or for a key set to `auto` the adaptive
// one, cached for kDeadlineRefresh. The first-byte one reads the class's
// window (or a neighbour's, or the whole, as ttft_window falls back).
DeadlineCache::Values current_deadlines(const config::Deployment& deployment,
                                        const config::Adaptive& adaptive, DeploymentState& state,
                                        TimePoint now, std::size_t prompt_class = kNoPromptClass);

}  // namespace sluice::router

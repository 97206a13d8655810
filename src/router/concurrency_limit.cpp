#include "sluice/router/concurrency_limit.hpp"

#include <algorithm>
#include <cmath>

namespace sluice::router {

namespace {

std::int64_t ms_of(TimePoint t) {
  return std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

}  // namespace

ConcurrencyLimit::ConcurrencyLimit(const config::AdaptiveConcurrency& policy)
    : limit_(std::clamp(kInitial, std::max(policy.min, 1u), std::max(policy.max, 1u))) {}

void ConcurrencyLimit::on_sample(std::chrono::microseconds ttft, int in_flight, TimePoint now,
                                 const config::AdaptiveConcurrency& policy) {
  round_sum_us_.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(ttft.count(), 0)),
                          std::memory_order_relaxed);
  const std::uint64_t count = round_count_.fetch_add(1, std::memory_order_relaxed) + 1;
  int peak = round_peak_.load(std::memory_order_relaxed);
  while (in_flight > peak &&
         !round_peak_.compare_exchange_weak(peak, in_flight, std::memory_order_relaxed)) {
  }

  const std::int64_t t = ms_of(now);
  std::int64_t start = round_start_ms_.load(std::memory_order_acquire);
  if (start == kUnset) {
    round_start_ms_.compare_exchange_strong(start, t, std::memory_order_acq_rel);
    return;
  }
  // A probe runs at a low limit, where samples come slowly.
  const std::uint64_t needed = probing() ? 2 : kMinRoundSamples;
  if (t - start < kRound.count() || count < needed) return;
  if (!round_start_ms_.compare_exchange_strong(start, t, std::memory_order_acq_rel)) return;
  // Samples that land between these exchanges go to the next round.
  const std::uint64_t sum = round_sum_us_.exchange(0, std::memory_order_relaxed);
  const std::uint64_t samples = round_count_.exchange(0, std::memory_order_relaxed);
  const int round_peak = round_peak_.exchange(0, std::memory_order_relaxed);
  if (samples == 0) return;
  close_round(sum / samples, round_peak, t, policy);
}

void ConcurrencyLimit::close_round(std::uint64_t mean_us, int peak_in_flight, std::int64_t now_ms,
                                   const config::AdaptiveConcurrency& policy) {
  const unsigned low = std::max(policy.min, 1u);
  const unsigned high = std::max(policy.max, low);
  const auto mean = static_cast<std::int64_t>(std::max<std::uint64_t>(mean_us, 1));

  if (const int probe = probe_rounds_.load(std::memory_order_relaxed); probe > 0) {
    if (probe == 1) {
      baseline_us_.store(mean, std::memory_order_relaxed);
      limit_.store(std::clamp(limit_before_probe_.load(std::memory_order_relaxed), low, high),
                   std::memory_order_relaxed);
      next_probe_ms_.store(now_ms + policy.probe_every.count(), std::memory_order_relaxed);
    }
    probe_rounds_.store(probe - 1, std::memory_order_relaxed);
    return;
  }

  std::int64_t baseline = baseline_us_.load(std::memory_order_relaxed);
  if (baseline != 0 && mean < baseline) {
    baseline_us_.store(mean, std::memory_order_relaxed);
    baseline = mean;
  }

  // The first baseline is measured by a probe too: the first round may
  // already have been congested.
  if (baseline == 0 || now_ms >= next_probe_ms_.load(std::memory_order_relaxed)) {
    limit_before_probe_.store(limit_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    probe_rounds_.store(2, std::memory_order_relaxed);
    limit_.store(low, std::memory_order_relaxed);
    return;
  }

  // The round after a change still holds answers sent under the old limit:
  // it says little about the new one.
  if (settling_.exchange(false, std::memory_order_relaxed)) return;

  const unsigned limit = limit_.load(std::memory_order_relaxed);
  const double ratio = static_cast<double>(mean) / static_cast<double>(baseline);
  const double tolerance = std::max(policy.tolerance, 1.0);
  const bool in_use = static_cast<unsigned>(std::max(peak_in_flight, 0)) * 2 >= limit;
  unsigned next = limit;
  if (ratio > tolerance) {
    // Cut in proportion to how far past the tolerance the TTFT went.
    const double gradient = std::max(0.5, tolerance / ratio);
    next = static_cast<unsigned>(std::floor(static_cast<double>(limit) * gradient));
  } else if (in_use && ratio <= 1.0 + (tolerance - 1.0) / 5.0) {
    // Clearly uncongested (within a fifth of the tolerance band): grow fast.
    next = limit + std::max(1u, static_cast<unsigned>(std::sqrt(static_cast<double>(limit))));
  } else if (in_use && ratio <= 1.0 + (tolerance - 1.0) / 2.0) {
    // Queueing may be near: grow by one.
    next = limit + 1;
  }
  next = std::clamp(next, low, high);
  if (next < limit) settling_.store(true, std::memory_order_relaxed);
  limit_.store(next, std::memory_order_relaxed);
}

}  // namespace sluice::router

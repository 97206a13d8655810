#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "sluice/common/clock.hpp"
#include "sluice/config/config.hpp"

namespace sluice::router {

// `max_parallel: auto`: a concurrency limit that follows the deployment's
// TTFT, in the manner of Envoy's adaptive concurrency filter and Netflix's
// gradient limiter. Samples are gathered in rounds; whoever closes a round
// adjusts the limit once from the round's mean TTFT:
// - with the limit in use (half of it in flight), it grows by about its
//   square root while the mean stays within a fifth of the tolerance band
//   (1.1 x baseline for a tolerance of 1.5), and by one up to half of it
//   (1.25 x);
// - past tolerance x baseline it is cut in proportion (at most by half),
//   and the round after a cut is not judged: it still holds answers sent
//   under the old limit, and judging it would cut twice for one overshoot;
// - in between it holds, so that it settles instead of oscillating.
// The baseline is the lowest round mean seen since the last probe. After
// the first round, and then every probe_every, the limit drops to `min` for
// two rounds, and the second one's mean becomes the new baseline (the first
// still holds answers sent under the old limit). That is how a deployment
// that became slower for good stops being cut, and how a deployment that was
// congested from the start gets a true baseline.
//
// Lock-free: a sample is a few relaxed atomic adds, and the round is closed
// by the one thread that wins a compare-and-swap.
class ConcurrencyLimit {
 public:
  // A round lasts at least this long and has at least kMinRoundSamples.
  static constexpr std::chrono::milliseconds kRound{250};
  static constexpr std::uint64_t kMinRoundSamples = 8;
  // Where the limit starts: enough for a deployment to take a burst before
  // anything is measured, clamped to [min, max].
  static constexpr unsigned kInitial = 32;

  explicit ConcurrencyLimit(const config::AdaptiveConcurrency& policy = {});

  unsigned current() const { return limit_.load(std::memory_order_relaxed); }
  // The uncongested TTFT the limit is measured against (0 before any).
  std::chrono::microseconds baseline() const {
    return std::chrono::microseconds(baseline_us_.load(std::memory_order_relaxed));
  }
  bool probing() const { return probe_rounds_.load(std::memory_order_relaxed) > 0; }

  // A first-byte time, measured while `in_flight` requests were out.
  void on_sample(std::chrono::microseconds ttft, int in_flight, TimePoint now,
                 const config::AdaptiveConcurrency& policy);

 private:
  void close_round(std::uint64_t mean_us, int peak_in_flight, std::int64_t now_ms,
                   const config::AdaptiveConcurrency& policy);

  static constexpr std::int64_t kUnset = INT64_MIN;

  std::atomic<unsigned> limit_;
  std::atomic<std::int64_t> round_start_ms_{kUnset};
  std::atomic<std::uint64_t> round_sum_us_{0};
  std::atomic<std::uint64_t> round_count_{0};
  std::atomic<int> round_peak_{0};
  std::atomic<std::int64_t> baseline_us_{0};
  std::atomic<std::int64_t> next_probe_ms_{kUnset};
  std::atomic<int> probe_rounds_{0};  // rounds of the probe still to run
  std::atomic<unsigned> limit_before_probe_{0};
  std::atomic<bool> settling_{false};  // the next round follows a cut: skip it
};

}  // namespace sluice::router

#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "sluice/common/clock.hpp"
#include "sluice/common/gcra.hpp"
#include "sluice/config/config.hpp"
#include "sluice/router/concurrency_limit.hpp"

namespace sluice::router {

// The last `capacity` latency samples with the time each was taken. add() and
// summary() are safe from any thread without a lock: each slot is one atomic
// word, so a reader sees whole samples (at worst one slightly old).
//
// Slot layout: the high 32 bits hold the sample in microseconds plus one
// (samples are clamped to about 71 minutes, and the +1 keeps a real sample
// from ever encoding to 0, which marks an empty slot); the low 32 bits hold
// the time it was taken in 4 ms ticks of the steady clock, modulo 2^32. Ages
// are computed modulo 2^32 ticks, so they are exact for about 198 days; 4 ms
// is far finer than any freshness limit this is asked about.
class LatencyWindow {
 public:
  static constexpr unsigned kMaxCapacity = 1024;  // larger capacities are clamped

  explicit LatencyWindow(unsigned capacity);

  void add(std::chrono::microseconds sample, TimePoint at);

  struct Summary {
    std::size_t samples = 0;  // fresh samples only
    std::chrono::microseconds p50{0};
    std::chrono::microseconds p95{0};
  };
  // Percentiles over the samples taken within `max_age` before `now`.
  Summary summary(TimePoint now, std::chrono::milliseconds max_age) const;
  // How many samples summary() would use.
  std::size_t fresh_samples(TimePoint now, std::chrono::milliseconds max_age) const;

  struct Quantile {
    std::size_t samples = 0;  // fresh samples only
    std::chrono::microseconds value{0};
  };
  // One nearest-rank percentile (1..100) over the same fresh samples.
  Quantile quantile(TimePoint now, std::chrono::milliseconds max_age, unsigned percent) const;
  unsigned capacity() const { return capacity_; }

 private:
  unsigned capacity_;
  // The fresh samples, in microseconds, into `out`; returns how many.
  std::size_t collect_fresh(TimePoint now, std::chrono::milliseconds max_age,
                            std::uint32_t* out) const;

  std::unique_ptr<std::atomic<std::uint64_t>[]> slots_;
  std::atomic<std::uint64_t> next_{0};
};

// Deadlines computed from the windows, kept for a short while so that a
// request reads two atomics instead of sorting a window. A reader may get
// values up to one refresh old; two threads refreshing at once both store
// correct values.
class DeadlineCache {
 public:
  struct Values {
    std::chrono::milliseconds ttft;
    std::chrono::milliseconds idle;
  };
  // The cached values if they were computed within `max_age` before `now`.
  std::optional<Values> get(TimePoint now, std::chrono::milliseconds max_age) const;
  void put(Values values, TimePoint now);

 private:
  std::atomic<std::int64_t> computed_at_{INT64_MIN};  // steady clock, ms
  std::atomic<std::int64_t> ttft_ms_{0};
  std::atomic<std::int64_t> idle_ms_{0};
};

// Prompt-size classes by estimated input tokens: < 1k, 1k-8k, 8k-32k, >= 32k.
inline constexpr std::size_t kPromptClasses = 4;
std::size_t prompt_class_of(std::uint64_t estimated_prompt_tokens);

// Requests in flight by powers of two: 1, 2-3, 4-7, 8-15, 16 and more.
inline constexpr std::size_t kInFlightBuckets = 5;
std::size_t in_flight_bucket(int in_flight);
// The lowest count of each bucket.
inline constexpr std::array<unsigned, kInFlightBuckets> kInFlightBucketFloors{1, 2, 4, 8, 16};

// Live state of one deployment, shared by every thread and every request.
class DeploymentState {
 public:
  DeploymentState(unsigned window, TimePoint epoch = Clock::now(),
                  const config::AdaptiveConcurrency& concurrency = {});

  LatencyWindow ttft;   // first byte, streams and non-streams alike
  LatencyWindow total;  // whole response, non-streaming requests only
  // The longest gap between reads of each stream; fed only for deployments
  // with `idle: auto`.
  LatencyWindow gaps;
  DeadlineCache deadlines;
  // With router.prompt_classes: first-byte times by prompt-size class (each
  // also goes to `ttft`, the whole window), and a deadline cache for each.
  std::array<LatencyWindow, kPromptClasses> ttft_by_class;
  std::array<DeadlineCache, kPromptClasses> class_deadlines;
  // With router.diagnosis: first-byte times by the requests in flight to
  // the deployment when each was let through (in_flight_bucket), and the
  // connect and TLS times of new connections.
  std::array<LatencyWindow, kInFlightBuckets> ttft_by_in_flight;
  LatencyWindow connect_times;
  LatencyWindow tls_times;
  // With `max_parallel: auto`.
  ConcurrencyLimit concurrency;

  // The cap on requests in flight: the fixed max_parallel (0 = none) or the
  // adaptive limit.
  unsigned max_parallel(const config::Deployment& deployment) const {
    return deployment.max_parallel_auto ? concurrency.current() : deployment.max_parallel;
  }

  // In-flight accounting against max_parallel (0 = unlimited).
  bool try_acquire(unsigned max_parallel);
  void release();
  int in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

  // Requests-per-minute budget (0 = unlimited): the same GCRA as a key's
  // rpm (common/gcra.hpp), so that a deployment's budget answers alike
  // kept here or in a shared store.
  bool try_take_rpm(unsigned rpm, TimePoint now);

  // Cooldown: `fails` failures within `within` take the deployment out for
  // `for`. Afterwards claim_probe() lets exactly one request through; its
  // success ends the cooldown, its failure starts another.
  void record_failure(const config::Cooldown& policy, TimePoint now);
  void record_success(TimePoint now);
  bool cooling_down(TimePoint now) const;
  std::optional<TimePoint> cooldown_until() const;
  // True for the one caller that may probe a deployment whose cooldown ran out.
  bool claim_probe(TimePoint now);
  // The cooldown ran out and the deployment waits for a probe (claimed or not).
  bool awaiting_probe(TimePoint now) const;
  // awaiting_probe() and nobody has claimed the probe yet; does not claim.
  bool probe_available(TimePoint now) const;
  // Gives a claimed probe back without a verdict (the probe was abandoned or
  // got an answer that says nothing about the deployment's health).
  void release_probe();
  // A response that started fine broke off: counts toward the cooldown like
  // record_failure, without counting a second attempt.
  void record_midstream_failure(const config::Cooldown& policy, TimePoint now);

  // For cooldowns shared between instances: keeps the deployment cooled
  // down until at least `until` (a later local cooldown stands), ends a
  // cooldown now so that this instance's next request is the probe, or ends
  // it altogether because another instance's probe succeeded.
  void hold_cooldown_until(TimePoint until);
  void end_cooldown_for_probe(TimePoint now);
  void end_cooldown();

  // Whether try_take_rpm would succeed right now; takes nothing.
  bool rpm_available(unsigned rpm, TimePoint now) const;

  // Recent outcomes for the admin view: errors / attempts over the last minute.
  double recent_error_rate(TimePoint now) const;
  std::uint64_t attempts_total() const { return attempts_.load(std::memory_order_relaxed); }
  std::uint64_t failures_total() const { return failures_.load(std::memory_order_relaxed); }

 private:
  // Times below are ms since epoch_ and may be negative (a test clock may
  // start before the state was built), so "unset" is the lowest value rather
  // than 0 or -1.
  static constexpr std::int64_t kUnset = INT64_MIN;

  std::int64_t ticks(TimePoint t) const;  // ms since epoch_
  static std::int64_t minute_of(std::int64_t ticks);
  void count_outcome(TimePoint now, bool attempt, bool failure);
  void count_toward_cooldown(const config::Cooldown& policy, TimePoint now);

  TimePoint epoch_;
  std::atomic<int> in_flight_{0};
  GcraClock rpm_clock_;
  std::atomic<unsigned> recent_failures_{0};
  std::atomic<std::int64_t> failure_window_start_{kUnset};
  std::atomic<std::int64_t> cooldown_until_{kUnset};
  std::atomic<bool> probe_pending_{false};
  std::atomic<std::uint64_t> attempts_{0};
  std::atomic<std::uint64_t> failures_{0};
  std::atomic<std::int64_t> minute_start_{kUnset};  // minute number of the outcome bucket
  std::atomic<unsigned> minute_attempts_{0};
  std::atomic<unsigned> minute_failures_{0};
};

// A request of no prompt-size class (router.prompt_classes off).
inline constexpr std::size_t kNoPromptClass = kPromptClasses;

// The first-byte summary a request of `prompt_class` is routed by: its
// class's window when that has `min_samples` fresh samples, else a
// neighbouring class's, else the deployment's whole window.
LatencyWindow::Summary ttft_summary(const DeploymentState& state, std::size_t prompt_class,
                                    TimePoint now, std::chrono::milliseconds max_age,
                                    std::size_t min_samples);
// The window a request of `prompt_class` reads its P99 from, by the same
// fallback (for `ttft: auto`).
const LatencyWindow& ttft_window(const DeploymentState& state, std::size_t prompt_class,
                                 TimePoint now, std::chrono::milliseconds max_age,
                                 std::size_t min_samples);

}  // namespace sluice::router

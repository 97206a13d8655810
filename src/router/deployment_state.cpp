#include "sluice/router/deployment_state.hpp"

#include <algorithm>
#include <array>
#include <limits>

namespace sluice::router {

namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// Stamp resolution: coarse enough that 32 bits span months, fine enough that
// a freshness limit measured in seconds is not visibly rounded.
using StampTick = std::chrono::duration<std::int64_t, std::ratio<4, 1000>>;

constexpr std::uint64_t kSampleFieldMax = std::numeric_limits<std::uint32_t>::max();
// A writer may stamp a sample with a clock read a little after the reader's
// `now`; such samples are fresh, not 198 days old.
constexpr std::uint32_t kFutureSlackTicks = 250;  // 1 s

std::uint32_t stamp_of(TimePoint t) {
  // Conversion to unsigned is modulo 2^32, which is what the ring arithmetic wants.
  return static_cast<std::uint32_t>(std::chrono::floor<StampTick>(t.time_since_epoch()).count());
}

std::uint64_t encode(microseconds sample, TimePoint at) {
  const std::int64_t us = std::max<std::int64_t>(sample.count(), 0);
  const std::uint64_t field =
      std::min<std::uint64_t>(static_cast<std::uint64_t>(us), kSampleFieldMax - 1) + 1;
  return (field << 32) | stamp_of(at);
}

std::uint32_t decoded_sample_us(std::uint64_t word) {
  return static_cast<std::uint32_t>((word >> 32) - 1);
}

std::uint32_t decoded_stamp(std::uint64_t word) { return static_cast<std::uint32_t>(word); }

// Nearest rank: the smallest sample with at least `percent` % of the samples
// at or below it.
std::size_t nearest_rank_index(std::size_t count, unsigned percent) {
  const std::size_t rank = (count * percent + 99) / 100;
  return std::max<std::size_t>(rank, 1) - 1;
}

}  // namespace

LatencyWindow::LatencyWindow(unsigned capacity)
    : capacity_(std::clamp(capacity, 1u, kMaxCapacity)),
      slots_(std::make_unique<std::atomic<std::uint64_t>[]>(capacity_)) {
  for (unsigned i = 0; i < capacity_; ++i) slots_[i].store(0, std::memory_order_relaxed);
}

void LatencyWindow::add(std::chrono::microseconds sample, TimePoint at) {
  const std::uint64_t slot = next_.fetch_add(1, std::memory_order_relaxed) % capacity_;
  slots_[slot].store(encode(sample, at), std::memory_order_relaxed);
}

std::size_t LatencyWindow::collect_fresh(TimePoint now, std::chrono::milliseconds max_age,
                                         std::uint32_t* out) const {
  const std::int64_t max_age_ticks =
      std::max<std::int64_t>(std::chrono::floor<StampTick>(max_age).count(), 0);
  // Keep the "fresh" and "from the future" ranges apart.
  const std::uint32_t fresh_limit = static_cast<std::uint32_t>(std::min<std::int64_t>(
      max_age_ticks, std::numeric_limits<std::uint32_t>::max() - kFutureSlackTicks - 1));
  const std::uint32_t now_stamp = stamp_of(now);

  std::size_t count = 0;
  for (unsigned i = 0; i < capacity_; ++i) {
    const std::uint64_t word = slots_[i].load(std::memory_order_relaxed);
    if (word == 0) continue;
    const std::uint32_t age = now_stamp - decoded_stamp(word);
    const bool from_future = age > std::numeric_limits<std::uint32_t>::max() - kFutureSlackTicks;
    if (age <= fresh_limit || from_future) out[count++] = decoded_sample_us(word);
  }
  return count;
}

LatencyWindow::Summary LatencyWindow::summary(TimePoint now,
                                              std::chrono::milliseconds max_age) const {
  std::array<std::uint32_t, kMaxCapacity> fresh;
  const std::size_t count = collect_fresh(now, max_age, fresh.data());

  Summary result;
  result.samples = count;
  if (count == 0) return result;
  const auto begin = fresh.begin();
  const auto end = fresh.begin() + static_cast<std::ptrdiff_t>(count);
  const auto p50 = begin + static_cast<std::ptrdiff_t>(nearest_rank_index(count, 50));
  const auto p95 = begin + static_cast<std::ptrdiff_t>(nearest_rank_index(count, 95));
  std::nth_element(begin, p50, end);
  result.p50 = microseconds(*p50);
  // Everything after p50 is now >= it, and p95 never sits before p50; the
  // second pass may move the p50 element, so it was read first.
  std::nth_element(p50, p95, end);
  result.p95 = microseconds(*p95);
  return result;
}

LatencyWindow::Quantile LatencyWindow::quantile(TimePoint now, std::chrono::milliseconds max_age,
                                                unsigned percent) const {
  std::array<std::uint32_t, kMaxCapacity> fresh;
  const std::size_t count = collect_fresh(now, max_age, fresh.data());
  Quantile result;
  result.samples = count;
  if (count == 0) return result;
  const auto at = fresh.begin() + static_cast<std::ptrdiff_t>(
                                      nearest_rank_index(count, std::clamp(percent, 1u, 100u)));
  std::nth_element(fresh.begin(), at, fresh.begin() + static_cast<std::ptrdiff_t>(count));
  result.value = microseconds(*at);
  return result;
}

std::optional<DeadlineCache::Values> DeadlineCache::get(TimePoint now,
                                                        std::chrono::milliseconds max_age) const {
  const std::int64_t at = computed_at_.load(std::memory_order_acquire);
  const std::int64_t t = std::chrono::floor<milliseconds>(now.time_since_epoch()).count();
  if (at == INT64_MIN || t - at >= max_age.count() || t < at) return std::nullopt;
  return Values{milliseconds(ttft_ms_.load(std::memory_order_relaxed)),
                milliseconds(idle_ms_.load(std::memory_order_relaxed))};
}

void DeadlineCache::put(Values values, TimePoint now) {
  ttft_ms_.store(values.ttft.count(), std::memory_order_relaxed);
  idle_ms_.store(values.idle.count(), std::memory_order_relaxed);
  computed_at_.store(std::chrono::floor<milliseconds>(now.time_since_epoch()).count(),
                     std::memory_order_release);
}

std::size_t prompt_class_of(std::uint64_t estimated_prompt_tokens) {
  if (estimated_prompt_tokens < 1'000) return 0;
  if (estimated_prompt_tokens < 8'000) return 1;
  if (estimated_prompt_tokens < 32'000) return 2;
  return 3;
}

const LatencyWindow& ttft_window(const DeploymentState& state, std::size_t prompt_class,
                                 TimePoint now, std::chrono::milliseconds max_age,
                                 std::size_t min_samples) {
  if (prompt_class >= kPromptClasses) return state.ttft;
  const auto enough = [&](std::size_t cls) {
    return state.ttft_by_class[cls].fresh_samples(now, max_age) >= min_samples;
  };
  if (enough(prompt_class)) return state.ttft_by_class[prompt_class];
  // The nearer size first: the class below, then the one above.
  if (prompt_class > 0 && enough(prompt_class - 1)) return state.ttft_by_class[prompt_class - 1];
  if (prompt_class + 1 < kPromptClasses && enough(prompt_class + 1)) {
    return state.ttft_by_class[prompt_class + 1];
  }
  return state.ttft;
}

LatencyWindow::Summary ttft_summary(const DeploymentState& state, std::size_t prompt_class,
                                    TimePoint now, std::chrono::milliseconds max_age,
                                    std::size_t min_samples) {
  return ttft_window(state, prompt_class, now, max_age, min_samples).summary(now, max_age);
}

std::size_t LatencyWindow::fresh_samples(TimePoint now, std::chrono::milliseconds max_age) const {
  std::array<std::uint32_t, kMaxCapacity> fresh;
  return collect_fresh(now, max_age, fresh.data());
}

namespace {

// The diagnosis windows hold more than the routing window: a diagnosis
// reads percentiles per bucket, not the latest few samples.
constexpr unsigned kDiagnosisWindow = 256;

}  // namespace

std::size_t in_flight_bucket(int in_flight) {
  std::size_t bucket = 0;
  for (int floor = 2; bucket + 1 < kInFlightBuckets && in_flight >= floor; floor *= 2) ++bucket;
  return bucket;
}

DeploymentState::DeploymentState(unsigned window, TimePoint epoch,
                                 const config::AdaptiveConcurrency& concurrency_policy)
    : ttft(window),
      total(window),
      gaps(window),
      ttft_by_class{LatencyWindow(window), LatencyWindow(window), LatencyWindow(window),
                    LatencyWindow(window)},
      ttft_by_in_flight{LatencyWindow(kDiagnosisWindow), LatencyWindow(kDiagnosisWindow),
                        LatencyWindow(kDiagnosisWindow), LatencyWindow(kDiagnosisWindow),
                        LatencyWindow(kDiagnosisWindow)},
      connect_times(kDiagnosisWindow),
      tls_times(kDiagnosisWindow),
      concurrency(concurrency_policy),
      epoch_(epoch) {}

std::int64_t DeploymentState::ticks(TimePoint t) const {
  return std::chrono::floor<milliseconds>(t - epoch_).count();
}

std::int64_t DeploymentState::minute_of(std::int64_t ticks) {
  constexpr std::int64_t kMinute = 60'000;
  // Floor division: test clocks may sit before the epoch.
  return ticks >= 0 ? ticks / kMinute : -((-ticks + kMinute - 1) / kMinute);
}

bool DeploymentState::try_acquire(unsigned max_parallel) {
  if (max_parallel == 0) {
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const int limit = static_cast<int>(std::min<unsigned>(max_parallel, INT32_MAX));
  int current = in_flight_.load(std::memory_order_relaxed);
  while (current < limit) {
    if (in_flight_.compare_exchange_weak(current, current + 1, std::memory_order_relaxed)) {
      return true;
    }
  }
  return false;
}

void DeploymentState::release() { in_flight_.fetch_sub(1, std::memory_order_relaxed); }

bool DeploymentState::try_take_rpm(unsigned rpm, TimePoint now) {
  if (rpm == 0) return true;
  return rpm_clock_.take(GcraRate(rpm), now).admitted;
}

bool DeploymentState::rpm_available(unsigned rpm, TimePoint now) const {
  if (rpm == 0) return true;
  return GcraRate(rpm).admits(rpm_clock_.owed_ns(now));
}

void DeploymentState::count_outcome(TimePoint now, bool attempt, bool failure) {
  if (attempt) attempts_.fetch_add(1, std::memory_order_relaxed);
  if (failure) failures_.fetch_add(1, std::memory_order_relaxed);

  // A benign boundary race: a count may land in the bucket just before it
  // is zeroed.
  const std::int64_t minute = minute_of(ticks(now));
  std::int64_t seen = minute_start_.load(std::memory_order_acquire);
  if (seen < minute &&
      minute_start_.compare_exchange_strong(seen, minute, std::memory_order_acq_rel)) {
    minute_attempts_.store(0, std::memory_order_relaxed);
    minute_failures_.store(0, std::memory_order_relaxed);
  }
  if (attempt) minute_attempts_.fetch_add(1, std::memory_order_relaxed);
  if (failure) minute_failures_.fetch_add(1, std::memory_order_relaxed);
}

void DeploymentState::count_toward_cooldown(const config::Cooldown& policy, TimePoint now) {
  if (policy.fails == 0 || policy.duration.count() <= 0) return;
  const std::int64_t t = ticks(now);

  const std::int64_t until = cooldown_until_.load(std::memory_order_acquire);
  if (until != kUnset) {
    // Requests sent before the cooldown began keep failing for a while; they
    // say nothing new, so they neither extend nor restart it.
    if (t < until) return;
    bool probing = true;
    if (probe_pending_.compare_exchange_strong(probing, false, std::memory_order_acq_rel)) {
      cooldown_until_.store(t + policy.duration.count(), std::memory_order_release);
      recent_failures_.store(0, std::memory_order_relaxed);
      failure_window_start_.store(kUnset, std::memory_order_relaxed);
      return;
    }
  }

  // A fixed window that opens at the first failure after the previous one
  // expired. Concurrent failures at the very moment a window opens may lose a
  // count to the reset; the cooldown then starts one failure later.
  std::int64_t start = failure_window_start_.load(std::memory_order_acquire);
  unsigned count;
  if ((start == kUnset || t - start > policy.within.count()) &&
      failure_window_start_.compare_exchange_strong(start, t, std::memory_order_acq_rel)) {
    recent_failures_.store(1, std::memory_order_relaxed);
    count = 1;
  } else {
    count = recent_failures_.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  if (count >= policy.fails) {
    cooldown_until_.store(t + policy.duration.count(), std::memory_order_release);
    probe_pending_.store(false, std::memory_order_release);
    recent_failures_.store(0, std::memory_order_relaxed);
    failure_window_start_.store(kUnset, std::memory_order_relaxed);
  }
}

void DeploymentState::record_failure(const config::Cooldown& policy, TimePoint now) {
  count_outcome(now, /*attempt=*/true, /*failure=*/true);
  count_toward_cooldown(policy, now);
}

void DeploymentState::record_midstream_failure(const config::Cooldown& policy, TimePoint now) {
  count_outcome(now, /*attempt=*/false, /*failure=*/true);
  count_toward_cooldown(policy, now);
}

void DeploymentState::record_success(TimePoint now) {
  count_outcome(now, /*attempt=*/true, /*failure=*/false);
  // Only a success after the cooldown ran out (normally the probe) ends it: a
  // request sent before the cooldown began may still succeed, and that alone
  // should not cancel the cooldown its failing neighbours earned.
  const std::int64_t until = cooldown_until_.load(std::memory_order_acquire);
  if (until == kUnset) return;
  if (ticks(now) < until) return;
  std::int64_t expected = until;
  if (cooldown_until_.compare_exchange_strong(expected, kUnset, std::memory_order_acq_rel)) {
    probe_pending_.store(false, std::memory_order_release);
  }
}

void DeploymentState::hold_cooldown_until(TimePoint until) {
  const std::int64_t wanted = ticks(until);
  std::int64_t current = cooldown_until_.load(std::memory_order_acquire);
  while (current == kUnset || current < wanted) {
    if (cooldown_until_.compare_exchange_weak(current, wanted, std::memory_order_acq_rel)) {
      if (current == kUnset) probe_pending_.store(false, std::memory_order_release);
      return;
    }
  }
}

void DeploymentState::end_cooldown_for_probe(TimePoint now) {
  const std::int64_t t = ticks(now);
  std::int64_t current = cooldown_until_.load(std::memory_order_acquire);
  while (current != kUnset && current > t) {
    if (cooldown_until_.compare_exchange_weak(current, t, std::memory_order_acq_rel)) return;
  }
}

void DeploymentState::end_cooldown() {
  cooldown_until_.store(kUnset, std::memory_order_release);
  probe_pending_.store(false, std::memory_order_release);
}

bool DeploymentState::cooling_down(TimePoint now) const {
  const std::int64_t until = cooldown_until_.load(std::memory_order_acquire);
  return until != kUnset && ticks(now) < until;
}

std::optional<TimePoint> DeploymentState::cooldown_until() const {
  const std::int64_t until = cooldown_until_.load(std::memory_order_acquire);
  if (until == kUnset) return std::nullopt;
  return epoch_ + milliseconds(until);
}

bool DeploymentState::awaiting_probe(TimePoint now) const {
  const std::int64_t until = cooldown_until_.load(std::memory_order_acquire);
  return until != kUnset && ticks(now) >= until;
}

bool DeploymentState::probe_available(TimePoint now) const {
  return awaiting_probe(now) && !probe_pending_.load(std::memory_order_acquire);
}

bool DeploymentState::claim_probe(TimePoint now) {
  if (!awaiting_probe(now)) return false;
  bool expected = false;
  return probe_pending_.compare_exchange_strong(expected, true, std::memory_order_acq_rel);
}

void DeploymentState::release_probe() { probe_pending_.store(false, std::memory_order_release); }

double DeploymentState::recent_error_rate(TimePoint now) const {
  const std::int64_t bucket = minute_start_.load(std::memory_order_acquire);
  const std::int64_t minute = minute_of(ticks(now));
  if (bucket == kUnset || bucket < minute - 1) return 0.0;
  const unsigned attempts = minute_attempts_.load(std::memory_order_relaxed);
  const unsigned failures = minute_failures_.load(std::memory_order_relaxed);
  if (attempts == 0) return failures > 0 ? 1.0 : 0.0;
  return std::min(1.0, static_cast<double>(failures) / attempts);
}

}  // namespace sluice::router

#include "sluice/auth/limits.hpp"

#include <algorithm>

namespace sluice::auth {
namespace {

constexpr std::int64_t kMinuteNs = GcraRate::kMinuteNs;
// Debt beyond a year is an absurd token count, not a plan; capping it keeps
// every sum below far from overflowing.
constexpr std::int64_t kMaxDebtNs = 365LL * 24 * 3600 * 1'000'000'000;
constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

// The limiters only ever exchange their own word: there is no other memory
// published through it, so relaxed ordering is enough throughout.
constexpr auto kRelaxed = std::memory_order_relaxed;

std::int64_t to_ns(TimePoint time) {
  return std::chrono::duration_cast<Nanos>(time.time_since_epoch()).count();
}

Decision unlimited() { return {true, Nanos{0}, kUnlimited, Nanos{0}}; }

}  // namespace

// ---------------------------------------------------------------------------
// Gcra

Decision Gcra::judge(std::int64_t owed) const {
  if (rate_.limit == 0) return unlimited();
  const std::int64_t interval = rate_.interval_ns;
  const std::int64_t window = rate_.window_ns;
  const std::int64_t owed_after = owed + interval;
  if (owed_after > window) {
    const std::int64_t left = std::max<std::int64_t>(0, window - owed) / interval;
    return {false, Nanos(owed_after - window), static_cast<std::uint64_t>(left), Nanos(owed)};
  }
  return {true, Nanos{0}, static_cast<std::uint64_t>((window - owed_after) / interval),
          Nanos(owed_after)};
}

std::uint64_t Gcra::remaining_when_owed(std::int64_t owed) const {
  if (rate_.limit == 0) return kUnlimited;
  return owed >= rate_.window_ns
             ? 0
             : static_cast<std::uint64_t>((rate_.window_ns - owed) / rate_.interval_ns);
}

Decision Gcra::try_acquire(TimePoint now) {
  if (rate_.limit == 0) return unlimited();
  return judge(clock_.take(rate_, now).owed_ns);
}

void Gcra::refund() {
  if (rate_.limit != 0) clock_.refund(rate_);
}

std::uint64_t Gcra::remaining(TimePoint now) const {
  return remaining_when_owed(reset_after(now).count());
}

Nanos Gcra::reset_after(TimePoint now) const {
  if (rate_.limit == 0) return Nanos{0};
  return Nanos(clock_.owed_ns(now));
}

// ---------------------------------------------------------------------------
// TokenBucket

TokenBucket::TokenBucket(std::uint64_t per_minute) : limit_(per_minute) {}

std::int64_t TokenBucket::cost_ns(std::uint64_t tokens) const {
  if (limit_ == 0) return 0;  // unlimited: nothing is ever owed
  // Rounded up so that no request is ever free; 128 bits because a token
  // count times a minute in nanoseconds overflows 64.
  unsigned __int128 product = static_cast<unsigned __int128>(tokens) * kMinuteNs;
  unsigned __int128 cost = (product + limit_ - 1) / limit_;
  return cost > static_cast<unsigned __int128>(kMaxDebtNs) ? kMaxDebtNs
                                                           : static_cast<std::int64_t>(cost);
}

std::uint64_t TokenBucket::tokens_for(std::int64_t ns) const {
  if (ns <= 0) return 0;
  unsigned __int128 product = static_cast<unsigned __int128>(ns) * limit_;
  return static_cast<std::uint64_t>(product / kMinuteNs);
}

Decision TokenBucket::judge(std::int64_t owed, std::int64_t cost) const {
  if (limit_ == 0) return unlimited();
  if (owed >= kMinuteNs) {
    // Allowed again once less than a minute's worth is owed.
    return {false, Nanos(owed - kMinuteNs + 1), 0, Nanos(owed)};
  }
  std::int64_t owed_after = owed + cost;
  return {true, Nanos{0}, tokens_for(kMinuteNs - owed_after), Nanos(owed_after)};
}

std::uint64_t TokenBucket::remaining_when_owed(std::int64_t owed) const {
  if (limit_ == 0) return kUnlimited;
  return tokens_for(kMinuteNs - owed);
}

Decision TokenBucket::reserve(std::uint64_t tokens, TimePoint now) {
  if (limit_ == 0) return unlimited();
  std::int64_t now_ns = to_ns(now);
  std::int64_t cost = cost_ns(tokens);
  std::int64_t tat = tat_ns_.load(kRelaxed);
  for (;;) {
    std::int64_t start = std::max(tat, now_ns);
    Decision decision = judge(start - now_ns, cost);
    if (!decision.allowed) return decision;
    if (tat_ns_.compare_exchange_weak(tat, start + cost, kRelaxed, kRelaxed)) return decision;
  }
}

void TokenBucket::settle(std::uint64_t reserved, std::uint64_t actual, TimePoint now) {
  if (limit_ == 0 || reserved == actual) return;
  // Difference of the two costs, not the cost of the difference, so that
  // reserve + settle charges exactly what reserving `actual` would have.
  std::int64_t delta = cost_ns(actual) - cost_ns(reserved);
  std::int64_t now_ns = to_ns(now);
  std::int64_t tat = tat_ns_.load(kRelaxed);
  for (;;) {
    std::int64_t start = std::max(tat, now_ns);
    std::int64_t next = std::clamp(start + delta, now_ns, now_ns + kMaxDebtNs);
    if (tat_ns_.compare_exchange_weak(tat, next, kRelaxed, kRelaxed)) return;
  }
}

std::uint64_t TokenBucket::remaining(TimePoint now) const {
  return remaining_when_owed(reset_after(now).count());
}

Nanos TokenBucket::reset_after(TimePoint now) const {
  if (limit_ == 0) return Nanos{0};
  std::int64_t now_ns = to_ns(now);
  return Nanos(std::max(tat_ns_.load(kRelaxed), now_ns) - now_ns);
}

// ---------------------------------------------------------------------------
// ParallelLimit

ParallelLimit::ParallelLimit(unsigned max) : max_(max) {}

bool ParallelLimit::try_acquire() {
  unsigned current = in_flight_.load(kRelaxed);
  do {
    if (max_ != 0 && current >= max_) return false;
  } while (!in_flight_.compare_exchange_weak(current, current + 1, kRelaxed, kRelaxed));
  return true;
}

void ParallelLimit::release() { in_flight_.fetch_sub(1, kRelaxed); }

// ---------------------------------------------------------------------------
// KeyLimits and the registry

KeyLimits::KeyLimits(const config::ApiKeyLimits& limits)
    : configured(limits), requests(limits.rpm), tokens(limits.tpm), parallel(limits.max_parallel) {}

LimiterRegistry::LimiterRegistry(const config::Auth& auth, const LimiterRegistry* previous) {
  for (const config::ApiKey& key : auth.keys) {
    std::shared_ptr<KeyLimits> state;
    if (previous != nullptr) {
      state = previous->shared(key.name);
      if (state && !(state->configured == key.limits)) state.reset();
    }
    if (!state) state = std::make_shared<KeyLimits>(key.limits);
    by_name_.emplace(key.name, std::move(state));
  }
}

KeyLimits* LimiterRegistry::find(std::string_view key_name) const {
  auto it = by_name_.find(key_name);
  return it == by_name_.end() ? nullptr : it->second.get();
}

std::shared_ptr<KeyLimits> LimiterRegistry::shared(std::string_view key_name) const {
  auto it = by_name_.find(key_name);
  return it == by_name_.end() ? nullptr : it->second;
}

}  // namespace sluice::auth

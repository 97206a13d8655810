#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sluice/common/clock.hpp"
#include "sluice/common/gcra.hpp"
#include "sluice/config/config.hpp"

// Per-key budgets, shared by every thread. Each limiter is one atomic word
// updated with a compare-and-swap loop: no mutex, no allocation, and a fake
// clock (explicit TimePoints) is all a test needs.
namespace sluice::auth {

using Nanos = std::chrono::nanoseconds;

struct Decision {
  bool allowed = false;
  Nanos retry_after{0};         // when denied: wait at least this long
  std::uint64_t remaining = 0;  // budget left now (after this request when allowed)
  Nanos reset_after{0};         // until the budget is whole again
};

// Requests per minute as a GCRA (common/gcra.hpp has the arithmetic, which
// the deployment budgets and the shared store's scripts use too).
class Gcra {
 public:
  explicit Gcra(std::uint64_t per_minute) : rate_(per_minute) {}  // 0 = unlimited

  Decision try_acquire(TimePoint now);
  // Gives back one request taken by an allowed try_acquire, for when a
  // later check turns the request away. Exact, since GCRA takes are sums.
  void refund();

  std::uint64_t remaining(TimePoint now) const;
  Nanos reset_after(TimePoint now) const;
  std::uint64_t limit() const { return rate_.limit; }

  // The arithmetic of try_acquire without the state: the answer for a
  // request that finds the TAT `owed_ns` ahead of now (0 when idle). A
  // shared backend keeps the TAT elsewhere and asks this for the numbers,
  // so both backends answer alike.
  Decision judge(std::int64_t owed_ns) const;
  // remaining() for a TAT `owed_ns` ahead of now.
  std::uint64_t remaining_when_owed(std::int64_t owed_ns) const;
  std::int64_t interval_ns() const { return rate_.interval_ns; }
  std::int64_t window_ns() const { return rate_.window_ns; }

 private:
  GcraRate rate_;
  GcraClock clock_;
};

// Tokens per minute, the same idea over tokens: a request is charged its
// estimate up front (reserve) and corrected when the real count is known
// (settle). A request is let in while the budget is not already exhausted,
// i.e. while the tokens owed are less than a minute's worth, whatever its
// own estimate: one large request cannot be locked out forever, it goes
// through and pushes the budget into debt that later requests wait out.
// So a burst may overshoot `tpm` by at most one request's tokens.
class TokenBucket {
 public:
  explicit TokenBucket(std::uint64_t per_minute);  // 0 = unlimited

  Decision reserve(std::uint64_t tokens, TimePoint now);
  // Charges (actual - reserved) more, or gives the difference back. The
  // budget never becomes fuller than full.
  void settle(std::uint64_t reserved, std::uint64_t actual, TimePoint now);

  std::uint64_t remaining(TimePoint now) const;
  Nanos reset_after(TimePoint now) const;
  std::uint64_t limit() const { return limit_; }

  // As Gcra::judge: the answer to reserving tokens that cost `cost_ns`
  // (see cost_ns()) with the TAT `owed_ns` ahead of now.
  Decision judge(std::int64_t owed_ns, std::int64_t cost_ns) const;
  std::uint64_t remaining_when_owed(std::int64_t owed_ns) const;
  // What `tokens` push the TAT forward by.
  std::int64_t cost_ns(std::uint64_t tokens) const;

 private:
  std::uint64_t tokens_for(std::int64_t ns) const;

  std::uint64_t limit_;
  std::atomic<std::int64_t> tat_ns_{std::numeric_limits<std::int64_t>::min()};
};

// Requests in flight. Never goes over `max`, even transiently.
class ParallelLimit {
 public:
  explicit ParallelLimit(unsigned max);  // 0 = unlimited (still counted)

  bool try_acquire();
  void release();
  unsigned in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  unsigned limit() const { return max_; }

 private:
  unsigned max_;
  std::atomic<unsigned> in_flight_{0};
};

// The live budgets of one client key.
struct KeyLimits {
  explicit KeyLimits(const config::ApiKeyLimits& limits);

  const config::ApiKeyLimits configured;
  Gcra requests;
  TokenBucket tokens;
  ParallelLimit parallel;
};

// Key name -> live budgets, built once per config snapshot. On reload a key
// whose name and limits are unchanged keeps its state (spent budget and
// requests in flight), so editing one key, or anything else in the file,
// does not hand every other key a fresh minute. A key whose limits changed
// starts afresh; its requests still in flight release their slots on the
// old state, which the previous snapshot keeps alive until they are done.
class LimiterRegistry {
 public:
  LimiterRegistry() = default;
  LimiterRegistry(const config::Auth& auth, const LimiterRegistry* previous);

  KeyLimits* find(std::string_view key_name) const;
  std::shared_ptr<KeyLimits> shared(std::string_view key_name) const;
  std::size_t size() const { return by_name_.size(); }

 private:
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view name) const {
      return std::hash<std::string_view>{}(name);
    }
  };
  std::unordered_map<std::string, std::shared_ptr<KeyLimits>, NameHash, std::equal_to<>> by_name_;
};

}  // namespace sluice::auth

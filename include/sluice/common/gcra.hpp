#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>

#include "sluice/common/clock.hpp"

// The arithmetic of a requests-per-minute GCRA (generic cell rate
// algorithm), shared by every rpm budget in the gateway (a key's, a
// deployment's, and the scripts that keep them in a shared store), so that
// all of them answer alike for the same traffic.
namespace sluice {

// Each request pushes a "theoretical arrival time" (TAT) one emission
// interval (60s / rpm) into the future, and a request is let in while that
// leaves the TAT at most a minute ahead of now. A full minute's budget may
// be spent at once: after exactly `rpm` requests in a burst the next is
// refused, and one more is let in every 60s / rpm after that.
//
// The interval is a whole number of nanoseconds (rounded down), so with an
// rpm that does not divide 60e9 the "minute" is a hair shorter.
struct GcraRate {
  static constexpr std::int64_t kMinuteNs = 60'000'000'000;

  explicit GcraRate(std::uint64_t per_minute) : limit(per_minute) {
    if (limit == 0) return;
    const auto requests = static_cast<std::int64_t>(
        std::min<std::uint64_t>(limit, static_cast<std::uint64_t>(kMinuteNs)));
    interval_ns = kMinuteNs / requests;
    window_ns = interval_ns * requests;
  }

  // Whether a request is let in when the TAT is `owed_ns` ahead of now (0
  // when the budget is idle).
  bool admits(std::int64_t owed_ns) const { return owed_ns + interval_ns <= window_ns; }

  std::uint64_t limit = 0;  // 0 = unlimited
  std::int64_t interval_ns = 0;
  std::int64_t window_ns = 0;
};

// A TAT kept in one atomic word. The lowest value means "never used", so the
// first request finds a full budget whatever the clock. The word publishes
// no other memory, so relaxed ordering is enough.
class GcraClock {
 public:
  struct Take {
    bool admitted;
    std::int64_t owed_ns;  // how far ahead of now the TAT stood before the take
  };

  // Takes one request from `rate` at `now` if it admits it. Lock-free: a
  // compare-and-swap loop that only retries when another take raced it.
  Take take(const GcraRate& rate, TimePoint now) {
    const std::int64_t now_ns = to_ns(now);
    std::int64_t tat = tat_ns_.load(std::memory_order_relaxed);
    for (;;) {
      const std::int64_t start = std::max(tat, now_ns);
      if (!rate.admits(start - now_ns)) return {false, start - now_ns};
      if (tat_ns_.compare_exchange_weak(tat, start + rate.interval_ns, std::memory_order_relaxed,
                                        std::memory_order_relaxed)) {
        return {true, start - now_ns};
      }
    }
  }

  // Gives back one request an admitted take() charged. Exact, since takes
  // are sums: a take that found the budget idle leaves the TAT at or before
  // "now" again, which reads as full.
  void refund(const GcraRate& rate) { tat_ns_.fetch_sub(rate.interval_ns, std::memory_order_relaxed); }

  // How far ahead of `now` the TAT stands (0 when idle).
  std::int64_t owed_ns(TimePoint now) const {
    const std::int64_t now_ns = to_ns(now);
    return std::max(tat_ns_.load(std::memory_order_relaxed), now_ns) - now_ns;
  }

 private:
  static std::int64_t to_ns(TimePoint time) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(time.time_since_epoch()).count();
  }

  std::atomic<std::int64_t> tat_ns_{std::numeric_limits<std::int64_t>::min()};
};

}  // namespace sluice

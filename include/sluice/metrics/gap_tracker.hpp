#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "sluice/common/clock.hpp"
#include "sluice/common/xorshift.hpp"

namespace sluice::metrics {

// Gaps between the events of one stream (e.g. the reads of a streamed
// response), summarised as p50 and max for the access log. Lives inside the
// request: no allocation, ever. The max is exact; the p50 comes from a
// uniform reservoir of kReservoir gaps (Algorithm R), which is exact up to
// kReservoir gaps and an unbiased sample after that.
//
// Samples are kept in whole microseconds (32 bits, so a gap saturates at
// about 71 minutes). The tracker lives as long as its connection, so a held
// stream pays for the reservoir: 64 samples (256 bytes) put a long stream's
// p50 within a few percent of its spread, which is what an access-log
// summary needs.
class GapTracker {
 public:
  static constexpr std::size_t kReservoir = 64;

  // `seed` drives which gaps the reservoir keeps once it is full.
  explicit GapTracker(std::uint64_t seed = 0x9e3779b97f4a7c15ULL);

  // An event arrived: the first one only starts the clock, each later one
  // records the gap since the previous one.
  void on_event(TimePoint now);
  // Records one gap directly.
  void record_gap(Clock::duration gap);
  // The gap just recorded, if the last on_event() recorded one.
  std::optional<Clock::duration> last_gap() const { return last_gap_; }

  std::uint64_t gaps() const { return gap_count_; }
  // Nearest-rank quantile (0 < q <= 1) of the kept gaps; nullopt without gaps.
  std::optional<Clock::duration> quantile(double q) const;
  std::optional<Clock::duration> p50() const { return quantile(0.5); }
  std::optional<Clock::duration> max() const;

 private:
  std::uint64_t next_random();

  std::array<std::uint32_t, kReservoir> samples_us_{};
  std::uint64_t gap_count_ = 0;
  Xorshift64Star random_;
  Clock::duration max_gap_{0};
  std::optional<Clock::duration> last_gap_;
  std::optional<TimePoint> previous_event_;
};

}  // namespace sluice::metrics

#include "sluice/metrics/gap_tracker.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sluice::metrics {

GapTracker::GapTracker(std::uint64_t seed) : random_(seed) {}

void GapTracker::on_event(TimePoint now) {
  if (previous_event_) {
    record_gap(now - *previous_event_);
  } else {
    last_gap_.reset();
  }
  previous_event_ = now;
}

void GapTracker::record_gap(Clock::duration gap) {
  if (gap < Clock::duration::zero()) gap = Clock::duration::zero();
  last_gap_ = gap;
  max_gap_ = std::max(max_gap_, gap);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(gap).count();
  const auto sample = static_cast<std::uint32_t>(
      std::min<std::int64_t>(micros, std::numeric_limits<std::uint32_t>::max()));

  ++gap_count_;
  if (gap_count_ <= kReservoir) {
    samples_us_[gap_count_ - 1] = sample;
    return;
  }
  // Algorithm R: the n-th gap replaces a random kept one with probability
  // kReservoir / n. The index comes from a multiply-shift, not a division.
  const auto slot = static_cast<std::uint64_t>(
      (static_cast<unsigned __int128>(next_random()) * gap_count_) >> 64);
  if (slot < kReservoir) samples_us_[slot] = sample;
}

std::optional<Clock::duration> GapTracker::quantile(double q) const {
  if (gap_count_ == 0) return std::nullopt;
  const std::size_t kept =
      static_cast<std::size_t>(std::min<std::uint64_t>(gap_count_, kReservoir));
  std::array<std::uint32_t, kReservoir> sorted;
  std::copy_n(samples_us_.begin(), kept, sorted.begin());
  const double rank = std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(kept));
  const std::size_t index = std::max<std::size_t>(static_cast<std::size_t>(rank), 1) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + index, sorted.begin() + kept);
  return std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(sorted[index]));
}

std::optional<Clock::duration> GapTracker::max() const {
  if (gap_count_ == 0) return std::nullopt;
  return max_gap_;
}

std::uint64_t GapTracker::next_random() { return random_(); }

}  // namespace sluice::metrics

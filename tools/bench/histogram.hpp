#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace sluice::bench {

// A log-linear histogram of nanosecond values (the layout HdrHistogram made
// popular): exact below 2048 ns, then 1024 buckets per power of two, so any
// recorded value is known within 0.1%. Memory is allocated once, in the
// constructor, so recording in the hot loop is an index computation and an
// increment.
class LatencyHistogram {
 public:
  LatencyHistogram();

  void record(std::uint64_t nanoseconds) {
    if (nanoseconds > kLargestTracked) nanoseconds = kLargestTracked;
    ++counts_[bucket_index(nanoseconds)];
    ++count_;
    sum_ += nanoseconds;
    if (nanoseconds < min_) min_ = nanoseconds;
    if (nanoseconds > max_) max_ = nanoseconds;
  }

  void merge(const LatencyHistogram& other);
  void clear();

  std::uint64_t count() const { return count_; }
  std::uint64_t min() const { return count_ ? min_ : 0; }
  std::uint64_t max() const { return max_; }
  double mean() const { return count_ ? static_cast<double>(sum_) / count_ : 0; }

  // The value at or below which `fraction` (0..1) of the recordings fall:
  // the middle of the bucket holding that rank, clamped to [min, max].
  std::uint64_t percentile(double fraction) const;

  // Calls visit(value_ns, cumulative_fraction) for every non-empty bucket in
  // increasing order: the points of the cumulative distribution.
  template <class Visit>
  void for_each_cdf_point(Visit&& visit) const {
    std::uint64_t seen = 0;
    for (std::size_t index = 0; index < counts_.size(); ++index) {
      if (counts_[index] == 0) continue;
      seen += counts_[index];
      visit(representative(index), static_cast<double>(seen) / static_cast<double>(count_));
    }
  }

 private:
  static constexpr unsigned kSubBucketBits = 10;
  static constexpr std::uint64_t kHalfRange = std::uint64_t{1} << kSubBucketBits;  // 1024
  static constexpr std::uint64_t kExactRange = kHalfRange * 2;                     // 2048
  // About 13 days: far beyond any timeout, and keeps the table at 43k buckets.
  static constexpr std::uint64_t kLargestTracked = (std::uint64_t{1} << 50) - 1;

  static std::size_t bucket_index(std::uint64_t value);
  std::uint64_t representative(std::size_t index) const;

  std::vector<std::uint64_t> counts_;
  std::uint64_t count_ = 0;
  std::uint64_t sum_ = 0;
  std::uint64_t min_ = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t max_ = 0;
};

}  // namespace sluice::bench

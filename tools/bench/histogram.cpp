#include "histogram.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace sluice::bench {

namespace {

// Buckets for magnitudes 1..40 after the exact range; see bucket_index.
constexpr unsigned kMagnitudes = 40;

}  // namespace

LatencyHistogram::LatencyHistogram() : counts_(kExactRange + kMagnitudes * kHalfRange, 0) {}

// Values below 2048 have their own bucket. Above, a value with bit width
// 11 + m is shifted right by m, which leaves a sub-bucket in [1024, 2048):
// each power of two is split into 1024 equal buckets.
std::size_t LatencyHistogram::bucket_index(std::uint64_t value) {
  if (value < kExactRange) return static_cast<std::size_t>(value);
  const unsigned magnitude = static_cast<unsigned>(std::bit_width(value)) - (kSubBucketBits + 1);
  const std::uint64_t sub_bucket = (value >> magnitude) - kHalfRange;
  return static_cast<std::size_t>(kExactRange + (magnitude - 1) * kHalfRange + sub_bucket);
}

std::uint64_t LatencyHistogram::representative(std::size_t index) const {
  std::uint64_t value = 0;
  if (index < kExactRange) {
    value = index;
  } else {
    const std::uint64_t offset = index - kExactRange;
    const unsigned magnitude = static_cast<unsigned>(offset / kHalfRange) + 1;
    const std::uint64_t low = (offset % kHalfRange + kHalfRange) << magnitude;
    value = low + ((std::uint64_t{1} << magnitude) >> 1);
  }
  return std::clamp(value, min(), max_);
}

void LatencyHistogram::merge(const LatencyHistogram& other) {
  for (std::size_t index = 0; index < counts_.size(); ++index)
    counts_[index] += other.counts_[index];
  count_ += other.count_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
}

void LatencyHistogram::clear() {
  std::fill(counts_.begin(), counts_.end(), 0);
  count_ = 0;
  sum_ = 0;
  min_ = std::numeric_limits<std::uint64_t>::max();
  max_ = 0;
}

std::uint64_t LatencyHistogram::percentile(double fraction) const {
  if (count_ == 0) return 0;
  fraction = std::clamp(fraction, 0.0, 1.0);
  // The rank of the sample that the percentile names, 1-based: P50 of 10
  // samples is the 5th, P100 the 10th.
  const auto rank = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(std::ceil(fraction * static_cast<double>(count_))));
  std::uint64_t seen = 0;
  for (std::size_t index = 0; index < counts_.size(); ++index) {
    seen += counts_[index];
    if (seen >= rank) return representative(index);
  }
  return max_;
}

}  // namespace sluice::bench

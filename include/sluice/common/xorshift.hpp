#pragma once

#include <cstdint>

namespace sluice {

// xorshift64*: a few instructions per draw and eight bytes of state, so every
// worker, request plan and tracker can own one and no draw touches shared
// state. For spreading load and sampling only, never for secrets. Satisfies
// UniformRandomBitGenerator, so it works with <random>'s distributions.
class Xorshift64Star {
 public:
  using result_type = std::uint64_t;

  // A zero state would only ever produce zeros.
  explicit Xorshift64Star(std::uint64_t seed) : state_(seed == 0 ? 0x9e3779b97f4a7c15ULL : seed) {}

  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }

  result_type operator()() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545f4914f6cdd1dULL;
  }

 private:
  std::uint64_t state_;
};

}  // namespace sluice

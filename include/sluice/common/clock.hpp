#pragma once

#include <chrono>

namespace sluice {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

template <class Duration>
inline double to_ms(Duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace sluice

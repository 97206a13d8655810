#pragma once

#include <chrono>

namespace sluice {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// A time some earlier step read already, or the clock's reading now when
// none did (TimePoint{} means none): one clock read shared by the steps of
// a stretch of work.
inline TimePoint known_or_now(TimePoint known) {
  return known != TimePoint{} ? known : Clock::now();
}

template <class Duration>
inline double to_ms(Duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace sluice

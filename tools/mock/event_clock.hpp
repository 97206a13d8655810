#pragma once

#include <chrono>

namespace sluice::mock {

// When a stream's next event is due. Events keep to a schedule set when the
// first one went out, rather than each sleeping an interval after the last:
// with relative sleeps, two streams that drift to within one wake-up of each
// other are woken together, sleep from the same instant and stay in step,
// so streams started apart gather into bursts. A stream held back for longer
// than an interval (a slow reader, a scripted stall) starts a new schedule
// instead of sending what it owes in a burst.
class EventClock {
 public:
  using Clock = std::chrono::steady_clock;

  explicit EventClock(Clock::time_point first_event) : due_(first_event) {}

  void restart(Clock::time_point now) { due_ = now; }

  Clock::time_point next(Clock::duration interval, Clock::time_point now) {
    due_ += interval;
    if (due_ + interval < now) due_ = now;
    return due_;
  }

 private:
  Clock::time_point due_;
};

}  // namespace sluice::mock

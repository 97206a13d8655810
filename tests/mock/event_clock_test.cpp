#include <gtest/gtest.h>

#include <chrono>

#include "mock/event_clock.hpp"

namespace sluice::mock {
namespace {

using namespace std::chrono_literals;
using EventTime = EventClock::Clock::time_point;

TEST(EventClock, EventsKeepToTheScheduleOfTheFirstWhateverTheWakeUpsCost) {
  const EventTime first{1s};
  EventClock clock(first);
  // Each event is sent late (woken 300 us after it was due); the next is
  // still due a whole interval after the last one's due time, not after
  // the late send, so the lateness does not add up.
  EventTime due = clock.next(20ms, first + 300us);
  EXPECT_EQ(due, first + 20ms);
  due = clock.next(20ms, due + 300us);
  EXPECT_EQ(due, first + 40ms);
  due = clock.next(20ms, due + 19ms);
  EXPECT_EQ(due, first + 60ms);
}

TEST(EventClock, AStreamHeldBackLongerThanAnIntervalStartsANewScheduleInsteadOfABurst) {
  const EventTime first{1s};
  EventClock clock(first);
  // Asked 100 ms on (a reader that did not read): no five events owed at
  // once, the next is due now.
  const EventTime late = first + 100ms;
  EXPECT_EQ(clock.next(20ms, late), late);
  EXPECT_EQ(clock.next(20ms, late + 1ms), late + 20ms);

  // A scripted stall restarts the schedule where it ends.
  const EventTime stall_end = late + 60s;
  clock.restart(stall_end);
  EXPECT_EQ(clock.next(20ms, stall_end), stall_end + 20ms);
}

TEST(EventClock, NoIntervalMeansNoWait) {
  const EventTime first{1s};
  EventClock clock(first);
  const EventTime now = first + 5ms;
  EXPECT_LE(clock.next(0ms, now), now);
  EXPECT_LE(clock.next(0ms, now + 1ms), now + 1ms);
}

}  // namespace
}  // namespace sluice::mock

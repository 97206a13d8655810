#include "sluice/server/event_loop.hpp"

#include <sched.h>

#include <optional>

namespace sluice::server {

void run_event_loop(boost::asio::io_context& context, std::chrono::microseconds busy_poll,
                    EventLoopCounters& counters) {
  if (busy_poll.count() <= 0) {
    context.run();
    return;
  }
  using Clock = std::chrono::steady_clock;
  // Read only when a poll found nothing: a busy thread never looks at the
  // clock here.
  std::optional<Clock::time_point> idle_since;
  while (!context.stopped()) {
    // poll() also stops the context once it has no work left, which ends
    // this loop where run() would have returned.
    if (context.poll() > 0) {
      idle_since.reset();
      continue;
    }
    if (context.stopped()) break;
    counters.idle_polls.fetch_add(1, std::memory_order_relaxed);
    const auto now = Clock::now();
    if (!idle_since) {
      idle_since = now;
    } else if (now - *idle_since >= busy_poll) {
      counters.sleeps.fetch_add(1, std::memory_order_relaxed);
      context.run_one();  // sleeps until the next event
      idle_since.reset();
      continue;
    }
    // The load generator, the upstream or another worker may be waiting for
    // this core: polling should only win time the core would have idled.
    sched_yield();
  }
}

}  // namespace sluice::server

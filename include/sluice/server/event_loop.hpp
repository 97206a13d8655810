#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>

namespace sluice::server {

// What a busy-polling loop did, readable from any thread.
struct EventLoopCounters {
  std::atomic<std::uint64_t> idle_polls{0};  // polls that found nothing to do
  std::atomic<std::uint64_t> sleeps{0};      // times the window ran out and the loop blocked
};

// Runs a worker's context until it is stopped or runs out of work, like
// io_context::run(). With a non-zero busy_poll the thread does not go to
// sleep as soon as it has nothing to do: for that long after its last
// handler it keeps asking the reactor for events without blocking, yielding
// the core to anything else runnable between asks.
//
// Why: a thread asleep in epoll_wait pays a wake-up for the next event, and
// on a virtual machine or a core in a deep idle state that wake-up costs tens
// of microseconds - more than the whole proxying. Polling trades CPU for that
// latency, so it is off unless configured (server.busy_poll_us).
void run_event_loop(boost::asio::io_context& context, std::chrono::microseconds busy_poll,
                    EventLoopCounters& counters);

}  // namespace sluice::server

#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/intrusive/set_hook.hpp>
#include <chrono>
#include <ratio>

#include "sluice/common/clock.hpp"
#include "sluice/http/network_errors.hpp"

namespace sluice {

namespace detail {
class DeadlineQueue;
}

// A deadline for the operations pending on a socket that costs next to
// nothing to set, move or drop. Beast's stream starts and cancels a timer
// around every operation, and each cancellation is a further trip through the
// event loop. Here the deadlines of all sockets on one io_context wait in one
// ordered queue under one timer, as an event loop's timers do in nginx: a
// deadline costs no allocation and no timer of its own, and dropping it (a
// connection that ends) is an unlink. A deadline moved later keeps its place
// and is requeued only when that place comes up. When the deadline passes,
// the socket's pending operations are cancelled: they complete with
// operation_aborted, and expired() says it was the deadline. One started
// after that has nothing to cancel it: whoever starts it checks expired()
// first (read_http does).
//
// Used on the thread that runs the socket's io_context, as the socket is.
class SocketDeadline {
 public:
  // The queue wakes its loop only on multiples of a grain, and takes every
  // place that came up by then: a deadline fires up to a grain late.
  // Why: a burst of connections queues one place per connection, each a few
  // microseconds after the last, and most of them find their deadline moved
  // or gone when they come up (a connect's, say). One wake-up each cost a
  // burst of 2,000 streams hundreds of trips through epoll_wait.
  // The grain is this for places at least kFullGrainDistance off when they
  // are queued, as the deadlines of connects, reads and idle waits are, and
  // a sixteenth of the distance for nearer ones: a 50 ms timeout fires at
  // most 3.1 ms late, not 10.
  using WakeupGrain = std::chrono::duration<Clock::rep, std::centi>;  // 10 ms
  static constexpr Clock::duration kWakeupGrain = WakeupGrain(1);
  static constexpr Clock::duration kFullGrainDistance = 16 * kWakeupGrain;

  // The grain of a place this far off when it is queued. A near place's is
  // the power of two in nanoseconds at or below a sixteenth of its
  // distance, so that the marks of places queued close together fall
  // together.
  static Clock::duration grain_for(Clock::duration distance);
  // When the queue wakes its loop for a deadline at `when`, queued at `now`:
  // the first mark of its grain at or after `when`.
  static TimePoint wakeup_for(TimePoint when, TimePoint now);

  explicit SocketDeadline(boost::asio::ip::tcp::socket& socket);
  ~SocketDeadline();
  SocketDeadline(const SocketDeadline&) = delete;
  SocketDeadline& operator=(const SocketDeadline&) = delete;

  // Costs two stores and a comparison unless the deadline comes sooner than
  // its place in the queue (or it has none): every request moves its
  // connection's deadlines several times.
  void expires_at(TimePoint when) {
    deadline_ = when;
    expired_ = false;
    if (when < queued_for_) queue_sooner(when);
  }
  void expires_after(Clock::duration after) { expires_at(Clock::now() + after); }
  void expires_never() { expires_at(TimePoint::max()); }
  bool expired() const { return expired_; }

  // An operation_aborted that the deadline caused becomes beast's timeout.
  error_code translate(error_code ec) const;

 private:
  friend class detail::DeadlineQueue;
  // A place further on in the queue finds no deadline, or a later one, when
  // it comes up, and drops it or requeues it then: only a deadline that
  // comes sooner than its place takes a new one.
  void queue_sooner(TimePoint when);
  using SafeLink = boost::intrusive::link_mode<boost::intrusive::safe_link>;

  boost::asio::ip::tcp::socket& socket_;
  detail::DeadlineQueue* queue_;
  TimePoint deadline_ = TimePoint::max();
  // The deadline it was queued for; max: not queued.
  TimePoint queued_for_ = TimePoint::max();
  // Its place in the queue: queued_for_ rounded up to its grain, fixed when
  // it is queued. The grain of a near place must not shrink as its time
  // comes closer, or places queued together would come up one by one.
  TimePoint wakes_at_ = TimePoint::max();
  bool expired_ = false;
  boost::intrusive::set_member_hook<SafeLink> queued_hook_;
};

}  // namespace sluice

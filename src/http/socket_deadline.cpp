#include "sluice/http/socket_deadline.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/intrusive/set.hpp>
#include <cstdint>
#include <ctime>

namespace sluice {

namespace {

// Counts the queues that have shut down, so that a thread never takes a
// queue it remembers for a context that has since gone away (and whose
// address a new context may have taken); see queue_of.
std::atomic<std::uint64_t> queues_shut_down{0};

}  // namespace

namespace detail {

// The deadlines of one io_context, earliest first, and the one timer that
// wakes the loop for the earliest. A service of the context, so that it
// lives as long as the sockets it serves.
class DeadlineQueue : public boost::asio::execution_context::service {
 public:
  static inline boost::asio::execution_context::id id;

  explicit DeadlineQueue(boost::asio::execution_context& context)
      : service(context), timer_(static_cast<boost::asio::io_context&>(context)) {}

  DeadlineQueue(const DeadlineQueue&) = delete;
  DeadlineQueue& operator=(const DeadlineQueue&) = delete;
  ~DeadlineQueue() override = default;

  // Puts `deadline` in its place for `when`, and wakes the loop by then.
  void queue(SocketDeadline& deadline, TimePoint when) {
    if (shut_down_) return;
    unqueue(deadline);
    place(deadline, when, coarse_now());
    if (deadline.wakes_at_ < armed_for_) arm(deadline.wakes_at_);
  }

  void unqueue(SocketDeadline& deadline) {
    if (!deadline.queued_hook_.is_linked()) return;
    queued_.erase(queued_.iterator_to(deadline));
    deadline.queued_for_ = TimePoint::max();
    deadline.wakes_at_ = TimePoint::max();
  }

 private:
  struct ByWakesAt {
    bool operator()(const SocketDeadline& a, const SocketDeadline& b) const {
      return a.wakes_at_ < b.wakes_at_;
    }
  };
  using Queued = boost::intrusive::multiset<
      SocketDeadline,
      boost::intrusive::member_hook<SocketDeadline,
                                    boost::intrusive::set_member_hook<SocketDeadline::SafeLink>,
                                    &SocketDeadline::queued_hook_>,
      boost::intrusive::compare<ByWakesAt>>;

  // The context is going away: the sockets' pending operations are
  // destroyed without running. Coroutine frames destroyed with them, or
  // later, find their deadlines unlinked and leave the queue alone.
  void shutdown() override {
    shut_down_ = true;
    queued_.clear();
    queues_shut_down.fetch_add(1, std::memory_order_release);
  }

  // Most deadlines are now plus a timeout, and so later than every one
  // queued before: at the end, where an insert costs no search.
  void place(SocketDeadline& deadline, TimePoint when, TimePoint now) {
    deadline.queued_for_ = when;
    deadline.wakes_at_ = SocketDeadline::wakeup_for(when, now);
    queued_.insert(queued_.end(), deadline);
  }

  // The steady clock as of the kernel's last tick (a tick behind at most,
  // never ahead: 4 ms at 250 Hz), read in 6 ns instead of 24 without the
  // time stamp counter: it only tells how far off a place is, and every
  // request queues a few. A near place's grain may come out up to a
  // sixteenth of a tick coarser for it.
  static TimePoint coarse_now() {
    timespec coarse{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &coarse);
    return TimePoint(std::chrono::seconds(coarse.tv_sec) +
                     std::chrono::nanoseconds(coarse.tv_nsec));
  }

  // A wait armed for later is superseded: it completes as aborted, or
  // finds that it came early, and does nothing.
  void arm(TimePoint when) {
    armed_for_ = when;
    timer_.expires_at(when);
    timer_.async_wait([this](error_code ec) {
      if (ec) return;
      on_timer();
    });
  }

  void on_timer() {
    armed_for_ = TimePoint::max();
    const auto now = Clock::now();
    while (!queued_.empty() && queued_.begin()->wakes_at_ <= now) {
      auto& deadline = *queued_.begin();
      unqueue(deadline);
      if (deadline.deadline_ == TimePoint::max()) continue;
      if (now < deadline.deadline_) {
        // Moved later since it was queued.
        place(deadline, deadline.deadline_, now);
        continue;
      }
      deadline.expired_ = true;
      // The pending operations complete through the loop, not in here.
      error_code ignored;
      deadline.socket_.cancel(ignored);
    }
    if (!queued_.empty()) arm(queued_.begin()->wakes_at_);
  }

  boost::asio::steady_timer timer_;
  TimePoint armed_for_ = TimePoint::max();  // when the pending wait ends; max: none
  Queued queued_;
  bool shut_down_ = false;
};

}  // namespace detail

namespace {

// Finding a context's service takes the context's registry lock and a walk
// of its services, for every connection on both sides. A thread runs one
// context, so the queue it found last is nearly always the one it needs.
detail::DeadlineQueue& queue_of(boost::asio::execution_context& context) {
  struct Remembered {
    const boost::asio::execution_context* context = nullptr;
    detail::DeadlineQueue* queue = nullptr;
    std::uint64_t shut_down_before = 0;
  };
  thread_local Remembered last;
  const auto shut_down_now = queues_shut_down.load(std::memory_order_acquire);
  if (last.context != &context || last.shut_down_before != shut_down_now) {
    last = {&context, &boost::asio::use_service<detail::DeadlineQueue>(context), shut_down_now};
  }
  return *last.queue;
}

}  // namespace

SocketDeadline::SocketDeadline(boost::asio::ip::tcp::socket& socket)
    : socket_(socket),
      queue_(
          &queue_of(boost::asio::query(socket.get_executor(), boost::asio::execution::context))) {}

// Unlinked, it may outlive its queue: the queue unlinks every deadline when
// its context shuts down.
SocketDeadline::~SocketDeadline() {
  if (queued_hook_.is_linked()) queue_->unqueue(*this);
}

void SocketDeadline::queue_sooner(TimePoint when) { queue_->queue(*this, when); }

Clock::duration SocketDeadline::grain_for(Clock::duration distance) {
  if (distance >= kFullGrainDistance) return kWakeupGrain;
  const auto sixteenth = std::max<Clock::rep>(distance.count() / 16, 1);
  return Clock::duration(
      static_cast<Clock::rep>(std::bit_floor(static_cast<std::uint64_t>(sixteenth))));
}

TimePoint SocketDeadline::wakeup_for(TimePoint when, TimePoint now) {
  if (when > TimePoint::max() - kWakeupGrain) return TimePoint::max();
  if (when - now >= kFullGrainDistance) return std::chrono::ceil<WakeupGrain>(when);
  // A power of two: the first multiple at or after `when` (which may be past).
  const auto grain = grain_for(when - now);
  const auto rest = when.time_since_epoch().count() & (grain.count() - 1);
  return rest == 0 ? when : when + (grain - Clock::duration(rest));
}

error_code SocketDeadline::translate(error_code ec) const {
  if (ec && expired_ && ec == boost::asio::error::operation_aborted) {
    return boost::beast::error::timeout;
  }
  return ec;
}

}  // namespace sluice

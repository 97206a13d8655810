#include "sluice/common/socket_deadline.hpp"

#include <boost/asio/execution/context.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/intrusive/set.hpp>

namespace sluice {

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
    deadline.queued_for_ = when;
    place(deadline);
    if (when < armed_for_) arm(when);
  }

  void unqueue(SocketDeadline& deadline) {
    if (!deadline.queued_hook_.is_linked()) return;
    queued_.erase(queued_.iterator_to(deadline));
    deadline.queued_for_ = TimePoint::max();
  }

 private:
  struct ByQueuedFor {
    bool operator()(const SocketDeadline& a, const SocketDeadline& b) const {
      return a.queued_for_ < b.queued_for_;
    }
  };
  using Queued = boost::intrusive::multiset<
      SocketDeadline,
      boost::intrusive::member_hook<SocketDeadline,
                                    boost::intrusive::set_member_hook<SocketDeadline::SafeLink>,
                                    &SocketDeadline::queued_hook_>,
      boost::intrusive::compare<ByQueuedFor>>;

  // The context is going away: the sockets' pending operations are
  // destroyed without running. Coroutine frames destroyed with them, or
  // later, find their deadlines unlinked and leave the queue alone.
  void shutdown() override {
    shut_down_ = true;
    queued_.clear();
  }

  // Most deadlines are now plus a timeout, and so later than every one
  // queued before: at the end, where an insert costs no search.
  void place(SocketDeadline& deadline) { queued_.insert(queued_.end(), deadline); }

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
    while (!queued_.empty() && queued_.begin()->queued_for_ <= now) {
      auto& deadline = *queued_.begin();
      unqueue(deadline);
      if (deadline.deadline_ == TimePoint::max()) continue;
      if (now < deadline.deadline_) {
        // Moved later since it was queued.
        deadline.queued_for_ = deadline.deadline_;
        place(deadline);
        continue;
      }
      deadline.expired_ = true;
      // The pending operations complete through the loop, not in here.
      error_code ignored;
      deadline.socket_.cancel(ignored);
    }
    if (!queued_.empty()) arm(queued_.begin()->queued_for_);
  }

  boost::asio::steady_timer timer_;
  TimePoint armed_for_ = TimePoint::max();  // when the pending wait ends; max: none
  Queued queued_;
  bool shut_down_ = false;
};

}  // namespace detail

SocketDeadline::SocketDeadline(boost::asio::ip::tcp::socket& socket)
    : socket_(socket),
      queue_(&boost::asio::use_service<detail::DeadlineQueue>(
          boost::asio::query(socket.get_executor(), boost::asio::execution::context))) {}

// Unlinked, it may outlive its queue: the queue unlinks every deadline when
// its context shuts down.
SocketDeadline::~SocketDeadline() {
  if (queued_hook_.is_linked()) queue_->unqueue(*this);
}

void SocketDeadline::queue_sooner(TimePoint when) { queue_->queue(*this, when); }

error_code SocketDeadline::translate(error_code ec) const {
  if (ec && expired_ && ec == boost::asio::error::operation_aborted) {
    return boost::beast::error::timeout;
  }
  return ec;
}

}  // namespace sluice

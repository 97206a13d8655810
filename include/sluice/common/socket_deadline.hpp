#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <memory>

#include "sluice/common/clock.hpp"
#include "sluice/common/errors.hpp"

namespace sluice {

// A deadline for the operations pending on a socket that costs next to
// nothing to move. Beast's stream starts and cancels a timer around every
// operation, and each cancellation is a further trip through the event loop;
// here one timer stays armed and is re-armed only when it fires early (the
// deadline moved later meanwhile) or must fire sooner. When the deadline
// passes, the socket's pending operations are cancelled: they complete with
// operation_aborted, and expired() says it was the deadline.
class SocketDeadline {
 public:
  explicit SocketDeadline(boost::asio::ip::tcp::socket& socket);
  ~SocketDeadline();
  SocketDeadline(const SocketDeadline&) = delete;
  SocketDeadline& operator=(const SocketDeadline&) = delete;

  void expires_at(TimePoint when);
  void expires_after(Clock::duration after) { expires_at(Clock::now() + after); }
  void expires_never() { expires_at(TimePoint::max()); }
  bool expired() const { return state_->expired; }

  // An operation_aborted that the deadline caused becomes beast's timeout.
  error_code translate(error_code ec) const;

 private:
  struct State {
    explicit State(boost::asio::ip::tcp::socket& socket)
        : socket(socket), timer(socket.get_executor()) {}
    boost::asio::ip::tcp::socket& socket;
    boost::asio::steady_timer timer;
    TimePoint deadline = TimePoint::max();
    TimePoint armed_for = TimePoint::max();  // when the pending wait ends; max: none pending
    bool expired = false;
    std::uint64_t generation = 0;  // tells a superseded wait's completion apart
  };
  static void arm(const std::shared_ptr<State>& state, TimePoint when);
  static void on_timer(const std::weak_ptr<State>& weak, std::uint64_t generation, error_code ec);

  std::shared_ptr<State> state_;
};

}  // namespace sluice

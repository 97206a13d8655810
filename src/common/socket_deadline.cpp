#include "sluice/common/socket_deadline.hpp"

#include <boost/beast/core/error.hpp>

namespace sluice {

SocketDeadline::SocketDeadline(boost::asio::ip::tcp::socket& socket)
    : state_(std::make_shared<State>(socket)) {}

// The pending wait holds only a weak reference: destroying the state cancels
// it, and its completion then finds nothing to act on.
SocketDeadline::~SocketDeadline() = default;

void SocketDeadline::expires_at(TimePoint when) {
  auto& state = *state_;
  state.deadline = when;
  state.expired = false;
  if (when == TimePoint::max()) return;  // an armed wait finds no deadline and stops
  if (state.armed_for <= when) return;
  arm(state_, when);
}

void SocketDeadline::arm(const std::shared_ptr<State>& state, TimePoint when) {
  state->armed_for = when;
  ++state->generation;
  state->timer.expires_at(when);  // a wait armed for later completes as superseded
  state->timer.async_wait([weak = std::weak_ptr<State>(state), generation = state->generation](
                              error_code ec) { on_timer(weak, generation, ec); });
}

void SocketDeadline::on_timer(const std::weak_ptr<State>& weak, std::uint64_t generation,
                              error_code ec) {
  auto state = weak.lock();
  if (!state || generation != state->generation) return;
  state->armed_for = TimePoint::max();
  if (ec || state->deadline == TimePoint::max()) return;
  if (Clock::now() < state->deadline) {
    arm(state, state->deadline);  // moved later since this wait was armed
    return;
  }
  state->expired = true;
  error_code ignored;
  state->socket.cancel(ignored);
}

error_code SocketDeadline::translate(error_code ec) const {
  if (ec && state_->expired && ec == boost::asio::error::operation_aborted) {
    return boost::beast::error::timeout;
  }
  return ec;
}

}  // namespace sluice

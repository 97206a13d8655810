#include "sluice/stream/client_watch.hpp"

#include <boost/beast/core/read_size.hpp>

#include "sluice/http/drain_aware_read.hpp"

namespace sluice::stream {

namespace net = boost::asio;

// The read's completion handler. Destroyed without being called (the event
// loop shut down with the read pending), it lets go of a waiting session:
// the session's frames own the watch, which owns the state, so a waiter left
// in the state would keep them all alive.
class ClientWatch::OnRead {
 public:
  explicit OnRead(std::shared_ptr<State> state) : state_(std::move(state)) {}
  OnRead(OnRead&&) noexcept = default;
  OnRead& operator=(OnRead&&) noexcept = default;
  OnRead(const OnRead&) = delete;
  OnRead& operator=(const OnRead&) = delete;
  ~OnRead() {
    if (state_) state_->waiter = nullptr;
  }

  void operator()(error_code ec, std::size_t bytes) {
    const auto state = std::move(state_);
    state->reading = false;
    if (!state->alive) return;
    if (!ec) state->buffer.commit(bytes);
    // Bytes are the next request, not a departure: the watch ends there.
    if (ec && state->active) {
      state->client_gone = true;
      for (auto* target : state->targets) {
        if (target) target->abort();
      }
    }
    if (state->waiter) {
      Waiter waiter;
      waiter.swap(state->waiter);
      std::move(waiter)(ec);
    } else {
      state->read_result = ec;
    }
  }

 private:
  std::shared_ptr<State> state_;
};

ClientWatch::ClientWatch(net::ip::tcp::socket& client, boost::beast::flat_buffer& buffer)
    : state_(std::make_shared<State>(client, buffer)) {}

ClientWatch::~ClientWatch() { state_->alive = false; }

void ClientWatch::start() {
  auto& state = *state_;
  state.active = true;
  state.client_gone = false;
  state.targets = {};
  // The last read ended the connection, unclaimed.
  if (state.read_result) state.client_gone = true;
}

void ClientWatch::begin_read(void* state_pointer) {
  auto& state = *static_cast<State*>(state_pointer);
  if (!state.alive || !state.active) return;
  start_read(state);
}

void ClientWatch::read_next() { start_read(*state_); }

void ClientWatch::start_read(State& state) {
  if (state.reading || state.read_result) return;
  const std::size_t size = boost::beast::read_size(state.buffer, 65536);
  if (size == 0) return;  // a full buffer: the next request is in it already
  state.reading = true;
  drain_aware_read_some(state.socket, state.buffer.prepare(size), OnRead(state.shared_from_this()));
}

void ClientWatch::stop() {
  state_->active = false;
  for (auto* target : state_->targets) {
    if (target) target->call_when_sent(nullptr, nullptr);
  }
  state_->targets = {};
}

void ClientWatch::cancel() {
  if (!state_->reading) return;
  error_code ignored;
  state_->socket.cancel(ignored);
}

void ClientWatch::watch(upstream::AbortHandle* handle) {
  if (state_->client_gone) {
    handle->abort();
    return;
  }
  for (auto*& target : state_->targets) {
    if (!target) {
      target = handle;
      handle->call_when_sent(&ClientWatch::begin_read, state_.get());
      return;
    }
  }
}

void ClientWatch::unwatch(upstream::AbortHandle* handle) {
  handle->call_when_sent(nullptr, nullptr);
  for (auto*& target : state_->targets) {
    if (target == handle) target = nullptr;
  }
}

}  // namespace sluice::stream

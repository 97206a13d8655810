#include "sluice/stream/client_watch.hpp"

namespace sluice::stream {

namespace net = boost::asio;

ClientWatch::ClientWatch(net::ip::tcp::socket& client) : state_(std::make_shared<State>(client)) {}

ClientWatch::~ClientWatch() { state_->active = false; }

void ClientWatch::start() {
  auto& state = *state_;
  ++state.generation;
  state.active = true;
  state.client_gone = false;
  state.targets = {};
  ++state.pending_waits;
  state.socket.async_wait(net::ip::tcp::socket::wait_read,
                          [state = state_, generation = state.generation](error_code ec) {
                            on_readable(state, generation, ec);
                          });
}

void ClientWatch::on_readable(const std::shared_ptr<State>& state, std::uint64_t generation,
                              error_code ec) {
  --state->pending_waits;
  if (!state->active || generation != state->generation) return;
  // Readable with nothing to read is the end of the connection (or a reset);
  // readable with bytes is a pipelined request, left for the session.
  if (!ec) {
    const std::size_t pending = state->socket.available(ec);
    if (!ec && pending == 0) ec = net::error::eof;
  }
  if (!ec) return;
  state->client_gone = true;
  for (auto* target : state->targets) {
    if (target) target->abort();
  }
}

void ClientWatch::stop() {
  auto& state = *state_;
  state.active = false;
  state.targets = {};
  // Left pending, the wait would complete together with the session's read
  // of the next request and, being first in line, push that read's
  // completion to a later turn of the event loop: the next request would
  // wait for it. Cancelled now, its completion runs while the connection is
  // idle.
  if (state.pending_waits > 0) {
    error_code ignored;
    state.socket.cancel(ignored);
  }
}

void ClientWatch::watch(upstream::AbortHandle* handle) {
  if (state_->client_gone) {
    handle->abort();
    return;
  }
  for (auto*& target : state_->targets) {
    if (!target) {
      target = handle;
      return;
    }
  }
}

void ClientWatch::unwatch(upstream::AbortHandle* handle) {
  for (auto*& target : state_->targets) {
    if (target == handle) target = nullptr;
  }
}

}  // namespace sluice::stream

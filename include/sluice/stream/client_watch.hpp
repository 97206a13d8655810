#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include "sluice/upstream/client.hpp"

namespace sluice::stream {

// Waits for the client socket to become readable while a request waits on
// its upstream, so a client that goes away aborts the upstream exchange at
// once instead of at the next write. It reads nothing: bytes the client
// pipelines meanwhile stay in the socket for the next request, and a held
// stream keeps no read buffer for its watch.
class ClientWatch {
 public:
  explicit ClientWatch(boost::beast::tcp_stream& client);
  ClientWatch(const ClientWatch&) = delete;
  ClientWatch& operator=(const ClientWatch&) = delete;

  void start();
  // Cancels the pending wait and waits until it has finished; must be
  // awaited before the watch is destroyed once started.
  boost::asio::awaitable<void> stop();

  // Exchanges to abort when the client goes; at most two run at once (hedge).
  void watch(upstream::AbortHandle* handle);
  void unwatch(upstream::AbortHandle* handle);

  bool client_gone() const { return client_gone_; }

 private:
  boost::asio::awaitable<void> run();

  boost::beast::tcp_stream& client_;
  boost::asio::steady_timer finished_signal_;
  std::array<upstream::AbortHandle*, 2> targets_{};
  bool running_ = false;
  bool stopping_ = false;
  bool client_gone_ = false;
};

}  // namespace sluice::stream

#pragma once

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <memory>

#include "sluice/upstream/client.hpp"

namespace sluice::stream {

// Waits for the client socket to become readable while a request waits on
// its upstream, so a client that goes away aborts the upstream exchange at
// once instead of at the next write. It reads nothing: bytes the client
// pipelines meanwhile stay in the socket for the next request, and a held
// stream keeps no read buffer for its watch.
//
// One watch serves every request of a connection. The wait is a plain
// completion handler, not a coroutine, and nothing waits for it to finish:
// a wait that completes after its request has ended finds a newer
// generation (or none) and does nothing.
class ClientWatch {
 public:
  explicit ClientWatch(boost::asio::ip::tcp::socket& client);
  // A wait still pending may complete after the watch is gone; it finds the
  // state inactive and does nothing.
  ~ClientWatch();
  ClientWatch(const ClientWatch&) = delete;
  ClientWatch& operator=(const ClientWatch&) = delete;

  // Watches for the current request; clears what the last one saw.
  void start();
  // Ends the current request's watch (the response has been written):
  // cancels the wait, whose completion then does nothing.
  void stop();

  // Exchanges to abort when the client goes; at most two run at once (hedge).
  void watch(upstream::AbortHandle* handle);
  void unwatch(upstream::AbortHandle* handle);

  bool client_gone() const { return state_->client_gone; }

 private:
  struct State {
    explicit State(boost::asio::ip::tcp::socket& socket) : socket(socket) {}
    boost::asio::ip::tcp::socket& socket;  // used only while active
    std::uint64_t generation = 0;          // one per start()
    bool active = false;
    bool client_gone = false;
    unsigned pending_waits = 0;
    std::array<upstream::AbortHandle*, 2> targets{};
  };
  static void on_readable(const std::shared_ptr<State>& state, std::uint64_t generation,
                          error_code ec);

  std::shared_ptr<State> state_;
};

}  // namespace sluice::stream

#pragma once

#include <array>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <memory>
#include <utility>

#include "sluice/upstream/client.hpp"

namespace sluice::stream {

// Reads from the client while its request is answered, so that a client that
// goes away aborts the upstream exchange at once instead of at the next
// write. What the read brings is the client's next request (pipelined, or
// sent once the answer has arrived): it goes into the connection's buffer,
// and the session takes the read over for that request. So watching a
// request and waiting for the next one share one read, and each costs the
// event loop one system call less than a wait for readability followed by a
// read (each wait re-registers the socket with epoll; each fresh read first
// tries the socket, which is empty right after an answer).
//
// One watch serves every request of a connection and reads into the
// connection's own buffer, which the session does not touch while a request
// is answered. The read starts once an exchange it watches has written its
// request: on an idle connection it finds the socket empty first, a system
// call that would otherwise sit between the client's request and the
// upstream's.
class ClientWatch {
 public:
  ClientWatch(boost::asio::ip::tcp::socket& client, boost::beast::flat_buffer& buffer);
  // The read still in progress completes (cancelled, or at shutdown is
  // destroyed) after the watch is gone; it finds the state inactive and
  // touches neither socket nor buffer.
  ~ClientWatch();
  ClientWatch(const ClientWatch&) = delete;
  ClientWatch& operator=(const ClientWatch&) = delete;

  // Watches for the current request; clears what the last one saw.
  void start();
  // Ends the current request's watch (the answer has been written). A read
  // in progress carries on: it is the next request's.
  void stop();
  // Stops a read in progress (the connection is closing).
  void cancel();
  // Starts the read for the next request if none is in progress and none
  // ended unclaimed: the last answer started no watch (it needed no
  // upstream), and the session waits for the next request through the watch
  // all the same, so that it sees when that request's first bytes come.
  void read_next();

  // Exchanges to abort when the client goes; at most two run at once (hedge).
  // Once one has sent its request, the watch starts a read unless one is in
  // progress or has ended unclaimed.
  void watch(upstream::AbortHandle* handle);
  void unwatch(upstream::AbortHandle* handle);

  bool client_gone() const { return state_->client_gone; }

  // Whether a read the watch started has not completed yet.
  bool reading() const { return state_->reading; }
  // The outcome of a read that has completed, handed over once: its bytes
  // are in the buffer already; an error (end of stream, reset, cancelled) is
  // returned. Success when no read was made.
  error_code take_read_result() { return std::exchange(state_->read_result, {}); }
  // Waits for the read in progress, then hands its outcome over as
  // take_read_result() does. Completes with void(error_code).
  template <class CompletionToken>
  auto async_take_read(CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(error_code)>(
        [state = state_](auto handler) {
          if (state->reading) {
            // Swapped in: Boost 1.81's move assignment of the handler recurses.
            Waiter(std::move(handler)).swap(state->waiter);
          } else {
            auto executor = state->socket.get_executor();
            boost::asio::post(executor, boost::asio::append(std::move(handler),
                                                            std::exchange(state->read_result, {})));
          }
        },
        token);
  }

 private:
  using Waiter = boost::asio::any_completion_handler<void(error_code)>;
  struct State : std::enable_shared_from_this<State> {
    State(boost::asio::ip::tcp::socket& socket, boost::beast::flat_buffer& buffer)
        : socket(socket), buffer(buffer) {}
    boost::asio::ip::tcp::socket& socket;  // socket and buffer: used only while alive
    boost::beast::flat_buffer& buffer;
    bool alive = true;
    bool active = false;  // a request is being answered
    bool reading = false;
    bool client_gone = false;
    error_code read_result;
    Waiter waiter;  // the session, waiting for the read to complete
    std::array<upstream::AbortHandle*, 2> targets{};
  };
  class OnRead;
  static void begin_read(void* state);
  static void start_read(State& state);

  std::shared_ptr<State> state_;
};

}  // namespace sluice::stream

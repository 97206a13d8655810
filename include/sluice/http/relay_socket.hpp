#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <span>

#include "sluice/http/drain_aware_read.hpp"
#include "sluice/http/network_errors.hpp"
#include "sluice/http/socket_deadline.hpp"

namespace sluice {

// Every socket of the relay, on either side, is
// - without Nagle's delay: every event goes out as it is written;
// - non-blocking, so that writes are offered to the socket before anything
//   is awaited (write_now in eager_write.hpp);
// - set for TCP_INQ, so that a read tells when it emptied the socket and the
//   next one waits for readiness without trying first
//   (drain_aware_read.hpp). Reads through TLS ignore it.
// Each of those is a system call per connection when made on the socket
// itself. A connection opened by hundreds at once pays them all together.

// Sets TCP_NODELAY and TCP_INQ on the listening socket: on Linux each
// accepted connection inherits both (the tests check that it does).
inline void prepare_relay_listener(boost::asio::ip::tcp::acceptor& listener) {
  error_code ignored;
  listener.set_option(boost::asio::ip::tcp::no_delay(true), ignored);
  enable_drain_tracking(listener.native_handle());
}

// Tells Asio that `socket`'s descriptor is non-blocking already -- accepted
// or opened with SOCK_NONBLOCK -- without the ioctl that non_blocking(true)
// makes.
inline void take_as_non_blocking(boost::asio::ip::tcp::socket& socket) {
#if SLUICE_HAS_DRAIN_AWARE_READ
  namespace socket_ops = boost::asio::detail::socket_ops;
  drain_aware_detail::SocketParts::io_object(socket).get_implementation().state_ |=
      socket_ops::user_set_non_blocking | socket_ops::internal_non_blocking;
#else
  error_code ignored;
  socket.non_blocking(true, ignored);
#endif
}

// Tells Asio that `socket`'s descriptor is no duplicate of another: assign
// has to assume it may be, and then removes it from epoll before closing it.
// The kernel removes a closed descriptor that has no duplicate by itself,
// so that is one epoll_ctl less per connection.
inline void take_as_sole_descriptor(boost::asio::ip::tcp::socket& socket) {
#if SLUICE_HAS_DRAIN_AWARE_READ
  drain_aware_detail::SocketParts::io_object(socket).get_implementation().state_ &=
      static_cast<boost::asio::detail::socket_ops::state_type>(
          ~boost::asio::detail::socket_ops::possible_dup);
#else
  (void)socket;
#endif
}

// A connection accepted with SOCK_NONBLOCK, by accept4 and no other call,
// from a listener that prepare_relay_listener set.
inline void prepare_accepted_relay_socket(boost::asio::ip::tcp::socket& socket) {
  take_as_non_blocking(socket);
  take_as_sole_descriptor(socket);
}

// Opens `socket` and connects it to the first of `endpoints` that accepts,
// as a relay socket: the descriptor is made non-blocking, without Nagle's
// delay and with TCP_INQ, by socket() and setsockopt before the connect.
// Asio's own connect would add an ioctl to make it non-blocking and a poll
// before it asks for the connect's outcome. `deadline` bounds the whole
// (a timeout comes back as beast's error::timeout); an endpoint that
// refuses is given up for the next one. On failure the socket is closed and
// the last endpoint's error returned.
boost::asio::awaitable<error_code> connect_relay_socket(
    boost::asio::ip::tcp::socket& socket, std::span<const boost::asio::ip::tcp::endpoint> endpoints,
    SocketDeadline& deadline);

}  // namespace sluice

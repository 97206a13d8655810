#include "sluice/http/relay_socket.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <cerrno>

namespace sluice {

namespace {

error_code last_system_error() { return {errno, boost::system::system_category()}; }

// Whether a connect that answered EINPROGRESS has finished all the same.
// Over loopback it has: the handshake ran inside the call. Asking costs one
// system call; waiting for writability costs a pass of the event loop, at
// the back of whatever else is ready, which in a burst of new streams is
// hundreds of them.
bool connected_already(int descriptor) {
  tcp_info info{};
  socklen_t size = sizeof info;
  return ::getsockopt(descriptor, IPPROTO_TCP, TCP_INFO, &info, &size) == 0 &&
         info.tcpi_state == TCP_ESTABLISHED;
}

// A non-blocking descriptor for `endpoint`, set as every relay socket is,
// and its connect started; the socket owns it from here. `finished` tells
// whether the connect is done already.
error_code open_and_start_connect(boost::asio::ip::tcp::socket& socket,
                                  const boost::asio::ip::tcp::endpoint& endpoint, bool& finished) {
  const auto protocol = endpoint.protocol();
  const int descriptor =
      ::socket(protocol.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol.protocol());
  if (descriptor < 0) return last_system_error();
  const int on = 1;
  ::setsockopt(descriptor, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  enable_drain_tracking(descriptor);
  error_code ec;
  socket.assign(protocol, descriptor, ec);
  if (ec) {
    ::close(descriptor);
    return ec;
  }
  take_as_non_blocking(socket);
  take_as_sole_descriptor(socket);
  if (::connect(descriptor, endpoint.data(), static_cast<socklen_t>(endpoint.size())) == 0) {
    finished = true;
    return {};
  }
  if (errno != EINPROGRESS) return last_system_error();
  finished = connected_already(descriptor);
  return {};
}

}  // namespace

boost::asio::awaitable<error_code> connect_relay_socket(
    boost::asio::ip::tcp::socket& socket, std::span<const boost::asio::ip::tcp::endpoint> endpoints,
    SocketDeadline& deadline) {
  using boost::asio::as_tuple;
  using boost::asio::use_awaitable;
  error_code ec = boost::asio::error::host_not_found;
  for (const auto& endpoint : endpoints) {
    error_code ignored;
    socket.close(ignored);
    if (deadline.expired()) {
      ec = boost::beast::error::timeout;
      break;
    }
    bool finished = false;
    ec = open_and_start_connect(socket, endpoint, finished);
    if (!ec && !finished) {
      // Writable once the handshake is done or has failed; SO_ERROR tells which.
      auto [wait_ec] = co_await socket.async_wait(boost::asio::ip::tcp::socket::wait_write,
                                                  as_tuple(use_awaitable));
      ec = deadline.translate(wait_ec);
      if (!ec) {
        int outcome = 0;
        socklen_t size = sizeof outcome;
        if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_ERROR, &outcome, &size) != 0) {
          ec = last_system_error();
        } else if (outcome != 0) {
          ec = error_code(outcome, boost::system::system_category());
        }
      }
    }
    if (!ec) co_return ec;
    // Out of time, or closed by the caller (an aborted attempt): no next try.
    if (ec == boost::beast::error::timeout || ec == boost::asio::error::operation_aborted) break;
  }
  error_code ignored;
  socket.close(ignored);
  co_return ec;
}

}  // namespace sluice

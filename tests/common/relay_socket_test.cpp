// Relay sockets are readied with as few system calls as the kernel allows:
// accepted connections inherit TCP_NODELAY and TCP_INQ from the listener,
// and a descriptor that is non-blocking already is not set so again.
#include "sluice/common/relay_socket.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdarg>

// Counts ioctl calls and epoll_ctl deletions of one descriptor.
namespace {
std::atomic<int> counted_descriptor{-1};
std::atomic<int> counted_ioctls{0};
std::atomic<int> counted_epoll_deletions{0};
}  // namespace

extern "C" int epoll_ctl(int epoll, int operation, int descriptor, epoll_event* event) {
  using Real = int (*)(int, int, int, epoll_event*);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "epoll_ctl"));
  if (descriptor == counted_descriptor.load() && operation == EPOLL_CTL_DEL) {
    ++counted_epoll_deletions;
  }
  return real(epoll, operation, descriptor, event);
}

extern "C" int ioctl(int descriptor, unsigned long request, ...) {  // NOLINT(google-runtime-int)
  using Real = int (*)(int, unsigned long, void*);                  // NOLINT(google-runtime-int)
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "ioctl"));
  va_list arguments;
  va_start(arguments, request);
  void* argument = va_arg(arguments, void*);
  va_end(arguments);
  if (descriptor == counted_descriptor.load()) ++counted_ioctls;
  return real(descriptor, request, argument);
}

namespace sluice::testing {
namespace {

namespace net = boost::asio;
using net::ip::tcp;

int tcp_option(int descriptor, int option) {
  int value = -1;
  socklen_t size = sizeof value;
  EXPECT_EQ(::getsockopt(descriptor, IPPROTO_TCP, option, &value, &size), 0) << option;
  return value;
}

bool descriptor_is_non_blocking(int descriptor) {
  return (::fcntl(descriptor, F_GETFL) & O_NONBLOCK) != 0;
}

// A listener on 127.0.0.1 with a connection waiting in its queue, taken the
// way the gateway takes it (accept4 with SOCK_NONBLOCK).
struct Accepted {
  net::io_context context;
  tcp::acceptor listener{context};
  tcp::socket client{context};
  tcp::socket socket{context};

  explicit Accepted(bool prepared_listener) {
    listener.open(tcp::v4());
    listener.bind({net::ip::make_address("127.0.0.1"), 0});
    listener.listen();
    if (prepared_listener) prepare_relay_listener(listener);
    client.connect(listener.local_endpoint());
    const int descriptor =
        ::accept4(listener.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    EXPECT_GE(descriptor, 0);
    socket.assign(tcp::v4(), descriptor);
  }
};

TEST(RelaySocket, AcceptedConnectionsInheritNoDelayAndInqFromThePreparedListener) {
  Accepted accepted(true);
  prepare_accepted_relay_socket(accepted.socket);
  EXPECT_EQ(tcp_option(accepted.socket.native_handle(), TCP_NODELAY), 1);
  EXPECT_EQ(tcp_option(accepted.socket.native_handle(), TCP_INQ), 1);
}

TEST(RelaySocket, WithoutThePreparedListenerAcceptedConnectionsHaveNeither) {
  Accepted accepted(false);
  prepare_accepted_relay_socket(accepted.socket);
  EXPECT_EQ(tcp_option(accepted.socket.native_handle(), TCP_NODELAY), 0);
  EXPECT_EQ(tcp_option(accepted.socket.native_handle(), TCP_INQ), 0);
}

TEST(RelaySocket, AcceptedSocketIsTakenAsNonBlockingWithoutAnIoctl) {
  Accepted accepted(true);
  ASSERT_FALSE(accepted.socket.non_blocking());
  counted_ioctls = 0;
  counted_descriptor = accepted.socket.native_handle();
  prepare_accepted_relay_socket(accepted.socket);
  counted_descriptor = -1;
  // write_now writes to a socket only when Asio says it is non-blocking.
  EXPECT_TRUE(accepted.socket.non_blocking());
  EXPECT_TRUE(descriptor_is_non_blocking(accepted.socket.native_handle()));
  if (SLUICE_HAS_DRAIN_AWARE_READ) {
    EXPECT_EQ(counted_ioctls.load(), 0);
  }
}

TEST(RelaySocket, AcceptedSocketClosesWithoutLeavingEpollFirst) {
  for (const bool prepared : {false, true}) {
    Accepted accepted(true);
    if (prepared) prepare_accepted_relay_socket(accepted.socket);
    counted_epoll_deletions = 0;
    counted_descriptor = accepted.socket.native_handle();
    accepted.socket.close();
    counted_descriptor = -1;
    // Asio's own close of an assigned socket, then the prepared one.
    if (SLUICE_HAS_DRAIN_AWARE_READ) {
      EXPECT_EQ(counted_epoll_deletions.load(), prepared ? 0 : 1);
    }
  }
}

TEST(RelaySocket, ConnectedSocketIsReadiedWithoutAnotherIoctl) {
  net::io_context context;
  tcp::acceptor listener(context, {net::ip::make_address("127.0.0.1"), 0});
  tcp::socket upstream(context);
  error_code connect_ec = net::error::would_block;
  upstream.async_connect(listener.local_endpoint(), [&](error_code ec) { connect_ec = ec; });
  context.run();
  ASSERT_FALSE(connect_ec);

  counted_ioctls = 0;
  counted_descriptor = upstream.native_handle();
  prepare_connected_relay_socket(upstream);
  counted_descriptor = -1;
  EXPECT_TRUE(upstream.non_blocking());
  // Asio's connect made the descriptor non-blocking; nothing else needs to.
  EXPECT_TRUE(descriptor_is_non_blocking(upstream.native_handle()));
  if (SLUICE_HAS_DRAIN_AWARE_READ) {
    EXPECT_EQ(counted_ioctls.load(), 0);
  }
  EXPECT_EQ(tcp_option(upstream.native_handle(), TCP_NODELAY), 1);
  EXPECT_EQ(tcp_option(upstream.native_handle(), TCP_INQ), 1);
}

}  // namespace
}  // namespace sluice::testing

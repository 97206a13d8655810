// Relay sockets are readied with as few system calls as the kernel allows:
// accepted connections inherit TCP_NODELAY and TCP_INQ from the listener, a
// descriptor that is non-blocking already is not set so again, and upstream
// connections are opened ready, without Asio's ioctl and poll.
#include "sluice/http/relay_socket.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>

#include <array>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core/error.hpp>
#include <chrono>
#include <cstdarg>
#include <optional>
#include <vector>

// Counts ioctl calls and epoll_ctl deletions of one descriptor (any
// descriptor while counting_all is set), and poll calls.
namespace {
std::atomic<int> counted_descriptor{-1};
std::atomic<bool> counting_all{false};
std::atomic<int> counted_ioctls{0};
std::atomic<int> counted_polls{0};
std::atomic<int> counted_epoll_deletions{0};

bool counted(int descriptor) {
  return counting_all.load() || descriptor == counted_descriptor.load();
}
}  // namespace

extern "C" int epoll_ctl(int epoll, int operation, int descriptor, epoll_event* event) {
  using Real = int (*)(int, int, int, epoll_event*);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "epoll_ctl"));
  if (counted(descriptor) && operation == EPOLL_CTL_DEL) {
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
  if (counted(descriptor)) ++counted_ioctls;
  return real(descriptor, request, argument);
}

extern "C" int poll(pollfd* descriptors, nfds_t count, int timeout) {
  using Real = int (*)(pollfd*, nfds_t, int);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "poll"));
  if (counting_all.load()) ++counted_polls;
  return real(descriptors, count, timeout);
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

// Runs connect_relay_socket on `context` until it ends.
error_code connect_now(net::io_context& context, tcp::socket& socket,
                       const std::vector<tcp::endpoint>& endpoints,
                       std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  SocketDeadline deadline(socket);
  deadline.expires_after(limit);
  std::optional<error_code> outcome;
  net::co_spawn(context, connect_relay_socket(socket, endpoints, deadline),
                [&](std::exception_ptr, error_code ec) { outcome = ec; });
  context.restart();
  const auto give_up = std::chrono::steady_clock::now() + limit + std::chrono::seconds(5);
  while (!outcome && context.run_one_until(give_up) > 0) {
  }
  EXPECT_TRUE(outcome) << "the connect did not end";
  return outcome.value_or(net::error::timed_out);
}

// A port on 127.0.0.1 that nothing listens on.
tcp::endpoint refusing_endpoint(net::io_context& context) {
  tcp::acceptor closed(context, {net::ip::make_address("127.0.0.1"), 0});
  return closed.local_endpoint();
}

TEST(RelaySocket, UpstreamConnectionIsOpenedReadyWithoutIoctlOrPoll) {
  net::io_context context;
  tcp::acceptor listener(context, {net::ip::make_address("127.0.0.1"), 0});
  tcp::socket upstream(context);
  counted_ioctls = 0;
  counted_polls = 0;
  counting_all = true;
  auto ec = connect_now(context, upstream, {listener.local_endpoint()});
  counting_all = false;
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(upstream.remote_endpoint(), listener.local_endpoint());
  EXPECT_TRUE(upstream.non_blocking());
  EXPECT_TRUE(descriptor_is_non_blocking(upstream.native_handle()));
  EXPECT_EQ(tcp_option(upstream.native_handle(), TCP_NODELAY), 1);
  EXPECT_EQ(tcp_option(upstream.native_handle(), TCP_INQ), 1);
  if (SLUICE_HAS_DRAIN_AWARE_READ) {
    EXPECT_EQ(counted_ioctls.load(), 0);
  }
  // Asio's connect polls the socket before it asks for the outcome.
  EXPECT_EQ(counted_polls.load(), 0);

  // It closes without leaving epoll first, as an accepted one does.
  counted_epoll_deletions = 0;
  counted_descriptor = upstream.native_handle();
  upstream.close();
  counted_descriptor = -1;
  if (SLUICE_HAS_DRAIN_AWARE_READ) {
    EXPECT_EQ(counted_epoll_deletions.load(), 0);
  }
}

TEST(RelaySocket, UpstreamConnectMovesOnFromAnEndpointThatRefuses) {
  net::io_context context;
  tcp::acceptor listener(context, {net::ip::make_address("127.0.0.1"), 0});
  tcp::socket upstream(context);
  auto ec = connect_now(context, upstream, {refusing_endpoint(context), listener.local_endpoint()});
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(upstream.remote_endpoint(), listener.local_endpoint());

  tcp::socket refused(context);
  ec = connect_now(context, refused, {refusing_endpoint(context), refusing_endpoint(context)});
  EXPECT_EQ(ec, net::error::connection_refused) << ec.message();
  EXPECT_FALSE(refused.is_open());
}

// A listener whose queue is full drops further handshakes: the connect
// ends at its deadline, not at the kernel's (minutes).
TEST(RelaySocket, UpstreamConnectEndsAtItsDeadline) {
  net::io_context context;
  tcp::acceptor listener(context);
  listener.open(tcp::v4());
  listener.bind({net::ip::make_address("127.0.0.1"), 0});
  listener.listen(0);
  std::array<tcp::socket, 2> queued{tcp::socket(context), tcp::socket(context)};
  const auto target = listener.local_endpoint();
  for (auto& socket : queued) {
    socket.open(tcp::v4());
    socket.non_blocking(true);
    // Asio's connect would wait for the handshake even so.
    ::connect(socket.native_handle(), target.data(), static_cast<socklen_t>(target.size()));
  }
  tcp::socket upstream(context);
  const auto started = std::chrono::steady_clock::now();
  auto ec =
      connect_now(context, upstream, {listener.local_endpoint()}, std::chrono::milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(ec, boost::beast::error::timeout) << ec.message();
  EXPECT_FALSE(upstream.is_open());
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(3));
}

}  // namespace
}  // namespace sluice::testing

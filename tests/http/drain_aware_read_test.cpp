// drain_aware_read_some: a read that emptied a tracked socket makes the next
// read wait for readiness without a system call, but never loses data, an
// end of stream or a reset behind it; a read awaiting a reply skips its first try and
// still gets a reply that is already there; untracked sockets read as Asio
// does; cancellation, errors and empty buffers complete as Asio's do.
#include "sluice/http/drain_aware_read.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <functional>
#include <string>
#include <thread>

#include "support/socket_pair.hpp"

// Counts recvmsg calls on one descriptor: the system calls these reads make.
namespace {
std::atomic<int> recvmsg_descriptor{-1};
std::atomic<int> counted_recvmsgs{0};
}  // namespace

extern "C" ssize_t recvmsg(int descriptor, msghdr* message, int flags) {
  using Real = ssize_t (*)(int, msghdr*, int);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "recvmsg"));
  if (descriptor == recvmsg_descriptor.load()) ++counted_recvmsgs;
  return real(descriptor, message, flags);
}

namespace sluice::testing {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using net::ip::tcp;

// With another Boost than 1.81 the reads are Asio's own, which call recv.
constexpr bool kCountsSystemCalls = SLUICE_HAS_DRAIN_AWARE_READ;
constexpr const char* kNotCounted = "reads are Asio's own with this Boost";

struct Received {
  error_code ec;
  std::string bytes;
};

net::awaitable<Received> read_some(tcp::socket& socket, std::size_t room,
                                   ReadStart start = ReadStart::try_at_once) {
  std::string bytes(room, '\0');
  auto [ec, n] = co_await drain_aware_read_some(socket, net::buffer(bytes),
                                                net::as_tuple(net::use_awaitable), start);
  bytes.resize(n);
  co_return Received{ec, std::move(bytes)};
}

// Waits until `bytes` are queued on our side (the kernel has them), without
// reading them.
void wait_until_queued(tcp::socket& socket, std::size_t bytes) {
  for (int tries = 0; tries < 1000; ++tries) {
    char peek[256];
    const auto queued = ::recv(socket.native_handle(), peek, sizeof peek, MSG_PEEK | MSG_DONTWAIT);
    if (queued >= static_cast<ssize_t>(bytes)) return;
    std::this_thread::sleep_for(1ms);
  }
  FAIL() << "the peer's bytes never arrived";
}

struct Counting {
  explicit Counting(tcp::socket& socket) {
    counted_recvmsgs = 0;
    recvmsg_descriptor = socket.native_handle();
  }
  ~Counting() { recvmsg_descriptor = -1; }
  int calls() const { return counted_recvmsgs.load(); }
};

// Reads `first` as the gateway does (the read waits, then the bytes arrive),
// then counts the system calls of a read of `second` that starts before it
// is sent.
int calls_for_the_read_after(SocketPair& pair, const std::string& first,
                             const std::string& second) {
  int calls = -1;
  pair.run([&]() -> net::awaitable<void> {
    pair.write_after(20ms, first);
    auto one = co_await read_some(pair.ours, 64);
    EXPECT_EQ(one.bytes, first);
    Counting counting(pair.ours);
    pair.write_after(20ms, second);
    auto two = co_await read_some(pair.ours, 64);
    EXPECT_FALSE(two.ec);
    EXPECT_EQ(two.bytes, second);
    calls = counting.calls();
  }());
  return calls;
}

TEST(DrainAwareRead, ReadThatEmptiedTrackedSocketLetsTheNextOneWaitWithoutTrying) {
  if (!kCountsSystemCalls) GTEST_SKIP() << kNotCounted;
  SocketPair pair;
  enable_drain_tracking(pair.ours);
  // Only the read that returned data: none found the socket empty.
  EXPECT_EQ(calls_for_the_read_after(pair, "hello", "world"), 1);
}

TEST(DrainAwareRead, UntrackedSocketTriesEveryReadFirstAsAsioDoes) {
  if (!kCountsSystemCalls) GTEST_SKIP() << kNotCounted;
  SocketPair pair;
  // The read tried first and found nothing, then read the data.
  EXPECT_EQ(calls_for_the_read_after(pair, "hello", "world"), 2);
}

TEST(DrainAwareRead, ReadThatFilledItsRoomTriesTheNextAtOnce) {
  if (!kCountsSystemCalls) GTEST_SKIP() << kNotCounted;
  SocketPair pair;
  enable_drain_tracking(pair.ours);
  net::write(pair.theirs, net::buffer("0123456789abcdefghij", 20));
  wait_until_queued(pair.ours, 20);
  Counting counting(pair.ours);
  pair.run([&]() -> net::awaitable<void> {
    auto first = co_await read_some(pair.ours, 10);
    auto second = co_await read_some(pair.ours, 10);
    EXPECT_EQ(first.bytes + second.bytes, "0123456789abcdefghij");
  }());
  EXPECT_EQ(counting.calls(), 2);
}

// The peer sends its last bytes and ends (or resets) the connection at once,
// while our read waits: both arrive before the event loop looks again, so
// the read that takes the bytes is the one that must not hide the end.
Received read_after_the_last_bytes(SocketPair& pair, std::function<void()> end) {
  Received after_data;
  pair.run(
      [&]() -> net::awaitable<void> {
        pair.after(20ms, [&] {
          net::write(pair.theirs, net::buffer("last words", 10));
          end();
        });
        auto data = co_await read_some(pair.ours, 64);
        EXPECT_EQ(data.bytes, "last words");
        after_data = co_await read_some(pair.ours, 64);
      }(),
      2s);
  return after_data;
}

TEST(DrainAwareRead, EndOfStreamBehindTheDataIsStillSeen) {
  SocketPair pair;
  enable_drain_tracking(pair.ours);
  auto end =
      read_after_the_last_bytes(pair, [&] { pair.theirs.shutdown(tcp::socket::shutdown_send); });
  EXPECT_EQ(end.ec, net::error::eof);
  EXPECT_TRUE(end.bytes.empty());
}

TEST(DrainAwareRead, ResetBehindTheDataIsReportedOnAnUntrackedSocket) {
  SocketPair pair;
  auto end = read_after_the_last_bytes(pair, [&] {
    pair.theirs.set_option(net::socket_base::linger(true, 0));
    pair.theirs.close();  // a reset, not a FIN
  });
  EXPECT_EQ(end.ec, net::error::connection_reset);
}

// TCP_INQ reports nothing left when a reset waits behind the data; the
// wake-up that brought both reports a hang-up, and that keeps the socket
// from being taken for drained.
TEST(DrainAwareRead, ResetBehindTheDataIsReportedOnATrackedSocket) {
  SocketPair pair;
  enable_drain_tracking(pair.ours);
  auto end = read_after_the_last_bytes(pair, [&] {
    pair.theirs.set_option(net::socket_base::linger(true, 0));
    pair.theirs.close();
  });
  EXPECT_EQ(end.ec, net::error::connection_reset);
}

TEST(DrainAwareRead, AwaitingReplyWaitsForTheReplyWithoutTryingFirst) {
  if (!kCountsSystemCalls) GTEST_SKIP() << kNotCounted;
  SocketPair pair;
  Counting counting(pair.ours);
  pair.run([&]() -> net::awaitable<void> {
    net::write(pair.ours, net::buffer("ping", 4));
    pair.write_after(30ms, "pong");
    auto reply = co_await read_some(pair.ours, 64, ReadStart::awaiting_reply);
    EXPECT_FALSE(reply.ec);
    EXPECT_EQ(reply.bytes, "pong");
  }());
  EXPECT_EQ(counting.calls(), 1);
}

TEST(DrainAwareRead, AwaitingReplyGetsAReplyThatIsAlreadyThere) {
  SocketPair pair;
  // The reply arrives before the read starts, with no wait in the event
  // loop in between: its readiness is still to be reported.
  net::write(pair.theirs, net::buffer("early", 5));
  wait_until_queued(pair.ours, 5);
  pair.run(
      [&]() -> net::awaitable<void> {
        auto reply = co_await read_some(pair.ours, 64, ReadStart::awaiting_reply);
        EXPECT_EQ(reply.bytes, "early");
      }(),
      2s);
}

TEST(DrainAwareRead, CancelEndsAWaitingRead) {
  SocketPair pair;
  enable_drain_tracking(pair.ours);
  pair.run([&]() -> net::awaitable<void> {
    net::steady_timer timer(pair.context, 20ms);
    timer.async_wait([&](error_code) { pair.ours.cancel(); });
    auto result = co_await read_some(pair.ours, 64);
    EXPECT_EQ(result.ec, net::error::operation_aborted);
  }());
}

TEST(DrainAwareRead, CancellationSlotEndsAWaitingRead) {
  SocketPair pair;
  net::cancellation_signal signal;
  std::optional<error_code> outcome;
  std::string room(16, '\0');
  drain_aware_read_some(pair.ours, net::buffer(room),
                        net::bind_cancellation_slot(
                            signal.slot(), [&](error_code ec, std::size_t) { outcome = ec; }));
  pair.context.poll();
  EXPECT_FALSE(outcome);
  signal.emit(net::cancellation_type::terminal);
  pair.context.run_for(2s);
  ASSERT_TRUE(outcome);
  EXPECT_EQ(*outcome, net::error::operation_aborted);
}

TEST(DrainAwareRead, NoRoomCompletesAtOnceWithoutASystemCall) {
  if (!kCountsSystemCalls) GTEST_SKIP() << kNotCounted;
  SocketPair pair;
  Counting counting(pair.ours);
  pair.run([&]() -> net::awaitable<void> {
    auto result = co_await read_some(pair.ours, 0);
    EXPECT_FALSE(result.ec);
    EXPECT_TRUE(result.bytes.empty());
  }());
  EXPECT_EQ(counting.calls(), 0);
}

}  // namespace
}  // namespace sluice::testing

// SocketDeadline: a read pending past the deadline ends as a timeout; moving
// the deadline later keeps it pending; no deadline lets it wait; destroying
// the deadline with its timer armed is harmless; the deadlines of several
// sockets share their context's queue, which takes the places that come up
// together in one wake-up, and a context made where an ended one was gets a
// queue of its own. read_http parses what is
// buffered without reading, maps the end of the stream as Beast does, and
// starts no read once its deadline has passed.
#include "sluice/http/socket_deadline.hpp"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <memory>
#include <optional>
#include <vector>

#include "sluice/http/http_read.hpp"
#include "support/socket_pair.hpp"

namespace sluice::testing {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using namespace std::chrono_literals;
using net::ip::tcp;

net::awaitable<error_code> read_one(tcp::socket& socket, SocketDeadline& deadline) {
  char byte = 0;
  auto [ec, n] =
      co_await socket.async_read_some(net::buffer(&byte, 1), net::as_tuple(net::use_awaitable));
  co_return deadline.translate(ec);
}

TEST(SocketDeadline, PendingReadEndsAsTimeoutOnceItPasses) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  error_code result;
  auto started = Clock::now();
  TimePoint ended;
  pair.run([&]() -> net::awaitable<void> {
    deadline.expires_after(50ms);
    result = co_await read_one(pair.ours, deadline);
    ended = Clock::now();
  }());
  EXPECT_EQ(result, beast::error::timeout);
  EXPECT_TRUE(deadline.expired());
  EXPECT_GE(ended - started, 50ms);
  EXPECT_LT(ended - started, 2s);
}

TEST(SocketDeadline, MovedLaterTheReadOutlivesTheFirstDeadline) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  error_code result;
  pair.run([&]() -> net::awaitable<void> {
    deadline.expires_after(30ms);   // armed for 30 ms...
    deadline.expires_after(300ms);  // ...then moved: the timer fires early and waits again
    pair.write_after(100ms, "x");
    result = co_await read_one(pair.ours, deadline);
  }());
  EXPECT_FALSE(result) << result.message();
  EXPECT_FALSE(deadline.expired());
}

TEST(SocketDeadline, MovedSoonerItFiresAtTheNewTime) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  error_code result;
  auto started = Clock::now();
  TimePoint ended;
  pair.run([&]() -> net::awaitable<void> {
    deadline.expires_after(10s);
    deadline.expires_after(40ms);
    result = co_await read_one(pair.ours, deadline);
    ended = Clock::now();
  }());
  EXPECT_EQ(result, beast::error::timeout);
  EXPECT_LT(ended - started, 2s);
}

TEST(SocketDeadline, NoDeadlineLetsTheReadWait) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  error_code result;
  pair.run([&]() -> net::awaitable<void> {
    deadline.expires_after(20ms);
    deadline.expires_never();  // the armed timer fires, finds no deadline, stops
    pair.write_after(150ms, "x");
    result = co_await read_one(pair.ours, deadline);
  }());
  EXPECT_FALSE(result) << result.message();
}

TEST(SocketDeadline, DestroyedWhileArmedDoesNothingLater) {
  SocketPair pair;
  {
    SocketDeadline deadline(pair.ours);
    deadline.expires_after(20ms);
  }
  error_code result;
  pair.run([&]() -> net::awaitable<void> {
    pair.write_after(100ms, "x");
    char byte = 0;
    auto [ec, n] = co_await pair.ours.async_read_some(net::buffer(&byte, 1),
                                                      net::as_tuple(net::use_awaitable));
    result = ec;
  }());
  EXPECT_FALSE(result) << result.message();
}

// Three sockets on one context share its deadline queue: each read ends at
// its own deadline, whatever order they were set in, and a deadline dropped
// while queued (its connection ended) takes nothing else with it.
TEST(SocketDeadline, DeadlinesOfSeveralSocketsEachFireAtTheirOwnTime) {
  SocketPair first;
  auto& context = first.context;
  tcp::acceptor acceptor(context, {net::ip::make_address("127.0.0.1"), 0});
  tcp::socket second(context), second_peer(context), third(context), third_peer(context);
  second.connect(acceptor.local_endpoint());
  second_peer = acceptor.accept();
  third.connect(acceptor.local_endpoint());
  third_peer = acceptor.accept();

  SocketDeadline late(first.ours);
  SocketDeadline early(second);
  SocketDeadline never(third);
  auto dropped = std::make_unique<SocketDeadline>(third);
  const auto started = Clock::now();
  TimePoint late_ended, early_ended;
  error_code late_result, early_result, never_result;
  bool never_done = false;
  first.run([&]() -> net::awaitable<void> {
    late.expires_after(160ms);  // queued first, fires last
    early.expires_after(40ms);  // comes before it in the queue
    dropped->expires_after(10ms);
    dropped.reset();  // its place is given up: the third socket is not cancelled
    never.expires_never();
    net::co_spawn(
        context,
        [&]() -> net::awaitable<void> {
          early_result = co_await read_one(second, early);
          early_ended = Clock::now();
        },
        net::detached);
    net::co_spawn(
        context,
        [&]() -> net::awaitable<void> {
          never_result = co_await read_one(third, never);
          never_done = true;
        },
        net::detached);
    first.after(250ms, [&] { net::write(third_peer, net::buffer(std::string_view("x"))); });
    late_result = co_await read_one(first.ours, late);
    late_ended = Clock::now();
    net::steady_timer settle(context, 150ms);
    co_await settle.async_wait(net::use_awaitable);
  }());
  EXPECT_EQ(early_result, beast::error::timeout);
  EXPECT_EQ(late_result, beast::error::timeout);
  EXPECT_GE(early_ended - started, 40ms);
  EXPECT_GE(late_ended - started, 160ms);
  EXPECT_LT(early_ended, late_ended);
  EXPECT_TRUE(never_done);
  EXPECT_FALSE(never_result) << never_result.message();
  EXPECT_FALSE(never.expired());
}

// Places that come up within one grain are taken in one wake-up of the
// loop. Here they belong to deadlines set and then dropped, as a burst of
// new upstream connections leaves its connect deadlines: one place every
// ninth of a grain used to be one timer wake-up each. Far places (a
// connect's 2 s) share the full grain, near ones a sixteenth of their
// distance.
TEST(SocketDeadline, PlacesThatComeUpTogetherTakeOneWakeUp) {
  for (const auto distance : {SocketDeadline::kFullGrainDistance + 30ms, Clock::duration(40ms)}) {
    SCOPED_TRACE(to_ms(distance));
    const auto grain = SocketDeadline::grain_for(distance);
    net::io_context context;
    constexpr int kPlaces = 8;
    const auto step = grain / (kPlaces + 1);
    std::vector<std::unique_ptr<tcp::socket>> sockets;
    std::vector<std::unique_ptr<SocketDeadline>> deadlines;
    const auto first = Clock::now() + distance;
    for (int i = 0; i < kPlaces; ++i) {
      sockets.push_back(std::make_unique<tcp::socket>(context));
      deadlines.push_back(std::make_unique<SocketDeadline>(*sockets.back()));
      deadlines.back()->expires_at(first + i * step);
      deadlines.back()->expires_never();
    }
    // Every handler the loop runs here is a wake-up of the queue's timer. The
    // places span less than a grain, so at most one boundary falls among them.
    const auto wakeups = context.run_for(2s);
    EXPECT_GE(wakeups, 1u);
    EXPECT_LE(wakeups, 2u);
    EXPECT_TRUE(context.stopped()) << "the queue kept its timer armed";
    for (const auto& deadline : deadlines) EXPECT_FALSE(deadline->expired());
  }
}

// A place queued far off waits for the next mark of the full grain; a
// nearer one for at most a sixteenth of its distance, so that a short
// timeout is not stretched by half. A place already past is not delayed.
TEST(SocketDeadline, WakeUpComesWithinTheGrainOfThePlacesDistance) {
  // Not on any grain's mark, so that every place is rounded.
  const TimePoint now(123'456'789ns);
  for (const auto distance : {Clock::duration(1ms), Clock::duration(10ms), Clock::duration(50ms),
                              SocketDeadline::kFullGrainDistance - 1ns}) {
    SCOPED_TRACE(to_ms(distance));
    const auto when = now + distance;
    const auto wakeup = SocketDeadline::wakeup_for(when, now);
    EXPECT_GE(wakeup, when);
    EXPECT_LE(wakeup - when, distance / 16);
  }
  for (const auto distance :
       {SocketDeadline::kFullGrainDistance, Clock::duration(2s), Clock::duration(75s)}) {
    SCOPED_TRACE(to_ms(distance));
    const auto when = now + distance;
    const auto wakeup = SocketDeadline::wakeup_for(when, now);
    EXPECT_GE(wakeup, when);
    EXPECT_LT(wakeup - when, SocketDeadline::kWakeupGrain);
    EXPECT_EQ(wakeup.time_since_epoch() % SocketDeadline::kWakeupGrain, Clock::duration::zero());
  }
  EXPECT_EQ(SocketDeadline::wakeup_for(now - 5ms, now), now - 5ms);
  EXPECT_EQ(SocketDeadline::wakeup_for(TimePoint::max(), now), TimePoint::max());
}

// A coroutine still waiting when its context goes away is destroyed with
// it, deadline and all, after the context's deadline queue has shut down.
TEST(SocketDeadline, DestroyedWithItsContextWhileQueued) {
  bool destroyed = false;
  {
    net::io_context context;
    tcp::acceptor acceptor(context, {net::ip::make_address("127.0.0.1"), 0});
    struct MarkOnExit {
      bool& flag;
      ~MarkOnExit() { flag = true; }
    };
    net::co_spawn(
        context,
        [&]() -> net::awaitable<void> {
          MarkOnExit mark{destroyed};
          tcp::socket socket(context);
          socket.connect(acceptor.local_endpoint());
          SocketDeadline deadline(socket);
          deadline.expires_after(10s);
          co_await read_one(socket, deadline);
        },
        net::detached);
    context.run_for(50ms);
    EXPECT_FALSE(destroyed);
  }
  EXPECT_TRUE(destroyed);
}

// A thread remembers the deadline queue it found last. A context made where
// an ended one was (the same address, on the same thread) has a queue of its
// own, and its deadlines fire through it; the ended context's queue is gone
// (under AddressSanitizer, a deadline that reached it is a use after free).
TEST(SocketDeadline, ContextMadeWhereAnEndedOneWasHasItsOwnQueue) {
  std::optional<net::io_context> context;
  const net::io_context* first_address = nullptr;
  for (int generation = 0; generation < 3; ++generation) {
    context.emplace();
    if (generation == 0) first_address = &*context;
    ASSERT_EQ(&*context, first_address);  // the same storage every time
    {
      tcp::acceptor acceptor(*context, {net::ip::make_address("127.0.0.1"), 0});
      tcp::socket socket(*context);
      socket.connect(acceptor.local_endpoint());
      auto peer = acceptor.accept();
      SocketDeadline deadline(socket);
      error_code result;
      const auto started = Clock::now();
      TimePoint ended;
      net::co_spawn(
          *context,
          [&]() -> net::awaitable<void> {
            deadline.expires_after(30ms);
            result = co_await read_one(socket, deadline);
            ended = Clock::now();
          },
          net::detached);
      context->run_for(2s);
      EXPECT_EQ(result, beast::error::timeout) << "generation " << generation;
      EXPECT_LT(ended - started, 2s) << "generation " << generation;
    }
    context.reset();
  }
}

TEST(ReadHttp, BufferedRequestIsParsedWithoutReading) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  beast::flat_buffer buffer;
  const std::string_view two =
      "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"
      "POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
  net::buffer_copy(buffer.prepare(two.size()), net::buffer(two));
  buffer.commit(two.size());
  http::request_parser<http::string_body> first, second;
  error_code first_ec, second_ec;
  // Nothing is ever written to the socket: a read would not finish.
  pair.run([&]() -> net::awaitable<void> {
    deadline.expires_after(2s);
    first_ec = co_await read_http(pair.ours, buffer, first, true, deadline);
    second_ec = co_await read_http(pair.ours, buffer, second, true, deadline);
  }());
  EXPECT_FALSE(first_ec) << first_ec.message();
  EXPECT_FALSE(second_ec) << second_ec.message();
  EXPECT_EQ(first.get().target(), "/a");
  EXPECT_EQ(first.get().body(), "hi");
  EXPECT_EQ(second.get().target(), "/b");
  EXPECT_EQ(second.get().body(), "abc");
  EXPECT_EQ(buffer.size(), 0u);
}

TEST(ReadHttp, HeadThenBodyFromTheSocketInPieces) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  beast::flat_buffer buffer;
  http::request_parser<http::string_body> parser;
  error_code head_ec, body_ec;
  bool head_done_before_body = false;
  pair.run([&]() -> net::awaitable<void> {
    net::write(pair.theirs, net::buffer(std::string_view("POST /x HTTP/1.1\r\nContent-Len")));
    pair.write_after(20ms, "gth: 5\r\n\r\nab");
    pair.write_after(40ms, "cde");
    deadline.expires_after(2s);
    head_ec = co_await read_http(pair.ours, buffer, parser, false, deadline);
    head_done_before_body = parser.is_header_done() && !parser.is_done();
    body_ec = co_await read_http(pair.ours, buffer, parser, true, deadline);
  }());
  EXPECT_FALSE(head_ec) << head_ec.message();
  EXPECT_TRUE(head_done_before_body);
  EXPECT_FALSE(body_ec) << body_ec.message();
  EXPECT_EQ(parser.get().body(), "abcde");
}

TEST(ReadHttp, EndOfStreamBeforeAnyByteAndInsideAMessage) {
  {
    SocketPair pair;
    SocketDeadline deadline(pair.ours);
    beast::flat_buffer buffer;
    http::request_parser<http::string_body> parser;
    pair.theirs.close();
    error_code ec;
    pair.run([&]() -> net::awaitable<void> {
      ec = co_await read_http(pair.ours, buffer, parser, false, deadline);
    }());
    EXPECT_EQ(ec, http::error::end_of_stream);
  }
  {
    SocketPair pair;
    SocketDeadline deadline(pair.ours);
    beast::flat_buffer buffer;
    http::request_parser<http::string_body> parser;
    net::write(pair.theirs, net::buffer(std::string_view("POST /x HTTP/1.1\r\nContent-Le")));
    pair.theirs.close();
    error_code ec;
    pair.run([&]() -> net::awaitable<void> {
      ec = co_await read_http(pair.ours, buffer, parser, false, deadline);
    }());
    EXPECT_EQ(ec, http::error::partial_message);
  }
}

TEST(ReadHttp, ResponseEndedByItsConnectionIsComplete) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  net::write(pair.theirs, net::buffer(std::string_view("HTTP/1.1 200 OK\r\n\r\nall of it")));
  pair.theirs.shutdown(tcp::socket::shutdown_send);
  error_code ec;
  pair.run([&]() -> net::awaitable<void> {
    deadline.expires_after(2s);
    ec = co_await read_http(pair.ours, buffer, parser, true, deadline);
  }());
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(parser.is_done());
  EXPECT_EQ(parser.get().body(), "all of it");
}

TEST(ReadHttp, SilentPeerTimesOut) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  beast::flat_buffer buffer;
  http::request_parser<http::string_body> parser;
  error_code ec;
  pair.run([&]() -> net::awaitable<void> {
    deadline.expires_after(40ms);
    ec = co_await read_http(pair.ours, buffer, parser, false, deadline);
  }());
  EXPECT_EQ(ec, beast::error::timeout);
}

// The deadline passes between two reads, while nothing is pending: its
// cancellation finds no operation, and the next read must not start without
// it. The peer's late bytes would otherwise end that read as a success.
TEST(ReadHttp, DeadlinePassedWhileNoReadWasPendingEndsTheNextRead) {
  SocketPair pair;
  SocketDeadline deadline(pair.ours);
  beast::flat_buffer buffer;
  http::request_parser<http::string_body> parser;
  error_code ec;
  Clock::duration read_took{};
  pair.run([&]() -> net::awaitable<void> {
    deadline.expires_after(20ms);
    net::steady_timer elsewhere(pair.context, 150ms);
    co_await elsewhere.async_wait(net::use_awaitable);
    pair.write_after(400ms, "GET / HTTP/1.1\r\n\r\n");
    const auto read_started = Clock::now();
    ec = co_await read_http(pair.ours, buffer, parser, false, deadline);
    read_took = Clock::now() - read_started;
  }());
  EXPECT_TRUE(deadline.expired());
  EXPECT_EQ(ec, beast::error::timeout) << ec.message();
  EXPECT_LT(read_took, 300ms);
}

}  // namespace
}  // namespace sluice::testing

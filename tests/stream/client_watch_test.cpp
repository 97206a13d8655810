// The client watch: when its read starts, what a departure aborts, and that
// bytes from the client are the next request, not a departure.
#include "sluice/stream/client_watch.hpp"

#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <string_view>

namespace sluice::stream {
namespace {

namespace net = boost::asio;
using net::ip::tcp;
using namespace std::chrono_literals;

// A connected pair on loopback: `served` is the gateway's side, which the
// watch reads; `client` is the other end.
struct Connection {
  Connection() : acceptor(context, {net::ip::make_address("127.0.0.1"), 0}) {
    client.connect(acceptor.local_endpoint());
    served = acceptor.accept();
  }

  // Runs the event loop until `done` holds, for at most two seconds.
  template <class Predicate>
  bool run_until(Predicate done) {
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      context.restart();
      context.run_for(5ms);
    }
    return done();
  }

  // Starts watching a request, with `exchange` as its upstream attempt.
  void watch_request(upstream::AbortHandle& exchange) {
    watch.start();
    watch.watch(&exchange);
  }

  net::io_context context;
  tcp::acceptor acceptor;
  tcp::socket client{context};
  tcp::socket served{context};
  boost::beast::flat_buffer buffer;
  ClientWatch watch{served, buffer};
};

TEST(ClientWatch, ReadsOnlyOnceAWatchedExchangeHasSentItsRequest) {
  Connection connection;
  auto& watch = connection.watch;
  upstream::AbortHandle exchange;
  connection.watch_request(exchange);
  connection.context.poll();
  EXPECT_FALSE(watch.reading());

  exchange.notify_sent();
  EXPECT_TRUE(watch.reading());
  exchange.notify_sent();  // a second send (a retry) starts no second read
  EXPECT_TRUE(watch.reading());

  connection.client.close();
  ASSERT_TRUE(connection.run_until([&] { return !watch.reading(); }));
  EXPECT_TRUE(watch.client_gone());
  EXPECT_TRUE(exchange.aborted());
  watch.stop();
}

TEST(ClientWatch, ASendAfterTheWatchEndedOrTheExchangeLeftStartsNothing) {
  Connection connection;
  auto& watch = connection.watch;
  upstream::AbortHandle left, after_stop;
  connection.watch_request(left);
  watch.unwatch(&left);
  left.notify_sent();
  EXPECT_FALSE(watch.reading());

  watch.watch(&after_stop);
  watch.stop();
  after_stop.notify_sent();
  EXPECT_FALSE(watch.reading());
}

TEST(ClientWatch, BytesFromTheClientAreTheNextRequestNotADeparture) {
  Connection connection;
  auto& watch = connection.watch;
  upstream::AbortHandle exchange;
  connection.watch_request(exchange);
  exchange.notify_sent();

  constexpr std::string_view kNext = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  net::write(connection.client, net::buffer(kNext));
  ASSERT_TRUE(connection.run_until([&] { return !watch.reading(); }));
  EXPECT_FALSE(watch.client_gone());
  EXPECT_FALSE(exchange.aborted());
  EXPECT_FALSE(watch.take_read_result());
  const auto data = connection.buffer.cdata();
  EXPECT_EQ(std::string_view(static_cast<const char*>(data.data()), data.size()), kNext);
  watch.stop();
}

}  // namespace
}  // namespace sluice::stream

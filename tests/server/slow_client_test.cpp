// Clients that send their request a byte at a time are cut off by the
// header and body timeouts, while everyone else is served as usual.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <thread>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/leak_check.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Dribbled {
  bool closed = false;
  std::chrono::milliseconds closed_after{0};  // since the dribbling started
  std::size_t bytes_sent = 0;
  std::string received;  // whatever the gateway answered before closing
};

// Connects, sends `at_once`, then `dribble` one byte every `gap` until the
// gateway closes the connection or `give_up` has passed.
Dribbled send_slowly(std::uint16_t port, std::string_view at_once, std::string_view dribble,
                     std::chrono::milliseconds gap, std::chrono::milliseconds give_up) {
  boost::asio::io_context context;
  boost::asio::ip::tcp::socket socket(context);
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), port});
  const int fd = socket.native_handle();
  Dribbled result;
  auto send_bytes = [&](std::string_view bytes) {
    // MSG_NOSIGNAL: writing to a connection the gateway closed must fail,
    // not kill the test with SIGPIPE.
    return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  };
  if (!at_once.empty() && !send_bytes(at_once)) throw std::runtime_error("first send failed");
  const auto started = Clock::now();
  // Reads whatever is there within `wait`; true once the gateway closed.
  auto closed_within = [&](std::chrono::milliseconds wait) {
    const auto until = Clock::now() + wait;
    for (auto now = Clock::now(); now < until; now = Clock::now()) {
      pollfd readable{fd, POLLIN, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now);
      if (::poll(&readable, 1, static_cast<int>(left.count()) + 1) <= 0) continue;
      char piece[4096];
      auto n = ::recv(fd, piece, sizeof piece, 0);
      if (n <= 0) return true;  // EOF or reset
      result.received.append(piece, static_cast<std::size_t>(n));
    }
    return false;
  };
  for (std::size_t i = 0; Clock::now() - started < give_up; ++i) {
    if (i < dribble.size() && send_bytes(dribble.substr(i, 1))) ++result.bytes_sent;
    if (closed_within(gap)) {
      result.closed = true;
      result.closed_after =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
      break;
    }
  }
  return result;
}

class SlowClients : public ::testing::Test {
 protected:
  static constexpr auto kTimeout = 300ms;
  static constexpr int kSlowClients = 8;

  void SetUp() override {
    upstream_ = start_mock();
    gateway_ = std::make_unique<TestGateway>(
        "server:\n  listen: 127.0.0.1:0\n  threads: 2\n  header_timeout: 300ms\n"
        "  body_timeout: 300ms\nmodels:\n  - name: chat\n    deployments:\n" +
        deployment_yaml("d1", upstream_->base_url(), kNoWarmConnections));
    leaks_ = std::make_unique<LeakCheck>(*gateway_);
  }

  // Runs the slow clients on threads of their own and, while they dribble,
  // serves ordinary requests that must not wait for them.
  std::vector<Dribbled> dribble_while_serving_others(std::string_view at_once,
                                                     std::string_view dribble) {
    std::vector<Dribbled> results(kSlowClients);
    std::vector<std::thread> slow;
    for (auto& result : results) {
      slow.emplace_back([&, port = gateway_->port()] {
        result = send_slowly(port, at_once, dribble, 100ms, 3s);
      });
    }
    HttpConnection other(gateway_->port(), 5s);
    for (int i = 0; i < 10; ++i) {
      auto started = Clock::now();
      auto response = other.request("POST", "/v1/chat/completions", chat_body("chat", i % 2 == 0));
      EXPECT_EQ(response.status, 200u) << response.body;
      EXPECT_LT(Clock::now() - started, 1s);
      std::this_thread::sleep_for(20ms);
    }
    for (auto& thread : slow) thread.join();
    return results;
  }

  std::unique_ptr<mock::MockServer> upstream_;
  std::unique_ptr<TestGateway> gateway_;
  std::unique_ptr<LeakCheck> leaks_;
};

// The timeouts bound the whole head and the whole body, not the gap between
// two bytes: steady progress a byte at a time does not keep a connection open.
TEST_F(SlowClients, HeadDribbledByteByByteIsClosedAfterHeaderTimeout) {
  const std::string head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
      "application/json\r\nContent-Length: 2\r\n\r\n{}";
  for (const auto& slow : dribble_while_serving_others("", head)) {
    ASSERT_TRUE(slow.closed) << "still open after sending " << slow.bytes_sent << " bytes";
    EXPECT_GE(slow.closed_after, kTimeout - 10ms);
    EXPECT_LT(slow.closed_after, kTimeout + 1200ms);
    EXPECT_LT(slow.bytes_sent, head.size());
    // A head that never completed gets no answer, just the close.
    EXPECT_EQ(slow.received, "");
  }
  EXPECT_EQ(upstream_->stats().requests, 10u);  // only the ordinary client's
  EXPECT_TRUE(leaks_->settled());
}

TEST_F(SlowClients, BodyDribbledByteByByteIsClosedAfterBodyTimeout) {
  const std::string body = chat_body("chat", false);
  const std::string head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  for (const auto& slow : dribble_while_serving_others(head, body)) {
    ASSERT_TRUE(slow.closed) << "still open after sending " << slow.bytes_sent << " bytes";
    EXPECT_GE(slow.closed_after, kTimeout - 10ms);
    EXPECT_LT(slow.closed_after, kTimeout + 1200ms);
    EXPECT_LT(slow.bytes_sent, body.size());
    EXPECT_EQ(slow.received, "");
  }
  EXPECT_EQ(upstream_->stats().requests, 10u);
  EXPECT_TRUE(leaks_->settled());
}

TEST_F(SlowClients, SilentClientIsClosedAfterHeaderTimeout) {
  auto silent = send_slowly(gateway_->port(), "", "", 100ms, 3s);
  ASSERT_TRUE(silent.closed);
  EXPECT_GE(silent.closed_after, kTimeout - 10ms);
  EXPECT_LT(silent.closed_after, kTimeout + 1200ms);
  EXPECT_TRUE(leaks_->settled());
}

// Between requests a connection may idle for the keep-alive timeout (75 s
// here); once the next head has begun, the head gets the header timeout,
// whether the last answer came from the upstream or from the gateway itself.
TEST_F(SlowClients, HeadBegunAfterAnIdleWaitGetsTheHeaderTimeout) {
  for (const bool proxied : {true, false}) {
    SCOPED_TRACE(proxied ? "after a proxied answer" : "after the gateway's own answer");
    HttpConnection client(gateway_->port(), 5s);
    auto first = proxied ? client.request("POST", "/v1/chat/completions", chat_body("chat", true))
                         : client.request("GET", "/v1/models");
    ASSERT_EQ(first.status, 200u) << first.body;
    std::this_thread::sleep_for(100ms);
    client.send_raw("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    const auto started = Clock::now();
    client.set_timeout(3s);
    EXPECT_TRUE(client.closed_by_peer());
    const auto waited = Clock::now() - started;
    EXPECT_GE(waited, kTimeout - 10ms);
    EXPECT_LT(waited, kTimeout + 1200ms);
  }
  EXPECT_EQ(upstream_->stats().requests, 1u);
  EXPECT_TRUE(leaks_->settled());
}

}  // namespace
}  // namespace sluice::testing

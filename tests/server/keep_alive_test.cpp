// One client connection carrying many requests: requests sent before the
// last answer ended (pipelined, or sent while a stream is still relayed),
// the idle timeout between requests, a client that leaves between two, and
// one that asks for the connection to end with its answer. What a
// connection's requests relay in is lent by its worker.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/leak_check.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string one_model(const std::string& base_url, const std::string& server = "") {
  return server + "models:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("d1", base_url, kNoWarmConnections);
}

mock::Behaviour streaming(std::chrono::milliseconds interval, unsigned tokens) {
  mock::Behaviour behaviour;
  behaviour.interval = interval;
  behaviour.tokens = tokens;
  return behaviour;
}

std::string raw_request(const std::string& body, const std::string& request_id) {
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: "
         "application/json\r\nx-request-id: " +
         request_id + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A whole answer: a JSON completion, or a stream of `tokens` content events
// and its end.
void expect_complete_answer(const std::string& body, bool stream, unsigned tokens) {
  if (!stream) {
    auto completion = nlohmann::json::parse(body);
    EXPECT_EQ(completion["object"], "chat.completion") << body;
    return;
  }
  auto events = sse_data(body);
  ASSERT_FALSE(events.empty()) << body;
  EXPECT_EQ(events.back(), "[DONE]") << body;
  unsigned content_events = 0;
  for (const auto& event : events) {
    if (event == "[DONE]") continue;
    auto chunk = nlohmann::json::parse(event);
    if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content")) {
      ++content_events;
    }
  }
  EXPECT_EQ(content_events, tokens) << body;
}

TEST(KeepAlive, PipelinedRequestsAreAnsweredInOrder) {
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url()));
  LeakCheck leaks(gateway);
  {
    HttpConnection client(gateway.port());
    std::string wire;
    for (int i = 0; i < 4; ++i) {
      wire += raw_request(chat_body("chat", i % 2 == 1), "pipelined-" + std::to_string(i));
    }
    client.send_raw(wire);
    for (int i = 0; i < 4; ++i) {
      auto head = client.read_head();
      ASSERT_EQ(head.status, 200u);
      EXPECT_EQ(head.header("x-request-id"), "pipelined-" + std::to_string(i));
      expect_complete_answer(client.read_rest_of_body(), i % 2 == 1, 8);
    }
    // The connection is still good for one more, sent on its own.
    EXPECT_EQ(client.request("POST", "/v1/chat/completions", chat_body("chat", false)).status,
              200u);
  }
  EXPECT_EQ(upstream->stats().requests, 5u);
  EXPECT_TRUE(leaks.settled());
}

// The bytes of the next request arrive while a stream is relayed: they are
// the next request, not a sign that the client left, so the stream runs to
// its end and the next request is answered after it.
TEST(KeepAlive, RequestSentDuringAStreamIsAnsweredAfterIt) {
  auto upstream = start_mock(streaming(40ms, 6));
  TestGateway gateway(one_model(upstream->base_url()));
  LeakCheck leaks(gateway);
  {
    HttpConnection client(gateway.port());
    client.send_raw(raw_request(chat_body("chat", true), "stream-first"));
    auto head = client.read_head();
    ASSERT_EQ(head.status, 200u);
    std::string stream_body = client.read_body_piece().value_or("");
    client.send_raw(raw_request(chat_body("chat", false), "sent-meanwhile"));
    stream_body += client.read_rest_of_body();
    expect_complete_answer(stream_body, true, 6);

    auto next = client.read_head();
    ASSERT_EQ(next.status, 200u);
    EXPECT_EQ(next.header("x-request-id"), "sent-meanwhile");
    expect_complete_answer(client.read_rest_of_body(), false, 0);
  }
  EXPECT_EQ(upstream->stats().streams_cancelled, 0u);
  EXPECT_EQ(upstream->stats().requests, 2u);
  EXPECT_TRUE(leaks.settled());
}

TEST(KeepAlive, IdleConnectionIsClosedAfterKeepaliveTimeout) {
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url(), "server:\n  keepalive_timeout: 300ms\n"));
  LeakCheck leaks(gateway);
  {
    HttpConnection client(gateway.port(), 3s);
    // A stream too, whose watch reads on after its end.
    for (bool stream : {false, true}) {
      EXPECT_EQ(client.request("POST", "/v1/chat/completions", chat_body("chat", stream)).status,
                200u);
    }
    const auto idle_from = Clock::now();
    EXPECT_TRUE(client.closed_by_peer());
    const auto idle_for = Clock::now() - idle_from;
    EXPECT_GE(idle_for, 250ms);
    EXPECT_LT(idle_for, 2s);
  }
  EXPECT_TRUE(leaks.settled());
}

// Between two requests a client may simply go: the connection is closed and
// nothing of it stays behind, in the gateway or upstream.
TEST(KeepAlive, ClientLeavingBetweenRequestsLeavesNothingOpen) {
  auto upstream = start_mock(streaming(5ms, 4));
  TestGateway gateway(one_model(upstream->base_url()));
  LeakCheck leaks(gateway);
  for (int i = 0; i < 20; ++i) {
    HttpConnection client(gateway.port());
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", i % 2 == 0));
    EXPECT_EQ(response.status, 200u);
  }
  EXPECT_EQ(upstream->stats().requests, 20u);
  EXPECT_EQ(upstream->stats().streams_cancelled, 0u);
  EXPECT_TRUE(leaks.settled());
}

// "Connection: close" ends the connection with the answer: the gateway
// closes at once rather than waiting for the client's own close, so the
// connection stops counting against server.max_connections while the client
// still holds its end.
TEST(KeepAlive, AClientThatAskedToCloseIsLetGoWithItsAnswer) {
  auto upstream = start_mock(streaming(1ms, 3));
  TestGateway gateway(one_model(upstream->base_url()));
  LeakCheck leaks(gateway);
  auto& open_connections = gateway.gateway().open_connections();
  for (bool stream : {false, true}) {
    HttpConnection client(gateway.port(), 3s);
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", stream),
                                   {{"Connection", "close"}});
    EXPECT_EQ(response.status, 200u);
    expect_complete_answer(response.body, stream, 3);
    EXPECT_TRUE(client.closed_by_peer());
    // Well within the second a lingering close would wait for the client.
    EXPECT_TRUE(eventually([&] { return open_connections.load() == 0; }, 400ms))
        << "stream: " << stream << ", open: " << open_connections.load();
  }
  EXPECT_TRUE(leaks.settled());
}

// A connection borrows its worker's relay buffers and gives them back when
// it ends: connections one after another all relay in the same ones.
TEST(KeepAlive, ConnectionsBorrowTheWorkersRelayBuffersAndGiveThemBack) {
  auto upstream = start_mock(streaming(1ms, 3));
  TestGateway gateway(one_model(upstream->base_url(), "server:\n  threads: 1\n"));
  auto& open_connections = gateway.gateway().open_connections();
  for (int i = 0; i < 3; ++i) {
    HttpConnection client(gateway.port(), 3s);
    for (bool stream : {false, true}) {
      auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", stream),
                                     {{"Connection", stream ? "close" : "keep-alive"}});
      EXPECT_EQ(response.status, 200u);
      expect_complete_answer(response.body, stream, 3);
    }
    ASSERT_TRUE(eventually([&] { return open_connections.load() == 0; }, 2s));
  }
  std::size_t spares = 0;
  const stream::Relay::Buffers* lent_first = nullptr;
  const stream::Relay::Buffers* lent_again = nullptr;
  gateway.on_each_worker([&](server::Worker& worker) {
    spares = worker.spare_relay_buffers();
    auto loan = worker.lend_relay_buffers();
    lent_first = loan.get();
    loan.reset();
    lent_again = worker.lend_relay_buffers().get();
  });
  EXPECT_EQ(spares, 1u);  // three connections, one after another: one set of buffers
  EXPECT_EQ(lent_again, lent_first);
}

// Buffers given back after a burst are kept up to a bound; the rest are
// freed, so a burst does not hold its memory for good.
TEST(KeepAlive, SpareRelayBuffersAreBounded) {
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url(), "server:\n  threads: 1\n"));
  std::size_t after_burst = 0;
  gateway.on_each_worker([&](server::Worker& worker) {
    std::vector<server::Worker::RelayBuffersLoan> burst;
    for (int i = 0; i < 1000; ++i) burst.push_back(worker.lend_relay_buffers());
    burst.clear();
    after_burst = worker.spare_relay_buffers();
  });
  EXPECT_GT(after_burst, 0u);
  EXPECT_LT(after_burst, 1000u);
}

}  // namespace
}  // namespace sluice::testing

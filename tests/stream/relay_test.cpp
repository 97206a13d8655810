// A stream that breaks after its first byte ends with an SSE error event,
// never with a clean end that looks like success; it is not retried on the
// healthy deployment next in line (the client already has part of an
// answer), and the broken exchange leaves no descriptor or pool slot behind.
#include <gtest/gtest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <nlohmann/json.hpp>
#include <thread>

#include "sluice/stream/relay.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/leak_check.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// The faulty deployment first, a healthy one after it; no warm connections,
// so the connections counted are the request's.
class RelayFaults : public ::testing::Test {
 protected:
  void start(const mock::Behaviour& behaviour, const std::string& timeouts = "") {
    upstream_ = start_mock(behaviour);
    healthy_ = start_mock();
    gateway_ = std::make_unique<TestGateway>(
        "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
        deployment_yaml("d1", upstream_->base_url(), kNoWarmConnections + timeouts) +
        deployment_yaml("healthy", healthy_->base_url(), kNoWarmConnections));
    leaks_ = std::make_unique<LeakCheck>(*gateway_);
  }

  HttpResponse stream_request() {
    HttpConnection client(gateway_->port());
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", true));
    EXPECT_EQ(response.header("x-sluice-deployment"), "d1");
    return response;
  }

  void expect_nothing_left() {
    EXPECT_EQ(healthy_->stats().requests, 0u);
    EXPECT_TRUE(leaks_->settled());
    EXPECT_TRUE(eventually([&] { return upstream_->stats().open_connections == 0; }, 2s));
  }

  std::unique_ptr<mock::MockServer> upstream_;
  std::unique_ptr<mock::MockServer> healthy_;
  std::unique_ptr<TestGateway> gateway_;
  std::unique_ptr<LeakCheck> leaks_;
};

json last_event(const std::string& body) {
  auto events = sse_data(body);
  if (events.empty()) return {};
  return json::parse(events.back(), nullptr, false);
}

// The events before the error are the upstream's own, whole.
void expect_chunks_before_error(const std::string& body) {
  auto events = sse_data(body);
  ASSERT_GE(events.size(), 2u) << body;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto chunk = json::parse(events[i], nullptr, false);
    ASSERT_TRUE(chunk.is_object()) << "event " << i << ": " << events[i];
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  }
  EXPECT_EQ(body.find("[DONE]"), std::string::npos);
}

TEST_F(RelayFaults, ResetMidStreamEndsWithErrorEvent) {
  mock::Behaviour behaviour;
  behaviour.fail = "reset-mid";
  behaviour.tokens = 8;
  start(behaviour);

  auto response = stream_request();
  ASSERT_EQ(response.status, 200u);
  EXPECT_NE(response.body.find("tok0"), std::string::npos);
  EXPECT_EQ(response.body.find("[DONE]"), std::string::npos);
  auto error = last_event(response.body);
  ASSERT_TRUE(error.contains("error")) << response.body;
  EXPECT_EQ(error["error"]["code"], "stream_interrupted");
  expect_chunks_before_error(response.body);
  EXPECT_EQ(gateway_->idle_upstream_connections(), 0);
  expect_nothing_left();
}

TEST_F(RelayFaults, IdleTimeoutMidStreamEndsWithErrorEvent) {
  mock::Behaviour behaviour;
  behaviour.fail = "stall-mid";
  behaviour.stall = 5000ms;
  start(behaviour, "        timeouts: {idle: 200ms}\n");

  auto started = std::chrono::steady_clock::now();
  auto response = stream_request();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  ASSERT_EQ(response.status, 200u);
  auto error = last_event(response.body);
  ASSERT_TRUE(error.contains("error")) << response.body;
  EXPECT_EQ(error["error"]["code"], "upstream_timeout");
  expect_chunks_before_error(response.body);
  EXPECT_TRUE(eventually([&] { return upstream_->stats().open_connections == 0; }, 1s));
  expect_nothing_left();
}

TEST_F(RelayFaults, TotalTimeoutEndsEndlessStreamWithErrorEvent) {
  mock::Behaviour behaviour;
  behaviour.fail = "endless";
  behaviour.interval = 10ms;
  start(behaviour, "        timeouts: {total: 400ms}\n");

  auto started = std::chrono::steady_clock::now();
  auto response = stream_request();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  ASSERT_EQ(response.status, 200u);
  EXPECT_GT(sse_data(response.body).size(), 3u);
  auto error = last_event(response.body);
  ASSERT_TRUE(error.contains("error")) << response.body;
  EXPECT_EQ(error["error"]["code"], "upstream_timeout");
  expect_chunks_before_error(response.body);
  expect_nothing_left();
}

TEST_F(RelayFaults, TruncatedChunkedStreamEndsWithErrorEvent) {
  mock::Behaviour behaviour;
  behaviour.fail = "truncate";
  start(behaviour);
  auto response = stream_request();
  ASSERT_EQ(response.status, 200u);
  auto error = last_event(response.body);
  ASSERT_TRUE(error.contains("error")) << response.body;
  EXPECT_EQ(error["error"]["code"], "stream_interrupted");
  expect_chunks_before_error(response.body);
  expect_nothing_left();
}

TEST_F(RelayFaults, SlowDripIsRelayedWhole) {
  mock::Behaviour behaviour;
  behaviour.fail = "drip";
  behaviour.interval = 1ms;  // a byte per millisecond, well within the idle limit
  behaviour.tokens = 3;
  start(behaviour);
  auto response = stream_request();
  ASSERT_EQ(response.status, 200u);
  auto events = sse_data(response.body);
  ASSERT_EQ(events.size(), 5u);  // 3 tokens, the finish chunk, [DONE]
  EXPECT_NE(events[2].find("tok2"), std::string::npos);
  EXPECT_EQ(events.back(), "[DONE]");
  // Read to its end, the upstream connection is pooled.
  EXPECT_TRUE(eventually([&] { return gateway_->idle_upstream_connections() == 1; }, 1s));
  expect_nothing_left();
}

// A client that reads nothing for a while, with a small receive buffer: the
// relay's writes find the socket full and the rest of each is awaited. The
// answer must still arrive whole and in order, streamed (chunked, each chunk
// with its size line) or not.
class RelayBackpressure : public ::testing::Test {
 protected:
  void start(unsigned tokens) {
    mock::Behaviour behaviour;
    behaviour.tokens = tokens;
    upstream_ = start_mock(behaviour);
    gateway_ = std::make_unique<TestGateway>(
        "models:\n  - name: chat\n    deployments:\n" +
        deployment_yaml("d1", upstream_->base_url(), kNoWarmConnections));
  }

  // Sends the request, waits before reading, then reads the answer to the
  // end of the connection and parses it.
  HttpResponse request_reading_late(bool stream) {
    namespace net = boost::asio;
    namespace http = boost::beast::http;
    // A stalled relay fails the test at a read's timeout, not hangs it.
    HttpConnection client(gateway_->port(), 10s, 4096);
    client.send("POST", "/v1/chat/completions", chat_body("chat", stream),
                {{"Connection", "close"}});
    std::this_thread::sleep_for(300ms);
    const std::string received = client.read_until_close();
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 * 1024 * 1024);
    parser.eager(true);
    boost::system::error_code ec;
    parser.put(net::buffer(received), ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(parser.is_done());
    HttpResponse response;
    response.status = parser.get().result_int();
    response.body = parser.get().body();
    return response;
  }

  std::unique_ptr<mock::MockServer> upstream_;
  std::unique_ptr<TestGateway> gateway_;
};

TEST_F(RelayBackpressure, ALargeBodyArrivesWhole) {
  constexpr unsigned kTokens = 300000;  // a body of about 3 MB
  start(kTokens);
  auto response = request_reading_late(false);
  ASSERT_EQ(response.status, 200u);
  auto parsed = json::parse(response.body, nullptr, false);
  ASSERT_TRUE(parsed.is_object()) << response.body.substr(0, 200);
  const std::string content = parsed["choices"][0]["message"]["content"];
  std::string expected;
  for (unsigned i = 0; i < kTokens; ++i) expected += "tok" + std::to_string(i) + " ";
  EXPECT_TRUE(content == expected)
      << "content of " << content.size() << " bytes, " << expected.size() << " expected";
}

TEST_F(RelayBackpressure, AStreamArrivesWholeAndInOrder) {
  constexpr unsigned kTokens = 20000;  // about 3 MB of events
  start(kTokens);
  auto response = request_reading_late(true);
  ASSERT_EQ(response.status, 200u);
  auto events = sse_data(response.body);
  ASSERT_EQ(events.size(), kTokens + 2);  // the tokens, the finish chunk, [DONE]
  for (unsigned i = 0; i < kTokens; ++i) {
    auto chunk = json::parse(events[i], nullptr, false);
    ASSERT_TRUE(chunk.is_object()) << "event " << i;
    ASSERT_EQ(chunk["choices"][0]["delta"]["content"], "tok" + std::to_string(i) + " ") << i;
  }
  EXPECT_EQ(events.back(), "[DONE]");
}

// A client that stops reading a long stream: once the socket and the
// buffers behind it are full, the relay's write waits, and
// server.write_timeout ends that wait. The gateway then drops both sides
// instead of holding the upstream for as long as the client stays silent;
// a deployment that may pause a minute between tokens does not stretch it.
TEST(RelayWriteTimeout, AClientThatStopsReadingIsCutAfterTheServersWriteTimeout) {
  mock::Behaviour behaviour;
  // About 30 MB of events: more than the kernel buffers on both hops hold.
  behaviour.tokens = 200000;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(
      "server:\n  write_timeout: 200ms\nmodels:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("d1", upstream->base_url(),
                      kNoWarmConnections + "        timeouts: {idle: 60s, total: 60s}\n"));
  // A relay that never gives up fails the test at a read's timeout.
  HttpConnection client(gateway.port(), 5s, 4096);
  client.send("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_TRUE(eventually([&] { return upstream->stats().open_connections == 1; }, 2s));

  // Far longer than the write timeout, far shorter than the deployment's.
  ASSERT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }, 3s))
      << "the upstream is still held for a client that reads nothing";
  // Read to the end: the gateway must close the client's connection too.
  std::string received;
  try {
    received = client.read_until_close();
  } catch (const std::exception& error) {
    FAIL() << "the client's connection was left open: " << error.what();
  }
  EXPECT_EQ(received.find("[DONE]"), std::string::npos) << "the stream ended as if complete";
}

// A non-streaming body's usage is read from the last bytes the relay kept;
// the tail may start anywhere in the body.
TEST(RelayUsage, ReadFromTheTailOfAJsonBody) {
  const std::string body =
      R"({"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":)"
      R"("the \"usage\": {\"prompt_tokens\": 1} of it"}}],)"
      R"("usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,)"
      R"("completion_tokens_details":{"reasoning_tokens":4}}})";
  for (std::size_t start : {std::size_t{0}, std::size_t{20}, body.find(R"("usage":{)")}) {
    EXPECT_EQ(stream::usage_from_json_tail(std::string_view(body).substr(start)),
              (stream::Usage{9, 12, 21}))
        << start;
  }
  EXPECT_FALSE(stream::usage_from_json_tail(R"({"id":"x","choices":[]})"));
  // The last usage key counts; an escaped one inside a string does not.
  EXPECT_EQ(stream::usage_from_json_tail(
                R"({"usage":{"prompt_tokens":1},"x":"\"usage\"","usage":{"prompt_tokens":2}})"),
            (stream::Usage{2, 0, 2}));
  EXPECT_FALSE(stream::usage_from_json_tail(R"({"usage":{"prompt_tokens":9,)"));
  // Members after the usage object, spaces around the colon.
  EXPECT_EQ(stream::usage_from_json_tail(
                R"({"usage" : {"prompt_tokens":1,"total_tokens":1},"system_fingerprint":"fp_g"})"),
            (stream::Usage{1, 0, 1}));
  // The object must be the usage key's own value.
  EXPECT_FALSE(stream::usage_from_json_tail(R"({"usage":null,"x":{"prompt_tokens":3}})"));
  EXPECT_FALSE(stream::usage_from_json_tail(R"({"x":"usage","y":{"prompt_tokens":3}})"));
}

// Buffers go from one request to the next: what a large body or head grew
// is let go of, what an ordinary request needs is kept as it is.
TEST(RelayBuffers, WhatALargeAnswerGrewIsLetGoOfBetweenRequests) {
  stream::Relay::Buffers grown;
  grown.copy_buffer().resize(stream::Relay::kLargestRead);
  grown.head.assign(64 * 1024, 'h');
  grown.pieces.resize(5000);
  grown.wire.resize(5000);
  grown.release_grown();
  EXPECT_LE(grown.read.capacity(), stream::Relay::kFirstReadSize);
  EXPECT_LT(grown.head.capacity(), std::size_t{64 * 1024});
  EXPECT_LT(grown.pieces.capacity(), 5000u);
  EXPECT_LT(grown.wire.capacity(), 5000u);

  stream::Relay::Buffers ordinary;
  ordinary.copy_buffer();
  ordinary.head.assign(300, 'h');
  ordinary.pieces.resize(4);
  const auto* read = ordinary.read.data();
  const auto* head = ordinary.head.data();
  ordinary.release_grown();
  EXPECT_EQ(ordinary.read.data(), read);
  EXPECT_EQ(ordinary.head.data(), head);
  EXPECT_EQ(ordinary.pieces.size(), 4u);
}

}  // namespace
}  // namespace sluice::testing

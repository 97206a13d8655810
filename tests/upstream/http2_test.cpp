// HTTP/2 to upstreams: streams multiplexed on one connection per origin and
// worker, h2c by prior knowledge and h2 by ALPN, a client gone resetting only
// its stream, GOAWAY, PING health checks, and nghttpd as an h2 server that
// is not ours.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "sluice/upstream/http2_client.hpp"
#include "sluice/upstream/transports.hpp"
#include "support/certificates.hpp"
#include "support/child_process.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/socket_pair.hpp"

namespace sluice::testing {
namespace {

namespace net = boost::asio;
using json = nlohmann::json;
using namespace std::chrono_literals;

std::unique_ptr<mock::MockServer> start_h2_mock(mock::Behaviour behaviour,
                                                const Certificate* certificate = nullptr) {
  mock::MockServer::Options options;
  options.behaviour = std::move(behaviour);
  options.http2 = true;
  if (certificate) {
    options.tls_cert_pem = certificate->cert_pem;
    options.tls_key_pem = certificate->key_pem;
  }
  auto server = std::make_unique<mock::MockServer>(options);
  server->start();
  return server;
}

// One worker, so that one connection per origin per worker is one
// connection; no warm connection unless `extra` asks for one.
std::string h2_config(const std::string& base_url, const std::string& extra,
                      const std::string& upstream_section = "") {
  return "server:\n  listen: 127.0.0.1:0\n  threads: 1\n" + upstream_section +
         "router:\n  retries: 0\nmodels:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("h2", base_url, extra);
}

const std::string kPriorKnowledge = "        http2: prior_knowledge\n";

// One worker, two deployments in priority order: `id`, spoken to in h2c,
// then "steady", an HTTP/1.1 one that takes over on a failover or a hedge.
// `router` holds the router section's lines.
std::string h2_then_steady(const std::string& id, const std::string& h2_url,
                           const std::string& steady_url, const std::string& router,
                           const std::string& extra = "") {
  return "server:\n  listen: 127.0.0.1:0\n  threads: 1\nrouter:\n" + router +
         "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
         deployment_yaml(id, h2_url, kPriorKnowledge + kNoWarmConnections + extra) +
         deployment_yaml("steady", steady_url, kNoWarmConnections);
}

const std::string kHedgeAfter100ms = "  retries: 0\n  hedge: {after: 100ms}\n";
const std::string kOneRetry = "  retries: 1\n";

TEST(Http2Upstream, ConcurrentStreamsShareOneConnection) {
  mock::Behaviour behaviour;
  behaviour.ttft = 200ms;  // long enough for all ten to be in flight together
  auto upstream = start_h2_mock(behaviour);
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections));
  std::atomic<int> complete{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 10; ++i) {
    clients.emplace_back([&] {
      HttpConnection client(gateway.port());
      auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", true));
      if (response.status == 200 && sse_data(response.body).back() == "[DONE]") ++complete;
    });
  }
  for (auto& client : clients) client.join();
  EXPECT_EQ(complete.load(), 10);
  EXPECT_EQ(upstream->stats().requests, 10u);
  EXPECT_EQ(upstream->stats().connections_accepted, 1u);
  EXPECT_EQ(upstream->stats().h2_connections, 1u);
}

TEST(Http2Upstream, AFullConnectionOpensAnother) {
  mock::Behaviour behaviour;
  behaviour.ttft = 300ms;
  behaviour.h2_max_streams = 2;
  auto upstream = start_h2_mock(behaviour);
  // The first connection's SETTINGS are in before the burst.
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge));
  ASSERT_TRUE(eventually([&] { return upstream->stats().h2_connections == 1; }));
  std::this_thread::sleep_for(50ms);
  std::atomic<int> complete{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&] {
      HttpConnection client(gateway.port());
      auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", false));
      if (response.status == 200) ++complete;
    });
  }
  for (auto& client : clients) client.join();
  EXPECT_EQ(complete.load(), 6);
  EXPECT_EQ(upstream->stats().h2_connections, 3u);
}

TEST(Http2Upstream, PriorKnowledgeSpeaksH2cWithLowercaseEndToEndHeaders) {
  auto upstream = start_h2_mock({});
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections +
                                                          "        headers:\n"
                                                          "          X-Team: Blue\n"));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_NE(response.body.find("chat.completion"), std::string::npos);
  EXPECT_EQ(upstream->stats().h2_connections, 1u);
  const auto recorded = upstream->recent_requests();
  ASSERT_EQ(recorded.size(), 1u);
  bool saw_team = false;
  for (const auto& [name, value] : recorded[0].headers) {
    if (name == "Host") continue;  // the mock's own name for :authority
    EXPECT_TRUE(std::none_of(name.begin(), name.end(), [](char c) { return c >= 'A' && c <= 'Z'; }))
        << name;
    EXPECT_NE(name, "connection");
    EXPECT_NE(name, "transfer-encoding");
    if (name == "x-team") saw_team = value == "Blue";
  }
  EXPECT_TRUE(saw_team);
  EXPECT_EQ(recorded[0].header("content-length"), std::to_string(recorded[0].body.size()));
}

TEST(Http2Upstream, AutoOnHttpsLetsAlpnChooseH2) {
  const auto certificate = make_self_signed_certificate();
  TempFile ca_file(certificate.cert_pem, ".pem");
  auto upstream = start_h2_mock({}, &certificate);
  const std::string url = "https://localhost:" + std::to_string(upstream->port()) + "/v1";
  TestGateway gateway(
      h2_config(url, kNoWarmConnections + "        ca_file: " + ca_file.path() + "\n"));
  for (int i = 0; i < 3; ++i) {
    auto response =
        http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_EQ(sse_data(response.body).back(), "[DONE]");
  }
  EXPECT_EQ(upstream->stats().h2_connections, 1u);
  EXPECT_EQ(upstream->stats().connections_accepted, 1u);
}

TEST(Http2Upstream, AutoOnHttpsStaysWithHttp11WhenTheServerChoosesIt) {
  const auto certificate = make_self_signed_certificate();
  TempFile ca_file(certificate.cert_pem, ".pem");
  mock::MockServer::Options options;
  options.tls_cert_pem = certificate.cert_pem;
  options.tls_key_pem = certificate.key_pem;
  mock::MockServer upstream(options);  // no h2 offered
  upstream.start();
  const std::string url = "https://localhost:" + std::to_string(upstream.port()) + "/v1";
  TestGateway gateway(
      h2_config(url, kNoWarmConnections + "        ca_file: " + ca_file.path() + "\n"));
  for (int i = 0; i < 2; ++i) {
    auto response =
        http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
    ASSERT_EQ(response.status, 200u) << response.body;
  }
  EXPECT_EQ(upstream.stats().h2_connections, 0u);
  EXPECT_EQ(upstream.stats().connections_accepted, 1u);
}

TEST(Http2Upstream, StreamedAnswerIsRelayedChunkByChunk) {
  mock::Behaviour behaviour;
  behaviour.interval = 150ms;
  behaviour.tokens = 4;
  auto upstream = start_h2_mock(behaviour);
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections));
  HttpConnection client(gateway.port());
  client.send("POST", "/v1/chat/completions", chat_body("chat", true));
  auto head = client.read_head();
  ASSERT_EQ(head.status, 200u);
  std::vector<std::chrono::steady_clock::time_point> arrivals;
  std::string body;
  while (auto piece = client.read_body_piece()) {
    arrivals.push_back(std::chrono::steady_clock::now());
    body += *piece;
  }
  EXPECT_EQ(sse_data(body).back(), "[DONE]");
  // Six events 150 ms apart came as they were sent, not gathered at the end.
  ASSERT_GE(arrivals.size(), 4u);
  EXPECT_GE(arrivals.back() - arrivals.front(), 500ms);
}

TEST(Http2Upstream, ClientGoneResetsItsStreamAndKeepsTheConnection) {
  mock::Behaviour behaviour;
  behaviour.interval = 100ms;
  behaviour.tokens = 100;
  auto upstream = start_h2_mock(behaviour);
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections));
  {
    HttpConnection client(gateway.port());
    client.send("POST", "/v1/chat/completions", chat_body("chat", true));
    ASSERT_EQ(client.read_head().status, 200u);
    ASSERT_TRUE(client.read_body_piece().has_value());
    client.close();
  }
  ASSERT_TRUE(eventually([&] { return upstream->stats().h2_resets_received == 1; }));
  EXPECT_TRUE(eventually([&] { return upstream->stats().streams_cancelled == 1; }));
  // The next request goes on the same connection.
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 200u);
  EXPECT_EQ(upstream->stats().connections_accepted, 1u);
  EXPECT_EQ(upstream->stats().open_connections, 1u);
}

TEST(Http2Upstream, GoawayFinishesStreamsBelowAndRetriesThoseAbove) {
  mock::Behaviour behaviour;
  behaviour.interval = 100ms;
  behaviour.tokens = 5;
  behaviour.h2_goaway_after = 1;
  auto upstream = start_h2_mock(behaviour);
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections));
  HttpConnection first(gateway.port());
  first.send("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(first.read_head().status, 200u);
  // Sent on the first connection while its stream runs: the server refuses
  // it by GOAWAY, and it is carried by a second connection.
  auto second =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  EXPECT_EQ(second.status, 200u) << second.body;
  EXPECT_EQ(sse_data(second.body).back(), "[DONE]");
  EXPECT_EQ(sse_data(first.read_rest_of_body()).back(), "[DONE]");
  EXPECT_EQ(upstream->stats().connections_accepted, 2u);
  EXPECT_EQ(upstream->stats().requests, 2u);
}

TEST(Http2Upstream, UnansweredPingClosesTheConnection) {
  mock::Behaviour behaviour;
  behaviour.h2_ping_ack = false;  // a server that has stalled
  auto upstream = start_h2_mock(behaviour);
  TestGateway gateway(
      h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections,
                "upstream:\n  http2_ping_after: 100ms\n  http2_ping_timeout: 100ms\n"));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(response.status, 200u);
  ASSERT_TRUE(eventually([&] { return upstream->stats().h2_pings_received >= 1; }));
  ASSERT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }));
  response = http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 200u);
  EXPECT_EQ(upstream->stats().connections_accepted, 2u);
}

TEST(Http2Upstream, AnsweredPingsKeepTheConnection) {
  auto upstream = start_h2_mock({});
  TestGateway gateway(
      h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections,
                "upstream:\n  http2_ping_after: 50ms\n  http2_ping_timeout: 200ms\n"));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(response.status, 200u);
  ASSERT_TRUE(eventually([&] { return upstream->stats().h2_pings_received >= 3; }));
  EXPECT_EQ(upstream->stats().open_connections, 1u);
}

TEST(Http2Upstream, AConnectionCountsAsIdleOnlyWhileItCarriesNoStream) {
  mock::Behaviour behaviour;
  behaviour.ttft = 500ms;
  auto upstream = start_h2_mock(behaviour);
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections));
  auto scrape = [&] {
    return http_request(gateway.gateway().admin_port(), "GET", "/metrics").body;
  };
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&] {
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
    });
  }
  EXPECT_TRUE(eventually([&] {
    const auto metrics = scrape();
    return metrics.find("\nsluice_upstream_streams_active 3\n") != std::string::npos &&
           metrics.find("\nsluice_upstream_connections{state=\"active\"} 1\n") !=
               std::string::npos &&
           metrics.find("\nsluice_upstream_connections{state=\"idle\"} 0\n") != std::string::npos;
  })) << scrape();
  for (auto& client : clients) client.join();
  EXPECT_TRUE(eventually([&] {
    return gateway.idle_upstream_connections() == 1 && gateway.active_upstream_connections() == 0;
  })) << scrape();
  const auto metrics = scrape();
  EXPECT_NE(metrics.find("\nsluice_upstream_streams_active 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nsluice_upstream_connections{state=\"idle\"} 1\n"), std::string::npos)
      << metrics;
  EXPECT_EQ(upstream->stats().connections_accepted, 1u);
}

// A listening socket that is never accepted from: connecting succeeds (the
// kernel completes the handshake), and not one byte ever comes back.
TEST(Http2Upstream, AWinningHedgeIsNotHeldByAConnectionAwaitingSettings) {
  net::io_context context;
  net::ip::tcp::acceptor silent(context, {net::ip::make_address("127.0.0.1"), 0});
  const auto silent_url =
      "http://127.0.0.1:" + std::to_string(silent.local_endpoint().port()) + "/v1";
  auto steady = start_mock({});
  TestGateway gateway(h2_then_steady("silent", silent_url, steady->base_url(), kHedgeAfter100ms,
                                     "        timeouts: {connect: 4s}\n"));
  const auto started = std::chrono::steady_clock::now();
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  const auto elapsed = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(steady->stats().requests, 1u);
  // The hedge answers in about 100 ms; the silent server's SETTINGS would
  // have been awaited until the 4 s connect deadline.
  EXPECT_LT(elapsed, 2s);
}

// The HTTP/1.1 client's promises, kept over HTTP/2.

TEST(Http2Upstream, CredentialsAreTheDeploymentsAndServerTimingIsWritten) {
  mock::Behaviour behaviour;
  behaviour.ttft = 30ms;
  auto upstream = start_h2_mock(behaviour);
  TestGateway gateway(
      h2_config(upstream->base_url(),
                kPriorKnowledge + kNoWarmConnections + "        api_key: sk-deployment-secret\n"));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true),
                   {{"Authorization", "Bearer client-key"}, {"x-api-key", "client-key"}});
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.body.find("sk-deployment-secret"), std::string::npos);
  const auto timing = response.header("server-timing");
  EXPECT_NE(timing.find("gateway;dur="), std::string::npos) << timing;
  std::smatch ttfb;
  ASSERT_TRUE(std::regex_search(timing, ttfb, std::regex(R"(upstream-ttfb;dur=([0-9.]+))")))
      << timing;
  EXPECT_GE(std::stod(ttfb[1]), 25.0);
  const auto recorded = upstream->recent_requests();
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_EQ(recorded[0].header("authorization").value_or(""), "Bearer sk-deployment-secret");
  EXPECT_FALSE(recorded[0].header("x-api-key").has_value());
  EXPECT_EQ(upstream->stats().h2_connections, 1u);
}

TEST(Http2Upstream, AResetBeforeTheHeadFailsOverAndOneAfterItEndsWithAnErrorEvent) {
  auto steady = start_mock({});
  {
    mock::Behaviour behaviour;
    behaviour.fail = "reset";
    auto resetting = start_h2_mock(behaviour);
    TestGateway gateway(
        h2_then_steady("resetting", resetting->base_url(), steady->base_url(), kOneRetry));
    auto response =
        http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
    EXPECT_EQ(response.status, 200u) << response.body;
    EXPECT_EQ(response.header("x-sluice-deployment"), "steady");
    EXPECT_EQ(sse_data(response.body).back(), "[DONE]");
    EXPECT_EQ(resetting->stats().requests, 1u);
  }
  mock::Behaviour behaviour;
  behaviour.fail = "reset-mid";
  behaviour.tokens = 6;
  behaviour.interval = 20ms;
  auto cutting = start_h2_mock(behaviour);
  TestGateway gateway(
      h2_then_steady("cutting", cutting->base_url(), steady->base_url(), kOneRetry));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-deployment"), "cutting");
  const auto events = sse_data(response.body);
  ASSERT_GE(events.size(), 2u) << response.body;
  EXPECT_NE(events.front().find("chat.completion.chunk"), std::string::npos) << response.body;
  EXPECT_NE(events.back(), "[DONE]");
  const auto last = json::parse(events.back(), nullptr, false);
  ASSERT_TRUE(last.is_object() && last.contains("error")) << events.back();
  EXPECT_EQ(steady->stats().requests, 1u);  // only the first part's failover
}

TEST(Http2Upstream, FirstByteAndIdleDeadlinesHoldAndResetOnlyTheirStream) {
  mock::Behaviour behaviour;
  behaviour.ttft = 3000ms;
  auto upstream = start_h2_mock(behaviour);
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections +
                                                          "        timeouts: {ttft: 200ms, idle: "
                                                          "300ms}\n"));
  auto started = std::chrono::steady_clock::now();
  auto late = http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1500ms);
  EXPECT_EQ(late.status, 504u) << late.body;
  EXPECT_NE(late.body.find("first_byte_timeout"), std::string::npos) << late.body;

  // A stream that stops after its first event: cut at the idle deadline.
  started = std::chrono::steady_clock::now();
  auto stalled = http_request(
      gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true),
      {{"x-mock-ttft-ms", "0"}, {"x-mock-fail", "stall-mid"}, {"x-mock-stall-ms", "3000"}});
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1500ms);
  ASSERT_EQ(stalled.status, 200u) << stalled.body;
  const auto events = sse_data(stalled.body);
  ASSERT_FALSE(events.empty());
  EXPECT_NE(events.back().find("idle_timeout"), std::string::npos) << stalled.body;
  // Each deadline reset its own stream; the connection carried both.
  EXPECT_TRUE(eventually([&] { return upstream->stats().h2_resets_received == 2; }));
  EXPECT_EQ(upstream->stats().connections_accepted, 1u);
  EXPECT_EQ(upstream->stats().open_connections, 1u);
}

// Two streams in flight on one connection when it is lost: the one past its
// first byte ends with the error event, the one still waiting for its head
// is sent again to the other deployment.
TEST(Http2Upstream, ALostConnectionFailsOverOnlyTheStreamsBeforeTheirFirstByte) {
  mock::Behaviour behaviour;
  behaviour.ttft = 3000ms;
  behaviour.tokens = 100;
  behaviour.interval = 50ms;
  auto lost = start_h2_mock(behaviour);
  auto steady = start_mock({});
  TestGateway gateway(h2_then_steady("lost", lost->base_url(), steady->base_url(), kOneRetry));
  HttpConnection streaming(gateway.port(), 5s);
  streaming.send("POST", "/v1/chat/completions", chat_body("chat", true),
                 {{"x-mock-ttft-ms", "0"}});
  ASSERT_EQ(streaming.read_head().status, 200u);
  ASSERT_TRUE(streaming.read_body_piece().has_value());
  HttpConnection waiting(gateway.port(), 5s);
  waiting.send("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_TRUE(eventually([&] { return lost->stats().requests == 2; }));
  ASSERT_EQ(lost->stats().connections_accepted, 1u);
  lost->stop();

  const auto cut = sse_data(streaming.read_rest_of_body());
  ASSERT_FALSE(cut.empty());
  const auto last = json::parse(cut.back(), nullptr, false);
  EXPECT_TRUE(last.is_object() && last.contains("error")) << cut.back();
  const auto head = waiting.read_head();
  EXPECT_EQ(head.status, 200u);
  EXPECT_EQ(head.header("x-sluice-deployment"), "steady");
  EXPECT_EQ(sse_data(waiting.read_rest_of_body()).back(), "[DONE]");
  EXPECT_EQ(steady->stats().requests, 1u);
}

// A client that does not read holds back only its own stream: the windows
// are given back as the relay writes to it, so the server is throttled on
// that stream while another stream on the same connection runs free.
TEST(Http2Upstream, ASlowClientThrottlesOnlyItsOwnStream) {
  auto upstream = start_h2_mock({});
  TestGateway gateway(h2_config(upstream->base_url(), kPriorKnowledge + kNoWarmConnections));
  // About 30 MB: more than the stream window (4 MiB) and the socket
  // buffers on the way together.
  HttpConnection slow(gateway.port(), 20s);
  slow.send("POST", "/v1/chat/completions", chat_body("chat", true), {{"x-mock-tokens", "200000"}});
  ASSERT_EQ(slow.read_head().status, 200u);
  std::this_thread::sleep_for(1s);
  const auto started = std::chrono::steady_clock::now();
  auto quick =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1s);
  EXPECT_EQ(sse_data(quick.body).back(), "[DONE]");
  EXPECT_TRUE(eventually([&] { return upstream->stats().streams_completed == 1; }));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(upstream->stats().streams_completed, 1u) << "the unread stream was sent whole";
  EXPECT_EQ(upstream->stats().connections_accepted, 1u);

  const auto rest = slow.read_rest_of_body();
  EXPECT_GT(rest.size(), 20'000'000u);
  EXPECT_EQ(rest.substr(rest.size() - 14), "data: [DONE]\n\n");
  EXPECT_TRUE(eventually([&] { return upstream->stats().streams_completed == 2; }));
}

// A hedge that wins cancels the losing attempt's stream with RST_STREAM;
// the connection stays for the next request.
TEST(Http2Upstream, ALosingAttemptResetsItsStreamAndKeepsTheConnection) {
  mock::Behaviour behaviour;
  behaviour.ttft = 2000ms;
  auto slow = start_h2_mock(behaviour);
  auto steady = start_mock({});
  TestGateway gateway(
      h2_then_steady("slow", slow->base_url(), steady->base_url(), kHedgeAfter100ms));
  const auto started = std::chrono::steady_clock::now();
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1500ms);
  EXPECT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-deployment"), "steady");
  EXPECT_TRUE(eventually([&] { return slow->stats().h2_resets_received == 1; }));
  EXPECT_EQ(slow->stats().requests, 1u);
  EXPECT_EQ(slow->stats().open_connections, 1u);
}

TEST(Http2Upstream, WarmConnectionsOpenOneH2ConnectionPerWorker) {
  auto upstream = start_h2_mock({});
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 2\nmodels:\n  - name: chat\n"
      "    deployments:\n" +
      deployment_yaml("h2", upstream->base_url(), kPriorKnowledge));
  ASSERT_TRUE(eventually([&] { return upstream->stats().h2_connections == 2; }));
  EXPECT_EQ(upstream->stats().requests, 0u);
  for (int i = 0; i < 6; ++i) {
    auto response =
        http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
    EXPECT_EQ(response.status, 200u) << response.body;
  }
  EXPECT_EQ(upstream->stats().requests, 6u);
  EXPECT_EQ(upstream->stats().connections_accepted, 2u);
}

// A port the kernel picked as free a moment ago, for a server that must be
// told one.
std::uint16_t h2_free_port() {
  net::io_context context;
  net::ip::tcp::acceptor acceptor(context, {net::ip::make_address("127.0.0.1"), 0});
  return acceptor.local_endpoint().port();
}

TEST(Http2Upstream, NghttpdServesAFileThroughTheTransport) {
  const std::string nghttpd = "/usr/sbin/nghttpd";
  if (!std::filesystem::exists(nghttpd)) GTEST_SKIP() << "nghttpd not installed (scripts/setup)";
  const auto directory =
      std::filesystem::temp_directory_path() / ("sluice-nghttpd-" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  const std::string content = R"({"object":"list","data":[{"id":"served-by-nghttpd"}]})";
  std::ofstream(directory / "models.json") << content;
  const auto port = h2_free_port();
  ChildProcess server(
      nghttpd, {"--no-tls", "-d", directory.string(), "-a", "127.0.0.1", std::to_string(port)});
  config::Deployment deployment;
  deployment.base_url = {"http", "127.0.0.1", port, ""};
  deployment.http2 = config::Http2Mode::prior_knowledge;
  const auto origin = upstream::Origin::from(deployment);

  net::io_context context;
  upstream::DnsCache dns(std::chrono::seconds(60));
  upstream::Pool pool{upstream::PoolOptions{}};
  upstream::TlsContexts tls;
  upstream::Http2Client client({pool, dns, tls});
  upstream::Request request;
  request.method = "GET";
  request.target = {"/models.json", "", ""};
  request.fields = {"Accept: application/json\r\n", "", ""};
  upstream::Limits limits;
  limits.connect = 1s;
  limits.ttft = 2s;
  limits.idle = 2s;
  unsigned status = 0;
  std::string body;
  std::string failure;
  // nghttpd may take a moment to listen.
  for (int attempt = 0; attempt < 50 && status == 0; ++attempt) {
    run_to_end(context, [&]() -> net::awaitable<void> {
      upstream::AbortHandle abort_handle;
      auto started = co_await client.start(origin, request, limits, abort_handle);
      if (!started) {
        failure = started.error().describe();
        co_return;
      }
      auto& exchange = *started.value();
      status = exchange.status();
      std::array<char, 64> piece{};
      for (;;) {
        auto read = exchange.read_buffered_body(piece.data(), piece.size());
        if (!read) read = co_await exchange.read_body(piece.data(), piece.size());
        if (!*read || read->value() == 0) break;
        body.append(piece.data(), read->value());
      }
    }());
    context.restart();
    if (status == 0) std::this_thread::sleep_for(50ms);
  }
  std::filesystem::remove_all(directory);
  ASSERT_EQ(status, 200u) << failure;
  EXPECT_EQ(body, content);
  EXPECT_EQ(client.connection_count(origin.key()), 1u);
}

}  // namespace
}  // namespace sluice::testing

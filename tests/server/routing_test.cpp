// The router at work behind the gateway: latency routing, failover,
// fallbacks, cooldown and hedging, against real mock upstreams.
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/leak_check.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::unique_ptr<mock::MockServer> mock_with(std::chrono::milliseconds ttft, std::string fail = "",
                                            double fail_rate = 1.0) {
  mock::Behaviour behaviour;
  behaviour.ttft = ttft;
  behaviour.fail = std::move(fail);
  behaviour.fail_rate = fail_rate;
  behaviour.stall = 2000ms;
  return start_mock(behaviour, 2);
}

std::uint16_t closed_port() {
  boost::asio::io_context context;
  boost::asio::ip::tcp::acceptor probe(context, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return probe.local_endpoint().port();
}

struct Sample {
  std::string deployment;
  std::chrono::microseconds ttft;
  unsigned status;
};

// Sends `count` streaming requests from `clients` connections in parallel.
std::vector<Sample> stream_requests(std::uint16_t port, const std::string& model, int count,
                                    int clients = 1) {
  std::vector<Sample> samples;
  std::mutex mutex;
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      HttpConnection connection(port, 10s);
      while (next.fetch_add(1) < count) {
        auto sent = Clock::now();
        connection.send("POST", "/v1/chat/completions", chat_body(model, true));
        auto head = connection.read_head();
        auto first = connection.read_body_piece();
        auto ttft = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent);
        connection.read_rest_of_body();
        std::lock_guard lock(mutex);
        samples.push_back({head.header("x-sluice-deployment"), ttft, head.status});
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return samples;
}

std::size_t count_for(const std::vector<Sample>& samples, const std::string& deployment) {
  return std::count_if(samples.begin(), samples.end(),
                       [&](const Sample& s) { return s.deployment == deployment; });
}

std::chrono::microseconds p99(std::vector<Sample> samples) {
  std::sort(samples.begin(), samples.end(),
            [](const Sample& a, const Sample& b) { return a.ttft < b.ttft; });
  auto rank = static_cast<std::size_t>(std::ceil(0.99 * samples.size())) - 1;
  return samples[rank].ttft;
}

TEST(Routing, LatencyStrategyPrefersFastDeploymentAndFollowsChange) {
  auto fast = mock_with(20ms);
  auto slow = mock_with(200ms);
  TestGateway gateway("router:\n  window: 5\nmodels:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("fast", fast->base_url()) +
                      deployment_yaml("slow", slow->base_url()));
  // Warm-up: unsampled deployments are tried first.
  stream_requests(gateway.port(), "chat", 4);
  auto samples = stream_requests(gateway.port(), "chat", 40);
  EXPECT_GE(count_for(samples, "fast"), 36u) << count_for(samples, "slow") << " went to slow";

  // The fast one becomes slower than the other: within one window of its
  // own samples, traffic moves.
  mock::Behaviour slower;
  slower.ttft = 400ms;
  fast->set_behaviour(slower);
  stream_requests(gateway.port(), "chat", 5);
  auto after = stream_requests(gateway.port(), "chat", 10);
  EXPECT_GE(count_for(after, "slow"), 9u) << count_for(after, "fast") << " still went to fast";
}

// Every way a deployment can fail before its first byte moves the request to
// the next one, and the failed attempt leaves no socket behind.
class Failover : public ::testing::TestWithParam<std::string> {};

TEST_P(Failover, ToHealthyDeploymentGivesFullStream) {
  const std::string mode = GetParam();
  std::unique_ptr<mock::MockServer> broken;
  std::string broken_url;
  if (mode == "refused") {
    broken_url = "http://127.0.0.1:" + std::to_string(closed_port()) + "/v1";
  } else if (mode == "dns") {
    broken_url = "http://sluice-failover.invalid/v1";  // .invalid never resolves (RFC 6761)
  } else if (mode == "drip") {
    // Every byte of the head 20 ms apart: the head cannot arrive within ttft.
    mock::Behaviour dripping;
    dripping.fail = "drip";
    dripping.interval = 20ms;
    broken = start_mock(dripping, 2);
    broken_url = broken->base_url();
  } else {
    broken = mock_with(0ms, mode == "ttft" ? "stall" : mode == "tls" ? "" : mode);
    broken_url = broken->base_url();
    // A TLS client talking to a plain-HTTP upstream fails its handshake.
    if (mode == "tls") broken_url.replace(0, 4, "https");
  }
  auto healthy = mock_with(0ms);
  TestGateway gateway(
      "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
      deployment_yaml("broken", broken_url,
                      kNoWarmConnections + "        timeouts: {ttft: 200ms, connect: 500ms}\n") +
      deployment_yaml("healthy", healthy->base_url(), kNoWarmConnections));
  LeakCheck leaks(gateway);

  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-deployment"), "healthy");
  EXPECT_EQ(response.header("x-sluice-attempts"), "2");
  EXPECT_EQ(sse_data(response.body).back(), "[DONE]");
  if (broken) {
    // A failed handshake never gets as far as a request.
    EXPECT_EQ(broken->stats().requests, mode == "tls" ? 0u : 1u);
  }
  EXPECT_TRUE(leaks.settled());
  if (broken) {
    EXPECT_TRUE(eventually([&] { return broken->stats().open_connections == 0; }, 2s));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, Failover,
                         ::testing::Values("500", "429", "refused", "ttft", "reset", "garbage",
                                           "drip", "dns", "tls"));

TEST(Routing, ClientErrorIsReturnedAsIsWithOneAttempt) {
  auto rejecting = mock_with(0ms, "400");
  auto healthy = mock_with(0ms);
  TestGateway gateway("models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
                      deployment_yaml("first", rejecting->base_url()) +
                      deployment_yaml("second", healthy->base_url()));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 400u);
  EXPECT_EQ(json::parse(response.body)["error"]["type"], "invalid_request_error");
  EXPECT_EQ(response.header("x-sluice-attempts"), "1");
  EXPECT_EQ(rejecting->stats().requests, 1u);
  EXPECT_EQ(healthy->stats().requests, 0u);
}

TEST(Routing, FallbackModelIsUsedWhenGroupIsExhausted) {
  auto failing = mock_with(0ms, "500");
  auto backup = mock_with(0ms);
  TestGateway gateway(
      "models:\n"
      "  - name: chat\n    fallbacks: [backup]\n    deployments:\n" +
      deployment_yaml("primary", failing->base_url()) +
      "  - name: backup\n    deployments:\n      - id: backup-1\n        base_url: " +
      backup->base_url() + "\n        model: backup-upstream\n");
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-deployment"), "backup-1");
  EXPECT_EQ(json::parse(response.body)["model"], "backup-upstream");
  EXPECT_EQ(failing->stats().requests, 1u);
}

TEST(Routing, ContextWindowErrorGoesToContextWindowFallback) {
  auto small = mock_with(0ms, "context");
  auto general = mock_with(0ms);
  auto large = mock_with(0ms);
  TestGateway gateway(
      "models:\n"
      "  - name: chat\n    fallbacks: [general]\n    context_window_fallbacks: [long]\n"
      "    deployments:\n" +
      deployment_yaml("small", small->base_url()) + "  - name: general\n    deployments:\n" +
      deployment_yaml("general-1", general->base_url()) + "  - name: long\n    deployments:\n" +
      deployment_yaml("long-1", large->base_url()));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-deployment"), "long-1");
  EXPECT_EQ(general->stats().requests, 0u);
}

TEST(Routing, RetriesBoundTheAttempts) {
  std::vector<std::unique_ptr<mock::MockServer>> failing;
  std::string deployments;
  for (int i = 0; i < 4; ++i) {
    failing.push_back(mock_with(0ms, "503"));
    deployments += deployment_yaml("d" + std::to_string(i), failing.back()->base_url());
  }
  TestGateway gateway(
      "router:\n  retries: 2\n  backoff: {base: 1ms, max: 5ms}\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployments);
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 503u);  // the last upstream answer, as is
  EXPECT_EQ(response.header("x-sluice-attempts"), "3");
  std::uint64_t total = 0;
  for (auto& upstream : failing) total += upstream->stats().requests;
  EXPECT_EQ(total, 3u);
}

TEST(Routing, CooldownTakesFailingDeploymentOutAndProbeBringsItBack) {
  auto flaky = mock_with(0ms, "500");
  auto healthy = mock_with(0ms);
  TestGateway gateway(
      "router:\n  cooldown: {fails: 2, within: 60s, for: 300ms}\n"
      "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
      deployment_yaml("flaky", flaky->base_url()) +
      deployment_yaml("healthy", healthy->base_url()));
  auto ask = [&] {
    return http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  };
  EXPECT_EQ(ask().header("x-sluice-attempts"), "2");
  EXPECT_EQ(ask().header("x-sluice-attempts"), "2");
  ASSERT_EQ(flaky->stats().requests, 2u);
  // Cooling down: straight to the healthy one.
  for (int i = 0; i < 3; ++i) {
    auto response = ask();
    EXPECT_EQ(response.header("x-sluice-deployment"), "healthy");
    EXPECT_EQ(response.header("x-sluice-attempts"), "1");
  }
  EXPECT_EQ(flaky->stats().requests, 2u);

  flaky->set_behaviour({});
  std::this_thread::sleep_for(350ms);
  auto probe = ask();
  EXPECT_EQ(probe.header("x-sluice-deployment"), "flaky");
  EXPECT_EQ(ask().header("x-sluice-deployment"), "flaky");
}

// A user pressing "stop" in a chat UI closes the stream after its first
// events: the deployment did nothing wrong.
TEST(Routing, ClientThatLeavesMidStreamIsNoFailureOfTheDeployment) {
  mock::Behaviour chatty;
  chatty.interval = 50ms;
  chatty.tokens = 40;
  auto first = start_mock(chatty);
  auto second = start_mock(chatty);
  TestGateway gateway(
      "router:\n  cooldown: {fails: 2, within: 60s, for: 30s}\n"
      "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
      deployment_yaml("first", first->base_url()) + deployment_yaml("second", second->base_url()));
  auto first_deployment = [&] {
    auto routes = http_request(gateway.gateway().admin_port(), "GET", "/admin/routes");
    return json::parse(routes.body)["models"][0]["deployments"][0];
  };
  constexpr int kStopped = 4;
  for (int i = 0; i < kStopped; ++i) {
    HttpConnection client(gateway.port(), 5s);
    client.send("POST", "/v1/chat/completions", chat_body("chat", true));
    auto head = client.read_head();
    ASSERT_EQ(head.status, 200u);
    ASSERT_EQ(head.header("x-sluice-deployment"), "first");
    ASSERT_TRUE(client.read_body_piece());
    client.close();
    // The gateway sees the client go before the next request is sent.
    ASSERT_TRUE(eventually([&] { return first_deployment()["in_flight"] == 0; }));
  }
  auto deployment = first_deployment();
  EXPECT_EQ(deployment["failures_total"], 0) << deployment;
  EXPECT_EQ(deployment["recent_error_rate"], 0.0) << deployment;
  EXPECT_EQ(deployment["cooling_down"], false) << deployment;
  EXPECT_EQ(deployment["ttft_samples"], kStopped) << deployment;

  auto next =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(next.status, 200u);
  EXPECT_EQ(next.header("x-sluice-deployment"), "first");
  EXPECT_EQ(second->stats().requests, 0u);
}

TEST(Routing, HedgingCutsTheTailOfAStallingDeployment) {
  auto stalling = mock_with(10ms, "stall", 0.1);
  auto steady = mock_with(10ms);
  auto config = [&](const std::string& hedge) {
    // Both deployments answer in 10 ms; a buffer of 100% keeps both in the
    // draw however the measured medians wobble on a busy machine, so the
    // stalling one keeps getting its share.
    return "router:\n  window: 20\n  latency_buffer: 1.0\n  hedge: {after: " + hedge +
           "}\nmodels:\n  - name: chat\n    deployments:\n" +
           deployment_yaml("stalling", stalling->base_url()) +
           deployment_yaml("steady", steady->base_url());
  };
  std::chrono::microseconds without_hedge, with_hedge;
  {
    TestGateway gateway(config("off"));
    stream_requests(gateway.port(), "chat", 10, 4);
    without_hedge = p99(stream_requests(gateway.port(), "chat", 120, 6));
  }
  {
    TestGateway gateway(config("p95"));
    stream_requests(gateway.port(), "chat", 40, 4);
    auto samples = stream_requests(gateway.port(), "chat", 120, 6);
    for (const auto& sample : samples) EXPECT_EQ(sample.status, 200u);
    with_hedge = p99(samples);
  }
  EXPECT_GT(without_hedge, 1000ms);
  EXPECT_LT(with_hedge * 4, without_hedge)
      << "p99 with hedge " << with_hedge.count() << " us, without " << without_hedge.count();
}

}  // namespace
}  // namespace sluice::testing

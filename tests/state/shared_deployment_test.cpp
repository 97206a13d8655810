// A deployment's rpm and max_parallel held across several gateways on one
// redis-server, as a key's are, and what happens while Redis is away.
#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/redis_server.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;

bool deployment_backend_up(TestGateway& gateway) {
  const auto* status = gateway.gateway().state_status();
  return status != nullptr && status->up();
}

// Three gateways without auth on one Redis, `models` as their models.
std::vector<std::unique_ptr<TestGateway>> three_sharing_deployments(
    const RedisServer& redis, const std::string& models, const std::string& state_extra = "") {
  std::vector<std::unique_ptr<TestGateway>> gateways;
  for (int i = 0; i < 3; ++i) {
    gateways.push_back(std::make_unique<TestGateway>(
        "server:\n  admin_listen: 127.0.0.1:0\n  threads: 2\n"
        "state:\n  backend: redis\n" +
        state_extra + "  redis:\n    url: " + redis.url() + "\n    timeout: 50ms\n" + models));
  }
  for (auto& gateway : gateways) {
    EXPECT_TRUE(eventually([&] { return deployment_backend_up(*gateway); })) << "never connected";
  }
  return gateways;
}

HttpResponse ask_chat(TestGateway& gateway) {
  return http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
}

class SharedDeploymentLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed (scripts/setup)";
  }
};

TEST_F(SharedDeploymentLimits, RpmHoldsAcrossThreeGatewaysWithExactNumbers) {
  auto upstream = start_mock();
  RedisServer redis;
  auto gateways = three_sharing_deployments(
      redis, "models:\n  - name: chat\n    deployments:\n" +
                 deployment_yaml("limited", upstream->base_url(), "        rpm: 6\n"));
  // rpm 6: a burst of 6, then one every 10 s; 15 requests take well under
  // that, so exactly 6 pass whichever gateways they reach.
  unsigned admitted = 0;
  unsigned refused = 0;
  for (int i = 0; i < 15; ++i) {
    auto response = ask_chat(*gateways[i % 3]);
    if (response.status == 200) {
      ++admitted;
    } else {
      ASSERT_EQ(response.status, 503u) << response.body;
      EXPECT_EQ(nlohmann::json::parse(response.body)["error"]["code"], "overloaded");
      EXPECT_EQ(response.header("retry-after"), "1");
      ++refused;
    }
  }
  EXPECT_EQ(admitted, 6u);
  EXPECT_EQ(refused, 9u);
  EXPECT_EQ(upstream->stats().requests, 6u);
  // Hash-tagged by the deployment, named with its limit.
  auto keys = redis.command({"KEYS", "sluice:{dep:limited}:*"});
  EXPECT_NE(keys.find("sluice:{dep:limited}:rpm:6"), std::string::npos) << keys;
}

// The statuses of a burst one past a deployment's rpm of 30, then of two
// requests once one emission interval (2 s) has passed. The burst must take
// well under the interval, even under the sanitizers.
std::vector<unsigned> rpm_answers(TestGateway& gateway) {
  std::vector<unsigned> statuses;
  for (int i = 0; i < 31; ++i) statuses.push_back(ask_chat(gateway).status);
  std::this_thread::sleep_for(2100ms);
  statuses.push_back(ask_chat(gateway).status);
  statuses.push_back(ask_chat(gateway).status);
  return statuses;
}

TEST_F(SharedDeploymentLimits, OneGatewayGetsTheSameRpmAnswersFromEitherBackend) {
  auto upstream = start_mock();
  RedisServer redis;
  const std::string models = "models:\n  - name: chat\n    deployments:\n" +
                             deployment_yaml("limited", upstream->base_url(), "        rpm: 30\n");
  TestGateway local("server:\n  threads: 2\n" + models);
  auto shared = three_sharing_deployments(redis, models);

  std::vector<unsigned> expected(30, 200u);
  expected.push_back(503u);  // the burst is spent
  expected.push_back(200u);  // one more every 60 s / 30
  expected.push_back(503u);
  EXPECT_EQ(rpm_answers(local), expected);
  EXPECT_EQ(rpm_answers(*shared[0]), expected);
}

TEST_F(SharedDeploymentLimits, AFullDeploymentPassesTheRequestToTheNextOne) {
  auto first = start_mock();
  auto second = start_mock();
  RedisServer redis;
  auto gateways = three_sharing_deployments(
      redis, "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
                 deployment_yaml("first", first->base_url(), "        rpm: 3\n") +
                 deployment_yaml("second", second->base_url()));
  for (int i = 0; i < 9; ++i) {
    auto response = ask_chat(*gateways[i % 3]);
    ASSERT_EQ(response.status, 200u) << response.body;
    // A refusal by the shared limit is no attempt of its own.
    EXPECT_EQ(response.header("x-sluice-attempts"), "1");
  }
  EXPECT_EQ(first->stats().requests, 3u);
  EXPECT_EQ(second->stats().requests, 6u);
}

TEST_F(SharedDeploymentLimits, MaxParallelHoldsAcrossGateways) {
  mock::Behaviour held;
  held.ttft = 800ms;
  auto upstream = start_mock(held);
  RedisServer redis;
  auto gateways = three_sharing_deployments(
      redis, "models:\n  - name: chat\n    deployments:\n" +
                 deployment_yaml("narrow", upstream->base_url(), "        max_parallel: 2\n"));
  std::vector<std::future<HttpResponse>> slow;
  for (int i = 0; i < 2; ++i) {
    slow.push_back(std::async(std::launch::async,
                              [gateway = gateways[i].get()] { return ask_chat(*gateway); }));
  }
  ASSERT_TRUE(eventually([&] { return upstream->stats().requests >= 2; }, 3s));
  auto third = ask_chat(*gateways[2]);
  EXPECT_EQ(third.status, 503u) << third.body;
  EXPECT_NE(third.body.find("max_parallel"), std::string::npos);
  for (auto& response : slow) EXPECT_EQ(response.get().status, 200u);
  // The permits are given back when the attempts end.
  EXPECT_TRUE(eventually([&] { return permits_in(redis, "sluice:{dep:narrow}:held:2") == 0; }, 2s));
  EXPECT_EQ(ask_chat(*gateways[2]).status, 200u);
  EXPECT_EQ(upstream->stats().requests, 3u);
}

TEST_F(SharedDeploymentLimits, AHedgeTakesItsDeploymentsSharedLimitsBeforeItStarts) {
  mock::Behaviour slow;
  slow.ttft = 1500ms;
  auto primary = start_mock(slow);
  auto quick = start_mock();
  RedisServer redis;
  auto gateways = three_sharing_deployments(
      redis,
      "router:\n  retries: 0\n  hedge: {after: 100ms}\n"
      "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
          deployment_yaml("primary", primary->base_url()) +
          deployment_yaml("quick", quick->base_url(), "        rpm: 2\n"));
  // The hedges of two gateways take quick's two requests of its burst and
  // answer in about 100 ms; the third gateway's finds quick full across the
  // instances, is never sent, and the primary answers.
  for (int i = 0; i < 3; ++i) {
    const auto started = std::chrono::steady_clock::now();
    auto response = ask_chat(*gateways[i]);
    const auto took = std::chrono::steady_clock::now() - started;
    ASSERT_EQ(response.status, 200u) << response.body;
    if (i < 2) {
      EXPECT_LT(took, 1200ms) << "request " << i << " was not answered by its hedge";
    } else {
      EXPECT_GE(took, 1400ms) << "the third request's hedge went past the shared rpm";
      EXPECT_EQ(response.header("x-sluice-attempts"), "1");
    }
  }
  EXPECT_EQ(quick->stats().requests, 2u);
  EXPECT_EQ(primary->stats().requests, 3u);
  auto keys = redis.command({"KEYS", "sluice:{dep:quick}:*"});
  EXPECT_NE(keys.find("sluice:{dep:quick}:rpm:2"), std::string::npos) << keys;
}

TEST_F(SharedDeploymentLimits, LocalLimitsHoldWhileRedisIsAway) {
  auto upstream = start_mock();
  RedisServer redis;
  auto gateways = three_sharing_deployments(
      redis, "models:\n  - name: chat\n    deployments:\n" +
                 deployment_yaml("limited", upstream->base_url(), "        rpm: 2\n"));
  redis.kill();
  for (auto& gateway : gateways) {
    ASSERT_TRUE(eventually([&] { return !deployment_backend_up(*gateway); }));
  }
  // Each gateway enforces rpm 2 alone: 2 each pass, the third is refused.
  for (auto& gateway : gateways) {
    EXPECT_EQ(ask_chat(*gateway).status, 200u);
    EXPECT_EQ(ask_chat(*gateway).status, 200u);
    EXPECT_EQ(ask_chat(*gateway).status, 503u);
  }
  EXPECT_EQ(upstream->stats().requests, 6u);
}

TEST_F(SharedDeploymentLimits, DenyAnswers503WhileRedisIsAway) {
  auto upstream = start_mock();
  RedisServer redis;
  auto gateways = three_sharing_deployments(
      redis,
      "models:\n  - name: chat\n    deployments:\n" +
          deployment_yaml("limited", upstream->base_url(), "        rpm: 1000\n"),
      "  on_unavailable: deny\n");
  ASSERT_EQ(ask_chat(*gateways[0]).status, 200u);
  redis.kill();
  for (auto& gateway : gateways) {
    ASSERT_TRUE(eventually([&] { return !deployment_backend_up(*gateway); }));
  }
  for (auto& gateway : gateways) {
    auto refused = ask_chat(*gateway);
    EXPECT_EQ(refused.status, 503u);
    EXPECT_NE(refused.body.find("shared rate limits are unavailable"), std::string::npos)
        << refused.body;
  }
  EXPECT_EQ(upstream->stats().requests, 1u);
}

}  // namespace
}  // namespace sluice::testing

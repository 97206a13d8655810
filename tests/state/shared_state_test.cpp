// Several gateways sharing one redis-server: a key's limits hold across all
// of them, and the faults of Redis (killed, back, stalled, a wrong password)
// leave every request answered within state.redis.timeout.
#include <gtest/gtest.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <algorithm>
#include <atomic>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "sluice/common/clock.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/redis_server.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kSharedKey = "sk-shared-0123456789";

struct SharedSetup {
  std::string redis_url;
  std::string key_limits;  // YAML lines under the key, indented six spaces
  std::string state_extra = "";
  std::string password = "";
};

std::string shared_config(const std::string& base_url, const SharedSetup& setup) {
  std::string yaml =
      "server:\n  admin_listen: 127.0.0.1:0\n  threads: 2\n"
      "state:\n  backend: redis\n" +
      setup.state_extra + "  redis:\n    url: " + setup.redis_url + "\n    timeout: 50ms\n";
  if (!setup.password.empty()) yaml += "    password: " + setup.password + "\n";
  yaml += std::string("auth:\n  keys:\n    - name: team-a\n      key: ") + kSharedKey + "\n" +
          setup.key_limits + "models:\n  - name: chat-fast\n    deployments:\n" +
          deployment_yaml("fast", base_url);
  return yaml;
}

HttpResponse chat(std::uint16_t port) {
  return http_request(port, "POST", "/v1/chat/completions", chat_body("chat-fast", false),
                      bearer(kSharedKey));
}

bool backend_up(TestGateway& gateway) {
  const auto* status = gateway.gateway().state_status();
  return status != nullptr && status->up();
}

std::string admin_get(TestGateway& gateway, const std::string& target) {
  return http_request(gateway.gateway().admin_port(), "GET", target).body;
}

class SharedState : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed (scripts/setup)";
    upstream_ = start_mock();
  }

  // Three gateways on one Redis, all up before the test goes on.
  void start_three(const SharedSetup& setup) {
    for (int i = 0; i < 3; ++i) {
      gateways_.push_back(
          std::make_unique<TestGateway>(shared_config(upstream_->base_url(), setup)));
    }
    for (auto& gateway : gateways_) {
      ASSERT_TRUE(eventually([&] { return backend_up(*gateway); })) << "never connected";
    }
  }

  std::unique_ptr<mock::MockServer> upstream_;
  std::vector<std::unique_ptr<TestGateway>> gateways_;
};

TEST_F(SharedState, RpmHoldsAcrossThreeGatewaysWithExactNumbers) {
  RedisServer redis;
  start_three({redis.url(), "      rpm: 60\n"});
  auto started = std::chrono::steady_clock::now();
  unsigned admitted = 0;
  unsigned limited = 0;
  for (int i = 0; i < 90; ++i) {
    auto response = chat(gateways_[i % 3]->port());
    if (response.status == 200) {
      ++admitted;
      EXPECT_EQ(response.header("x-ratelimit-limit-requests"), "60");
    } else {
      ASSERT_EQ(response.status, 429u) << response.body;
      ++limited;
      EXPECT_GE(std::stoi(response.header("retry-after")), 1);
      EXPECT_EQ(response.header("x-ratelimit-remaining-requests"), "0");
      EXPECT_EQ(json::parse(response.body)["error"]["code"], "rate_limit_exceeded");
    }
  }
  // One more request is let in per second that passes (60 per minute).
  auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started)
          .count();
  EXPECT_GE(admitted, 60u);
  EXPECT_LE(admitted, 60u + static_cast<unsigned>(seconds));
  EXPECT_EQ(admitted + limited, 90u);
  EXPECT_EQ(upstream_->stats().requests, admitted);
  std::printf("rpm 60 across three gateways: %u admitted, %u refused in %llds\n", admitted, limited,
              static_cast<long long>(seconds));
}

TEST_F(SharedState, FirstRequestsShowTheSameHeadersAsTheLocalBackend) {
  RedisServer redis;
  start_three({redis.url(), "      rpm: 5\n      tpm: 100000\n"});
  for (int i = 0; i < 5; ++i) {
    auto response = chat(gateways_[i % 3]->port());
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_EQ(response.header("x-ratelimit-remaining-requests"), std::to_string(4 - i));
  }
  auto limited = chat(gateways_[2]->port());
  EXPECT_EQ(limited.status, 429u);
  EXPECT_EQ(limited.header("x-ratelimit-remaining-requests"), "0");
  // 12s until the next one, as the local GCRA says for 5 per minute.
  int retry_after = std::stoi(limited.header("retry-after"));
  EXPECT_GE(retry_after, 11);
  EXPECT_LE(retry_after, 12);
}

TEST_F(SharedState, TokensAreSettledByReportedUsageAcrossGateways) {
  RedisServer redis;
  // 100 tokens a second come back: slow enough to tell a settlement from it.
  start_three({redis.url(), "      tpm: 6000\n"});
  auto first = chat(gateways_[0]->port());
  ASSERT_EQ(first.status, 200u);
  // The estimate charged up front (about 270 tokens: the prompt's bytes / 4
  // and 256 for the completion) is settled after the answer with the few
  // tokens the mock reports. The settlement is sent once the answer is out,
  // so give it a moment to reach Redis before another gateway looks.
  auto after_first = std::stoll(first.header("x-ratelimit-remaining-tokens"));
  EXPECT_LT(after_first, 6000 - 200);
  std::this_thread::sleep_for(100ms);
  auto second = chat(gateways_[1]->port());
  ASSERT_EQ(second.status, 200u);
  auto after_second = std::stoll(second.header("x-ratelimit-remaining-tokens"));
  // Unsettled, the second estimate would leave about 270 fewer; settled, the
  // first request costs only what it used (and 100ms gave 10 back).
  EXPECT_GT(after_second, after_first - 100);
  EXPECT_LT(after_second, after_first + 50);
}

TEST_F(SharedState, MaxParallelHoldsAcrossGateways) {
  mock::Behaviour held;
  held.ttft = 800ms;
  upstream_ = start_mock(held);
  RedisServer redis;
  start_three({redis.url(), "      max_parallel: 2\n"});
  std::vector<std::future<HttpResponse>> slow;
  for (int i = 0; i < 2; ++i) {
    slow.push_back(
        std::async(std::launch::async, [port = gateways_[i]->port()] { return chat(port); }));
  }
  ASSERT_TRUE(eventually([&] { return upstream_->stats().requests >= 2; }, 3s));
  auto third = chat(gateways_[2]->port());
  EXPECT_EQ(third.status, 429u) << third.body;
  EXPECT_NE(third.body.find("max_parallel"), std::string::npos);
  for (auto& response : slow) EXPECT_EQ(response.get().status, 200u);
  // The permits are given back when the requests end.
  EXPECT_EQ(chat(gateways_[2]->port()).status, 200u);
}

// The warnings logged from now on. The sink stays installed for the rest of
// the process: taking it out while gateways log would race with them.
std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> capture_log() {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  sink->set_level(spdlog::level::warn);
  spdlog::default_logger()->sinks().push_back(sink);
  return sink;
}

std::size_t lines_with(spdlog::sinks::ringbuffer_sink_mt& sink, const std::string& text) {
  auto lines = sink.last_formatted();
  return static_cast<std::size_t>(std::count_if(lines.begin(), lines.end(), [&](auto& line) {
    return line.find(text) != std::string::npos;
  }));
}

TEST_F(SharedState, RedisKilledMidTrafficFallsBackToLocalLimitsAndComesBack) {
  RedisServer redis;
  auto log = capture_log();
  start_three({redis.url(), "      rpm: 60\n"});
  ASSERT_EQ(chat(gateways_[0]->port()).status, 200u);
  EXPECT_NE(admin_get(*gateways_[0], "/metrics").find("sluice_state_backend_up 1"),
            std::string::npos);

  redis.kill();
  auto longest = 0ms;
  for (int i = 0; i < 30; ++i) {
    auto sent = std::chrono::steady_clock::now();
    auto response = chat(gateways_[i % 3]->port());
    longest = std::max(longest, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::steady_clock::now() - sent));
    EXPECT_EQ(response.status, 200u) << response.body;
  }
  // The mock answers at once: what a request took is the gateway's own
  // time, plus at most one wait for Redis (50ms) in the worst case.
  EXPECT_LT(longest, 500ms);
  for (auto& gateway : gateways_) EXPECT_FALSE(backend_up(*gateway));
  // One warning per gateway for the outage, not one per request.
  EXPECT_EQ(lines_with(*log, redis.url() + " is unavailable"), 3u);
  EXPECT_NE(admin_get(*gateways_[0], "/metrics").find("sluice_state_backend_up 0"),
            std::string::npos);
  auto routes = json::parse(admin_get(*gateways_[1], "/admin/routes"));
  EXPECT_EQ(routes["state"]["backend"], "redis");
  EXPECT_EQ(routes["state"]["up"], false);

  // Back: every gateway reconnects (backoff with jitter, at most 5s apart),
  // and the budget is shared again: it starts empty, as Redis does.
  redis.restart();
  for (auto& gateway : gateways_) {
    EXPECT_TRUE(eventually([&] { return backend_up(*gateway); }, 15s));
  }
  ASSERT_EQ(chat(gateways_[0]->port()).status, 200u);
  auto remaining = chat(gateways_[1]->port()).header("x-ratelimit-remaining-requests");
  EXPECT_EQ(remaining, "58");
}

TEST_F(SharedState, DenyAnswers503WhileRedisIsAway) {
  RedisServer redis;
  start_three({redis.url(), "      rpm: 1000\n", "  on_unavailable: deny\n"});
  ASSERT_EQ(chat(gateways_[0]->port()).status, 200u);
  redis.kill();
  ASSERT_TRUE(eventually([&] {
    return chat(gateways_[0]->port()).status == 503 && chat(gateways_[1]->port()).status == 503;
  }));
  auto refused = chat(gateways_[2]->port());
  EXPECT_EQ(refused.status, 503u);
  EXPECT_EQ(json::parse(refused.body)["error"]["code"], "overloaded");
}

TEST_F(SharedState, StalledRedisCostsNoRequestMoreThanTheTimeout) {
  RedisServer redis;
  start_three({redis.url(), "      rpm: 1000\n"});
  ASSERT_EQ(chat(gateways_[0]->port()).status, 200u);
  redis.pause();
  auto longest = 0ms;
  for (int i = 0; i < 30; ++i) {
    auto sent = std::chrono::steady_clock::now();
    auto response = chat(gateways_[i % 3]->port());
    longest = std::max(longest, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::steady_clock::now() - sent));
    EXPECT_EQ(response.status, 200u) << response.body;
  }
  EXPECT_LT(longest, 500ms);
  for (auto& gateway : gateways_) EXPECT_FALSE(backend_up(*gateway));
  redis.resume();
  for (auto& gateway : gateways_) {
    EXPECT_TRUE(eventually([&] { return backend_up(*gateway); }, 15s));
  }
}

TEST_F(SharedState, WrongPasswordIsNamedAndTheGatewayRunsOnLocalState) {
  RedisServer redis({"--requirepass", "right-password"});
  TestGateway gateway(
      shared_config(upstream_->base_url(), {redis.url(), "      rpm: 2\n", "", "wrong-password"}));
  ASSERT_TRUE(eventually(
      [&] { return json::parse(admin_get(gateway, "/admin/routes"))["state"].contains("error"); }));
  auto state = json::parse(admin_get(gateway, "/admin/routes"))["state"];
  EXPECT_EQ(state["up"], false);
  EXPECT_NE(state["error"].get<std::string>().find("WRONGPASS"), std::string::npos) << state.dump();
  // The local limits hold meanwhile.
  EXPECT_EQ(chat(gateway.port()).status, 200u);
  EXPECT_EQ(chat(gateway.port()).status, 200u);
  EXPECT_EQ(chat(gateway.port()).status, 429u);
}

TEST_F(SharedState, RightPasswordConnects) {
  RedisServer redis({"--requirepass", "right-password"});
  TestGateway gateway(
      shared_config(upstream_->base_url(), {redis.url(), "      rpm: 2\n", "", "right-password"}));
  EXPECT_TRUE(eventually([&] { return backend_up(gateway); }));
  EXPECT_EQ(chat(gateway.port()).status, 200u);
  // The budget is in Redis, under the key's hash tag.
  auto keys = redis.command({"KEYS", "sluice:{key:team-a}:*"}, "right-password");
  EXPECT_NE(keys.find("sluice:{key:team-a}:rpm:2"), std::string::npos) << keys;
}

// Three gateways without auth on one Redis, for what is shared besides limits.
std::vector<std::unique_ptr<TestGateway>> three_on(const RedisServer& redis,
                                                   const std::string& rest) {
  std::vector<std::unique_ptr<TestGateway>> gateways;
  for (int i = 0; i < 3; ++i) {
    gateways.push_back(
        std::make_unique<TestGateway>("server:\n  admin_listen: 127.0.0.1:0\n  threads: 2\n"
                                      "state:\n  backend: redis\n  redis:\n    url: " +
                                      redis.url() + "\n    timeout: 50ms\n" + rest));
  }
  for (auto& gateway : gateways) {
    EXPECT_TRUE(eventually([&] { return backend_up(*gateway); })) << "never connected";
  }
  return gateways;
}

HttpResponse ask(TestGateway& gateway, const std::string& body) {
  return http_request(gateway.port(), "POST", "/v1/chat/completions", body);
}

bool cooling(TestGateway& gateway, const std::string& deployment) {
  auto* state = gateway.gateway().snapshot()->router->state(deployment);
  return state != nullptr && state->cooling_down(Clock::now());
}

TEST_F(SharedState, ExactCacheHitsAcrossGatewaysAndExpiresInRedis) {
  RedisServer redis;
  auto gateways = three_on(redis,
                           "models:\n  - name: chat\n    cache: {mode: exact, ttl: 1s}\n"
                           "    deployments:\n" +
                               deployment_yaml("d1", upstream_->base_url()));
  const std::string question =
      R"({"model":"chat","temperature":0,"messages":[{"role":"user","content":"Hello?"}]})";
  auto first = ask(*gateways[0], question);
  ASSERT_EQ(first.status, 200u) << first.body;
  EXPECT_EQ(first.header("x-sluice-cache"), "miss");
  // Stored without waiting for Redis's answer: give it a moment to land.
  ASSERT_TRUE(eventually(
      [&] {
        return redis.command({"KEYS", "sluice:cache:chat:*"}).starts_with("*1");
      },
      2s));
  auto second = ask(*gateways[1], question);
  EXPECT_EQ(second.header("x-sluice-cache"), "hit");
  EXPECT_EQ(second.body, first.body);
  auto third = ask(*gateways[2], question);
  EXPECT_EQ(third.header("x-sluice-cache"), "hit");
  EXPECT_EQ(upstream_->stats().requests, 1u);

  // Redis drops the entry at its ttl: a miss on every gateway after it.
  std::this_thread::sleep_for(1200ms);
  EXPECT_EQ(redis.command({"KEYS", "sluice:cache:chat:*"}), "*0\r\n");
  EXPECT_EQ(ask(*gateways[2], question).header("x-sluice-cache"), "miss");
  EXPECT_EQ(upstream_->stats().requests, 2u);
}

TEST_F(SharedState, CooldownSpreadsWithinASecondAndOneProbeDecides) {
  mock::Behaviour failing;
  failing.fail = "500";
  auto flaky = start_mock(failing);
  RedisServer redis;
  auto gateways = three_on(redis,
                           "router:\n  cooldown: {fails: 1, within: 60s, for: 2s}\n"
                           "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
                               deployment_yaml("flaky", flaky->base_url()) +
                               deployment_yaml("healthy", upstream_->base_url()));
  const std::string question = chat_body("chat", false);
  auto failed_over = ask(*gateways[0], question);
  EXPECT_EQ(failed_over.header("x-sluice-attempts"), "2");
  ASSERT_EQ(flaky->stats().requests, 1u);
  auto cooled_at = std::chrono::steady_clock::now();

  // Every other gateway skips it within a second.
  for (int i = 1; i < 3; ++i) {
    EXPECT_TRUE(eventually([&] { return cooling(*gateways[i], "flaky"); }, 1s)) << "gateway " << i;
  }
  auto spread = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - cooled_at);
  std::printf("cooldown seen by every gateway after %lld ms\n",
              static_cast<long long>(spread.count()));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(ask(*gateways[i % 3], question).header("x-sluice-deployment"), "healthy");
  }
  EXPECT_EQ(flaky->stats().requests, 1u);

  // Traffic on all three through the end of the cooldown: one probe, which
  // fails and starts the next cooldown, and no other request reaches it.
  auto until = cooled_at + 3500ms;
  for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
    ask(*gateways[i % 3], question);
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(flaky->stats().requests, 2u);

  // Healthy again: the next probe succeeds and every gateway takes it back.
  // That waits for the running cooldown to end, a probe to be claimed and
  // sent, and the others' next poll: up to about 6 s on a loaded machine.
  // Every gateway is asked each round: the probe is claimed by whichever
  // polls first, and one that got no traffic would hold the claim until it
  // lapses.
  flaky->set_behaviour({});
  EXPECT_TRUE(eventually(
      [&] {
        bool all_take_it_back = true;
        for (auto& gateway : gateways) {
          if (ask(*gateway, question).header("x-sluice-deployment") != "flaky") {
            all_take_it_back = false;
          }
        }
        return all_take_it_back;
      },
      12s));
}

}  // namespace
}  // namespace sluice::testing

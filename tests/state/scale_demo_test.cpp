// scripts/scale-demo's topology, three sluice processes on one redis-server,
// started by the script itself on ephemeral ports: the four behaviours the
// instances share, with exact numbers.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/child_process.hpp"
#include "support/config_loading.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/redis_server.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::uint16_t port_in(const std::string& line, const std::string& after) {
  auto at = line.find(after);
  return static_cast<std::uint16_t>(std::stoi(line.substr(at + after.size())));
}

class ScaleDemo : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed (scripts/setup)";
    auto binary = built_binary("SLUICE_BINARY", "src/sluice");
    if (!binary) GTEST_SKIP() << "sluice binary not found; set SLUICE_BINARY";
    const auto build_dir = std::filesystem::path(*binary).parent_path().parent_path();
    const auto script = config::repository_root() / "scripts/scale-demo";
    redis_port_ = ephemeral_port();
    demo_ = std::make_unique<ChildProcess>("/bin/bash",
                                           std::vector<std::string>{script.string(), "--up"},
                                           std::vector<std::pair<std::string, std::string>>{
                                               {"SLUICE_BUILD_DIR", build_dir.string()},
                                               {"SCALE_BASE_PORT", "0"},
                                               {"SCALE_REDIS_PORT", std::to_string(redis_port_)}});
    ASSERT_TRUE(demo_->wait_for_stdout_line("ready", 30s)) << demo_->standard_error();
    mock_ = port_in(*demo_->wait_for_stdout_line("mock ", 1s), "127.0.0.1:");
    flaky_ = port_in(*demo_->wait_for_stdout_line("flaky ", 1s), "127.0.0.1:");
    for (int i = 1; i <= 3; ++i) {
      auto line = demo_->wait_for_stdout_line("gateway " + std::to_string(i), 1s);
      gateways_.push_back(port_in(*line, "127.0.0.1:"));
    }
  }

  void TearDown() override {
    if (!demo_) return;
    // The script stops what it started on SIGTERM.
    demo_->signal(SIGTERM);
    EXPECT_EQ(demo_->wait_exit(10s), 0) << demo_->standard_error();
  }

  unsigned upstream_requests(std::uint16_t mock) const {
    auto stats = http_request(mock, "GET", "/v1/mock/stats");
    return json::parse(stats.body)["requests"].get<unsigned>();
  }

  HttpResponse ask(std::size_t gateway, const std::string& key, const std::string& body,
                   Headers headers = {}) const {
    headers.emplace_back("Authorization", "Bearer " + key);
    return http_request(gateways_[gateway], "POST", "/v1/chat/completions", body, headers);
  }

  std::uint16_t redis_port_ = 0;
  std::unique_ptr<ChildProcess> demo_;
  std::uint16_t mock_ = 0;
  std::uint16_t flaky_ = 0;
  std::vector<std::uint16_t> gateways_;
};

TEST_F(ScaleDemo, ThreeProcessesShareLimitsCooldownsAndTheCache) {
  // 1. rpm 60 across the three: 60 admitted (and one more per second that
  // passes), not 60 each.
  const auto started = std::chrono::steady_clock::now();
  unsigned admitted = 0;
  unsigned refused = 0;
  for (std::size_t i = 0; i < 90; ++i) {
    auto response = ask(i % 3, "sk-scale-demo-key", chat_body("chat", false));
    if (response.status == 200) {
      ++admitted;
    } else {
      ASSERT_EQ(response.status, 429u) << response.body;
      ++refused;
    }
  }
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started)
          .count();
  std::printf("rpm 60 over three processes: %u admitted, %u refused in %llds\n", admitted, refused,
              static_cast<long long>(seconds));
  EXPECT_GE(admitted, 60u);
  EXPECT_LE(admitted, 60u + static_cast<unsigned>(seconds));
  EXPECT_EQ(admitted + refused, 90u);
  EXPECT_EQ(upstream_requests(mock_), admitted);

  // 2. max_parallel 2 across the three: two slow requests on two instances
  // leave none for the third.
  std::vector<std::future<HttpResponse>> slow;
  for (std::size_t i = 0; i < 2; ++i) {
    slow.push_back(std::async(std::launch::async, [this, i] {
      return ask(i, "sk-scale-demo-narrow", chat_body("chat", false), {{"x-mock-ttft-ms", "1500"}});
    }));
  }
  ASSERT_TRUE(eventually([&] { return upstream_requests(mock_) >= admitted + 2; }, 3s));
  auto third = ask(2, "sk-scale-demo-narrow", chat_body("chat", false));
  EXPECT_EQ(third.status, 429u) << third.body;
  EXPECT_NE(third.body.find("max_parallel"), std::string::npos) << third.body;
  for (auto& response : slow) EXPECT_EQ(response.get().status, 200u);
  EXPECT_EQ(ask(2, "sk-scale-demo-narrow", chat_body("chat", false)).status, 200u);

  // 3. The exact cache: stored by one instance, a hit on the other two.
  const std::string question =
      R"({"model":"cached","temperature":0,"messages":[{"role":"user","content":"Shared?"}]})";
  const unsigned before_cache = upstream_requests(mock_);
  auto first = ask(0, "sk-scale-demo-open", question);
  ASSERT_EQ(first.status, 200u) << first.body;
  EXPECT_EQ(first.header("x-sluice-cache"), "miss");
  // Stored without waiting for Redis's answer: give it a moment to land.
  ASSERT_TRUE(eventually(
      [&] {
        return redis_command(redis_port_, {"KEYS", "sluice:cache:cached:*"}).starts_with("*1");
      },
      2s));
  for (std::size_t i = 1; i < 3; ++i) {
    auto hit = ask(i, "sk-scale-demo-open", question);
    EXPECT_EQ(hit.header("x-sluice-cache"), "hit") << "gateway " << i;
    EXPECT_EQ(hit.body, first.body);
  }
  EXPECT_EQ(upstream_requests(mock_), before_cache + 1);

  // 4. A cooldown on one instance is every instance's within a second, and
  // one probe across the three decides when it ends.
  http_request(flaky_, "POST", "/v1/mock/behaviour", R"({"fail":"500"})");
  const std::string tiered = chat_body("tiered", false);
  auto failed_over = ask(0, "sk-scale-demo-open", tiered);
  EXPECT_EQ(failed_over.header("x-sluice-attempts"), "2");
  const auto cooled_at = std::chrono::steady_clock::now();
  ASSERT_EQ(upstream_requests(flaky_), 1u);
  std::this_thread::sleep_for(1s);
  for (std::size_t i = 0; i < 6; ++i) {
    auto response = ask(i % 3, "sk-scale-demo-open", tiered);
    EXPECT_EQ(response.header("x-sluice-deployment"), "healthy");
    EXPECT_EQ(response.header("x-sluice-attempts"), "1") << "gateway " << i % 3;
  }
  EXPECT_EQ(upstream_requests(flaky_), 1u);
  // Traffic on all three through the end of the 2 s cooldown: one probe,
  // which fails and starts the next one; no other request reaches it.
  for (std::size_t i = 0; std::chrono::steady_clock::now() < cooled_at + 3500ms; ++i) {
    ask(i % 3, "sk-scale-demo-open", tiered);
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(upstream_requests(flaky_), 2u);
  // Healthy again: the next probe succeeds and every instance takes it back.
  http_request(flaky_, "POST", "/v1/mock/behaviour", R"({"fail":""})");
  // Every instance is asked each round: the probe is claimed by whichever
  // polls first, and one that got no traffic would hold the claim until it
  // lapses.
  EXPECT_TRUE(eventually(
      [&] {
        bool all_take_it_back = true;
        for (std::size_t i = 0; i < 3; ++i) {
          if (ask(i, "sk-scale-demo-open", tiered).header("x-sluice-deployment") != "flaky") {
            all_take_it_back = false;
          }
        }
        return all_take_it_back;
      },
      12s));
}

}  // namespace
}  // namespace sluice::testing

// Sluice processes sharing one redis-server: a process killed while it holds
// max_parallel permits leaves them to expire at their lease's TTL.
#include <gtest/gtest.h>

#include <signal.h>

#include <future>

#include "support/child_process.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/redis_server.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kLeaseKey = "sk-lease-holder-0123456789";

std::string lease_config(const RedisServer& redis, const std::string& base_url) {
  return "server:\n  listen: 127.0.0.1:0\n  admin_listen: \"off\"\n  threads: 1\n"
         "log:\n  access_log: \"off\"\n"
         "state:\n  backend: redis\n  lease_ttl: 2s\n  redis:\n    url: " +
         redis.url() + "\n    timeout: 200ms\n" +
         "auth:\n  keys:\n    - name: holder\n      key: " + kLeaseKey +
         "\n      max_parallel: 1\n"
         "models:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("d1", base_url);
}

HttpResponse leased_chat(std::uint16_t port, Headers headers = {}) {
  headers.emplace_back("Authorization", std::string("Bearer ") + kLeaseKey);
  return http_request(port, "POST", "/v1/chat/completions", chat_body("chat", false), headers);
}

TEST(SharedProcesses, AKilledInstancesPermitsExpireAtTheLeaseTtl) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed (scripts/setup)";
  auto binary = built_binary("SLUICE_BINARY", "src/sluice");
  if (!binary) GTEST_SKIP() << "sluice binary not found; set SLUICE_BINARY";
  auto upstream = start_mock();
  RedisServer redis;
  TempFile config(lease_config(redis, upstream->base_url()), ".yaml");
  ChildProcess doomed(*binary, {"--config", config.path()});
  auto doomed_port = doomed.wait_for_listening_port("sluice listening on http://", 10s);
  ASSERT_TRUE(doomed_port) << doomed.standard_error();
  TestGateway survivor(lease_config(redis, upstream->base_url()));
  ASSERT_TRUE(eventually([&] {
    const auto* status = survivor.gateway().state_status();
    return status != nullptr && status->up();
  }));
  // The doomed process is connected once it admits through Redis.
  const std::string leases = "sluice:{key:holder}:held:1";
  ASSERT_TRUE(eventually([&] { return redis.command({"PING"}) == "+PONG\r\n"; }));

  // The doomed instance holds the key's one permit with a long request...
  auto held = std::async(std::launch::async, [port = *doomed_port] {
    return leased_chat(port, {{"x-mock-ttft-ms", "30000"}});
  });
  ASSERT_TRUE(eventually([&] { return upstream->stats().requests >= 1; }, 5s));
  ASSERT_EQ(permits_in(redis, leases), 1);
  EXPECT_EQ(leased_chat(survivor.port()).status, 429u);

  // ...and dies with it, giving nothing back.
  doomed.signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  EXPECT_EQ(doomed.wait_exit(5s), -2);
  held.wait();

  // The lease was renewed at most a third of its TTL before the kill: for
  // at least two thirds of it (1.3 s) the permit stays taken.
  std::optional<std::chrono::milliseconds> admitted_after;
  while (std::chrono::steady_clock::now() - killed_at < 4s) {
    auto response = leased_chat(survivor.port());
    auto since = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - killed_at);
    if (response.status == 200) {
      admitted_after = since;
      break;
    }
    ASSERT_EQ(response.status, 429u) << response.body;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(admitted_after) << "the dead instance's permit never expired";
  std::printf("a killed instance's permit expired %lld ms after the kill (lease_ttl 2s)\n",
              static_cast<long long>(admitted_after->count()));
  EXPECT_GE(*admitted_after, 1200ms);
  EXPECT_LE(*admitted_after, 2600ms);
  // The one admitted now holds the permit it freed, then gives it back.
  EXPECT_TRUE(eventually([&] { return permits_in(redis, leases) == 0; }, 2s));
}

}  // namespace
}  // namespace sluice::testing

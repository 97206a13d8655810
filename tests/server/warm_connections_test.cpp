// Warm upstream connections: opened at start and after a reload, before
// any request, and kept open; the mock's connection counter shows them.
#include <gtest/gtest.h>

#include <thread>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;

TEST(WarmConnections, AreOpenBeforeTheFirstRequestAndReused) {
  auto upstream = start_mock();
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 2\nmodels:\n  - name: chat\n"
      "    deployments:\n" +
      deployment_yaml("d1", upstream->base_url()));
  // One per worker thread.
  ASSERT_TRUE(eventually([&] { return upstream->stats().connections_accepted == 2; }, 2s));
  EXPECT_TRUE(eventually([&] { return gateway.idle_upstream_connections() == 2; }, 1s));
  EXPECT_EQ(upstream->stats().requests, 0u);

  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(response.status, 200u);
  EXPECT_EQ(upstream->stats().connections_accepted, 2u) << "the request used a warm connection";
  std::uint64_t reused = 0;
  for (auto& worker : gateway.gateway().workers())
    reused += worker->pool().counters().reused.load();
  EXPECT_EQ(reused, 1u);
}

TEST(WarmConnections, FollowTheConfigAcrossAReload) {
  auto first = start_mock();
  auto second = start_mock();
  auto yaml = [](const std::string& url, const std::string& extra) {
    return "server:\n  listen: 127.0.0.1:0\n  threads: 1\n  admin_listen: off\nmodels:\n"
           "  - name: chat\n    deployments:\n" +
           deployment_yaml("d1", url, extra);
  };
  TestGateway gateway(yaml(first->base_url(), "        warm_connections: 3\n"));
  ASSERT_TRUE(eventually([&] { return first->stats().connections_accepted == 3; }, 2s));

  gateway.gateway().apply(config::load_string(yaml(second->base_url(), "")));
  EXPECT_TRUE(eventually([&] { return second->stats().connections_accepted == 1; }, 2s));

  auto third = start_mock();
  gateway.gateway().apply(
      config::load_string(yaml(third->base_url(), "        warm_connections: 0\n")));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(third->stats().connections_accepted, 0u);
}

TEST(WarmConnections, AConnectionTheUpstreamClosedIsReplacedBeforeItExpires) {
  auto upstream = start_mock();
  auto port = upstream->port();
  // Sweeps every 2 s; an idle connection would expire only after 4 s.
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 1\nupstream:\n  idle_expiry: 4s\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("d1", upstream->base_url()));
  ASSERT_TRUE(eventually([&] { return upstream->stats().connections_accepted == 1; }, 2s));

  // The upstream goes away (closing its connections) and comes back.
  upstream->stop();
  mock::MockServer::Options options;
  options.port = port;
  mock::MockServer restarted(options);
  restarted.start();
  EXPECT_TRUE(eventually([&] { return restarted.stats().connections_accepted == 1; }, 3s));
  EXPECT_EQ(restarted.stats().requests, 0u);
}

}  // namespace
}  // namespace sluice::testing

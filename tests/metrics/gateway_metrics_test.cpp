#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/metrics/gateway_metrics.hpp"

namespace sluice::metrics {
namespace {

constexpr const char* kConfig = R"(
models:
  - name: gpt-4o
    fallbacks: [claude]
    deployments:
      - id: openai-1
        base_url: http://127.0.0.1:9/v1
      - id: azure-1
        base_url: http://127.0.0.1:9/v1
  - name: claude
    deployments:
      - id: anthropic-1
        base_url: http://127.0.0.1:9/v1
auth:
  keys:
    - name: team-a
      key_sha256: 2d4b9b6aa35f2d3c68b69783a70c2fb3b9f068584b497ff56566db4b46a8c94a
    - name: team-b
      key_sha256: 3d4b9b6aa35f2d3c68b69783a70c2fb3b9f068584b497ff56566db4b46a8c94a
)";

config::ConfigPtr load() {
  return config::load_string(kConfig, [](const std::string&) { return std::nullopt; });
}

TEST(SnapshotMetrics, ModelAndDeploymentHandlesComeFromTheirConfigPosition) {
  Registry registry(2);
  GatewayMetrics metrics(registry);
  const config::ConfigPtr config = load();
  SnapshotMetrics snapshot(metrics, config);
  const config::Model& gpt = config->models[0];
  const config::Model& claude = config->models[1];

  snapshot.model(gpt).retries.add(0, 2);
  snapshot.model(claude).retries.add(1);
  EXPECT_EQ(metrics.model("gpt-4o").retries.value(), 2u);
  EXPECT_EQ(metrics.model("claude").retries.value(), 1u);

  snapshot.deployment(gpt, gpt.deployments[1]).ttft.observe(0, 0.2);
  snapshot.deployment(claude, claude.deployments[0]).upstream_connect.observe(1, 0.01);
  EXPECT_EQ(metrics.deployment("gpt-4o", "azure-1").ttft.snapshot().count, 1u);
  EXPECT_EQ(metrics.deployment("gpt-4o", "openai-1").ttft.snapshot().count, 0u);
  EXPECT_EQ(metrics.deployment("claude", "anthropic-1").upstream_connect.snapshot().count, 1u);
}

TEST(SnapshotMetrics, ObjectsOfAnotherConfigStillGetTheRightSeries) {
  Registry registry(1);
  GatewayMetrics metrics(registry);
  SnapshotMetrics snapshot(metrics, load());
  const config::ConfigPtr other = load();  // same names, different addresses
  snapshot.model(other->models[1]).fallbacks.add(0);
  snapshot.deployment(other->models[0], other->models[0].deployments[0]).ttft.observe(0, 1);
  // A deployment passed with the wrong owner is resolved by name as well.
  snapshot.deployment(snapshot.config().models[1], snapshot.config().models[0].deployments[1])
      .upstream_connect.observe(0, 1);
  EXPECT_EQ(metrics.model("claude").fallbacks.value(), 1u);
  EXPECT_EQ(metrics.deployment("gpt-4o", "openai-1").ttft.snapshot().count, 1u);
  EXPECT_EQ(metrics.deployment("claude", "azure-1").upstream_connect.snapshot().count, 1u);
}

TEST(SnapshotMetrics, RequestCountersAreCachedPerWorker) {
  Registry registry(2);
  GatewayMetrics metrics(registry);
  const config::ConfigPtr config = load();
  SnapshotMetrics snapshot(metrics, config);
  const config::Model& gpt = config->models[0];
  const config::Deployment& anthropic = config->models[1].deployments[0];

  // Requested gpt-4o, answered by the fallback's deployment.
  const CounterHandle first = snapshot.requests(0, &gpt, &anthropic, 200);
  const CounterHandle again = snapshot.requests(0, &gpt, &anthropic, 200);
  first.add(0);
  again.add(0);
  snapshot.requests(1, &gpt, &anthropic, 200).add(1);
  snapshot.requests(0, &gpt, &anthropic, 429).add(0);
  snapshot.requests(0, &gpt, nullptr, 503).add(0);
  snapshot.requests(1, nullptr, nullptr, 404).add(1);
  snapshot.requests(9, &gpt, nullptr, 503).add(9);  // not a worker: resolved without the cache

  EXPECT_EQ(metrics.requests("gpt-4o", "anthropic-1", 200).value(), 3u);
  EXPECT_EQ(metrics.requests("gpt-4o", "anthropic-1", 429).value(), 1u);
  EXPECT_EQ(metrics.requests("gpt-4o", "", 503).value(), 2u);
  EXPECT_EQ(metrics.requests("", "", 404).value(), 1u);
}

TEST(SnapshotMetrics, ManyDistinctTriplesGrowTheCache) {
  Registry registry(1);
  GatewayMetrics metrics(registry);
  const config::ConfigPtr config = load();
  SnapshotMetrics snapshot(metrics, config);
  for (int round = 0; round < 3; ++round) {
    for (const config::Model& model : config->models) {
      for (const config::Model& owner : config->models) {
        for (const config::Deployment& deployment : owner.deployments) {
          for (unsigned status = 100; status < 600; status += 7) {
            snapshot.requests(0, &model, &deployment, status).add(0);
          }
        }
      }
    }
  }
  EXPECT_EQ(metrics.requests("claude", "azure-1", 499).value(), 3u);
  EXPECT_EQ(metrics.requests("gpt-4o", "anthropic-1", 100).value(), 3u);
}

TEST(SnapshotMetrics, TokenCountersByKey) {
  Registry registry(2);
  GatewayMetrics metrics(registry);
  const config::ConfigPtr config = load();
  SnapshotMetrics snapshot(metrics, config);
  ASSERT_EQ(config->auth.keys.size(), 2u);
  const config::ApiKey* team_a = &config->auth.keys[0];
  const config::ApiKey* team_b = &config->auth.keys[1];
  const config::Model& gpt = config->models[0];
  snapshot.tokens(0, gpt, team_a).prompt.add(0, 10);
  snapshot.tokens(0, gpt, team_a).completion.add(0, 20);
  snapshot.tokens(1, gpt, team_b).prompt.add(1, 5);
  snapshot.tokens(9, gpt, team_b).prompt.add(9, 1);  // not a worker: resolved without the cache
  snapshot.tokens(1, gpt, nullptr).completion.add(1, 7);  // authentication off
  EXPECT_EQ(metrics.tokens("gpt-4o", "team-a").prompt.value(), 10u);
  EXPECT_EQ(metrics.tokens("gpt-4o", "team-a").completion.value(), 20u);
  EXPECT_EQ(metrics.tokens("gpt-4o", "team-b").prompt.value(), 6u);
  EXPECT_EQ(metrics.tokens("gpt-4o", "").completion.value(), 7u);
}

TEST(SnapshotMetrics, WorkersUseTheirCachesConcurrently) {
  constexpr unsigned kWorkers = 4;
  constexpr int kRequests = 20'000;
  Registry registry(kWorkers);
  GatewayMetrics metrics(registry);
  const config::ConfigPtr config = load();
  SnapshotMetrics snapshot(metrics, config);
  std::vector<std::thread> workers;
  for (unsigned worker = 0; worker < kWorkers; ++worker) {
    workers.emplace_back([&, worker] {
      for (int i = 0; i < kRequests; ++i) {
        const config::Model& model = config->models[i % 2];
        const config::Deployment& deployment = model.deployments[0];
        snapshot.requests(worker, &model, &deployment, i % 3 == 0 ? 500u : 200u).add(worker);
        metrics.requests_in_flight.add(worker);
        metrics.requests_in_flight.sub(worker);
      }
    });
  }
  for (auto& worker : workers) worker.join();
  const std::uint64_t total = metrics.requests("gpt-4o", "openai-1", 200).value() +
                              metrics.requests("gpt-4o", "openai-1", 500).value() +
                              metrics.requests("claude", "anthropic-1", 200).value() +
                              metrics.requests("claude", "anthropic-1", 500).value();
  EXPECT_EQ(total, static_cast<std::uint64_t>(kWorkers) * kRequests);
  EXPECT_EQ(metrics.requests_in_flight.value(), 0);
}

TEST(GatewayMetrics, BudgetOverrunsCountEachStage) {
  Registry registry(1);
  GatewayMetrics metrics(registry);
  BudgetOverruns overruns;
  metrics.count_budget_overruns(0, overruns);  // nothing over: nothing counted
  overruns.insert(BudgetStage::upstream_ttfb);
  metrics.count_budget_overruns(0, overruns);
  metrics.count_budget_overruns(0, overruns);
  const std::string text = registry.render();
  EXPECT_NE(text.find("sluice_budget_exceeded_total{stage=\"upstream_ttfb\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sluice_budget_exceeded_total{stage=\"gateway\"} 0\n"), std::string::npos);
}

}  // namespace
}  // namespace sluice::metrics

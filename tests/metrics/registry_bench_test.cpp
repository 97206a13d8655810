// Hot-path costs of the metrics building blocks, printed rather than
// asserted (timings on a shared machine are too noisy to gate on). The
// figures quoted in registry.hpp come from here.

#include <gtest/gtest.h>

#include <time.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/metrics/access_log.hpp"
#include "sluice/metrics/gateway_metrics.hpp"
#include "sluice/metrics/registry.hpp"

namespace sluice::metrics {
namespace {

constexpr unsigned kThreads = 2;

// CPU time of the calling thread: on a machine shared with builds, wall time
// mostly measures how long the thread waited for a core.
double thread_cpu_ns() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

// Runs `body(worker, iterations)` on kThreads threads started together and
// returns the mean CPU nanoseconds per iteration of a thread.
double ns_per_op(std::uint64_t iterations,
                 const std::function<void(unsigned, std::uint64_t)>& body) {
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> per_thread(kThreads);
  std::vector<std::thread> threads;
  for (unsigned worker = 0; worker < kThreads; ++worker) {
    threads.emplace_back([&, worker] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      const double start = thread_cpu_ns();
      body(worker, iterations);
      per_thread[worker] = (thread_cpu_ns() - start) / static_cast<double>(iterations);
    });
  }
  while (ready.load() < kThreads) {
  }
  go.store(true);
  for (auto& thread : threads) thread.join();
  double sum = 0;
  for (double value : per_thread) sum += value;
  return sum / kThreads;
}

TEST(RegistryBenchmark, HotPathCostFromTwoThreads) {
  Registry registry(kThreads);
  auto& counters =
      registry.counter("bench_requests_total", "B.", {"model", "deployment", "status"});
  auto& histograms = registry.histogram("bench_latency_seconds", "B.", {"model"});
  const CounterHandle counter = counters.with({"gpt-4o", "openai-1", "200"});
  const HistogramHandle histogram = histograms.with({"gpt-4o"});

  const double counter_ns = ns_per_op(5'000'000, [&](unsigned worker, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) counter.add(worker);
  });
  const double histogram_ns = ns_per_op(5'000'000, [&](unsigned worker, std::uint64_t n) {
    // Values spread over the buckets, as latencies are.
    static constexpr double kValues[8] = {0.0003, 0.004, 0.02, 0.08, 0.3, 0.9, 2.2, 7.0};
    for (std::uint64_t i = 0; i < n; ++i) histogram.observe(worker, kValues[i & 7]);
  });
  const double lookup_ns = ns_per_op(200'000, [&](unsigned worker, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) counters.with({"gpt-4o", "openai-1", "200"}).add(worker);
  });

  const config::ConfigPtr config = config::load_string(
      "models:\n  - name: gpt-4o\n    deployments:\n      - id: openai-1\n"
      "        base_url: http://127.0.0.1:9\n",
      [](const std::string&) { return std::nullopt; });
  GatewayMetrics metrics(registry);
  SnapshotMetrics snapshot(metrics, config);
  const config::Model* model = &config->models[0];
  const config::Deployment* deployment = &model->deployments[0];
  const double cached_triple_ns = ns_per_op(2'000'000, [&](unsigned worker, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) {
      snapshot.requests(worker, model, deployment, i & 1 ? 200 : 429).add(worker);
    }
  });

  EXPECT_EQ(counter.value(), kThreads * 5'000'000ull + kThreads * 200'000ull);
  EXPECT_EQ(histogram.snapshot().count, kThreads * 5'000'000ull);

  std::printf(
      "metrics hot path, %u threads, CPU ns per operation per thread:\n"
      "  counter add (cached handle)                 %8.1f\n"
      "  histogram observe (cached handle)           %8.1f\n"
      "  counter add with labels looked up each time %8.1f\n"
      "  requests{model,deployment,status} via the per-worker cache + add %8.1f\n",
      kThreads, counter_ns, histogram_ns, lookup_ns, cached_triple_ns);
}

RequestRecord typical_record() {
  RequestRecord record;
  record.timestamp = std::chrono::system_clock::now();
  record.request_id = "0f8fad5b-d9cb-469f-a165-70867728950e";
  record.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  record.key_name = "team-a";
  record.model = "gpt-4o";
  record.stream = true;
  record.status = 200;
  record.deployment = "openai-1";
  record.attempts.push_back({"azure-1", "timeout", 1.25, 3.5, std::nullopt, false});
  record.attempts.push_back({"openai-1", "ok", std::nullopt, std::nullopt, 45.6, true});
  record.ttft_ms = 52.125;
  record.total_ms = 1234.5;
  record.gateway_overhead_us = 85;
  record.gap_p50_ms = 20.0;
  record.gap_max_ms = 80.25;
  record.prompt_tokens = 12;
  record.completion_tokens = 340;
  record.bytes_in = 512;
  record.bytes_out = 4096;
  record.tags = {"cache:miss"};
  return record;
}

// The same line built with nlohmann::json, as the alternative to the
// hand-written writer.
void render_with_nlohmann(const RequestRecord& record, std::string& out) {
  auto optional = [](const auto& value) -> nlohmann::json {
    if (value) return *value;
    return nullptr;
  };
  nlohmann::json attempts = nlohmann::json::array();
  for (const AttemptRecord& attempt : record.attempts) {
    attempts.push_back({{"deployment", attempt.deployment},
                        {"outcome", attempt.outcome},
                        {"connect_ms", optional(attempt.connect_ms)},
                        {"tls_ms", optional(attempt.tls_ms)},
                        {"ttfb_ms", optional(attempt.ttfb_ms)},
                        {"reused", attempt.reused}});
  }
  std::string timestamp;
  append_rfc3339_utc(timestamp, record.timestamp);
  nlohmann::json line = {
      {"ts", timestamp},
      {"request_id", record.request_id},
      {"trace_id", record.trace_id},
      {"key", record.key_name},
      {"model", record.model},
      {"routed_to", record.routed_to},
      {"shaped", record.shaped},
      {"stream", record.stream},
      {"cache", record.cache.empty() ? nlohmann::json() : nlohmann::json(record.cache)},
      {"status", record.status},
      {"deployment", record.deployment},
      {"attempts", std::move(attempts)},
      {"ttft_ms", optional(record.ttft_ms)},
      {"total_ms", record.total_ms},
      {"gateway_overhead_us", record.gateway_overhead_us},
      {"gap_p50_ms", optional(record.gap_p50_ms)},
      {"gap_max_ms", optional(record.gap_max_ms)},
      {"prompt_tokens", optional(record.prompt_tokens)},
      {"completion_tokens", optional(record.completion_tokens)},
      {"bytes_in", record.bytes_in},
      {"bytes_out", record.bytes_out},
      {"client_disconnected", record.client_disconnected},
      {"over_budget", nlohmann::json::array()},
      {"tags", record.tags}};
  out = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

TEST(RegistryBenchmark, AccessLogLineRendering) {
  const RequestRecord record = typical_record();
  constexpr int kLines = 100'000;
  std::string line;
  auto time_ns = [&](auto&& render) {
    const double start = thread_cpu_ns();
    for (int i = 0; i < kLines; ++i) {
      line.clear();
      render(record, line);
    }
    return (thread_cpu_ns() - start) / kLines;
  };
  const double handwritten_ns = time_ns(render_json_line);
  const std::size_t handwritten_size = line.size();
  const double nlohmann_ns = time_ns(render_with_nlohmann);
  const double text_ns = time_ns(render_text_line);
  // Both writers describe the same record.
  std::string ours;
  render_json_line(record, ours);
  const nlohmann::json a = nlohmann::json::parse(ours);
  std::string theirs;
  render_with_nlohmann(record, theirs);
  const nlohmann::json b = nlohmann::json::parse(theirs);
  EXPECT_EQ(a.size(), b.size());
  std::printf(
      "access log line (%zu bytes), CPU ns per line:\n"
      "  hand-written JSON %8.0f\n  nlohmann::json    %8.0f\n  logfmt text       %8.0f\n",
      handwritten_size, handwritten_ns, nlohmann_ns, text_ns);
}

}  // namespace
}  // namespace sluice::metrics

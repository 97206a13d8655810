#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/metrics/budgets.hpp"
#include "sluice/metrics/registry.hpp"

namespace sluice::metrics {

struct UpstreamConnectionCounts {
  std::uint64_t idle = 0;
  std::uint64_t active = 0;
  std::uint64_t streams = 0;  // HTTP/2 streams in flight
};

struct DeploymentCooldown {
  std::string deployment;
  bool cooling_down = false;
};

// The deadlines a deployment's attempts get now, in seconds.
struct DeploymentDeadlines {
  std::string deployment;
  double ttft = 0;
  double idle = 0;
};

struct DeploymentLimit {
  std::string deployment;
  unsigned limit = 0;
};

// What the scrape reads from the live gateway, on the scraping thread. An
// empty function reports no series.
struct GatewayMetricsSources {
  // Summed over the workers' pools.
  std::function<UpstreamConnectionCounts()> upstream_connections;
  // One entry per deployment of the current config.
  std::function<void(std::vector<DeploymentCooldown>& out)> deployment_cooldowns;
  // Deployments with an adaptive (`auto`) deadline only.
  std::function<void(std::vector<DeploymentDeadlines>& out)> deployment_deadlines;
  // Deployments with `max_parallel: auto` only.
  std::function<void(std::vector<DeploymentLimit>& out)> concurrency_limits;
  // Whether the shared state backend answers; empty with the local one.
  std::function<bool()> state_backend_up;
};

// Series labelled by a public model name.
struct ModelMetrics {
  HistogramHandle request_duration;   // sluice_request_duration_seconds
  HistogramHandle inter_token_gap;    // sluice_inter_token_gap_seconds
  CounterHandle retries;              // sluice_retries_total
  CounterHandle fallbacks;            // sluice_fallbacks_total
  CounterHandle hedges_fired;         // sluice_hedges_total{outcome="fired"}
  CounterHandle hedges_won;           // sluice_hedges_total{outcome="won"}
  CounterHandle cache_hits;           // sluice_cache_lookups_total{result="hit"}
  CounterHandle cache_semantic_hits;  // sluice_cache_lookups_total{result="semantic_hit"}
  CounterHandle cache_misses;         // sluice_cache_lookups_total{result="miss"}
};

// Series labelled by a deployment. The model label of ttft is the model the
// deployment belongs to, so there is one series per deployment.
struct DeploymentMetrics {
  HistogramHandle ttft;              // sluice_ttft_seconds{model,deployment}
  HistogramHandle upstream_connect;  // sluice_upstream_connect_seconds{deployment}
};

struct TokenMetrics {
  CounterHandle prompt;      // sluice_tokens_total{kind="prompt"}
  CounterHandle completion;  // sluice_tokens_total{kind="completion"}
};

// The sluice metric set, registered once per process in `registry`. The
// unlabelled series are ready-made handles; labelled ones are resolved with
// the functions below (a family lookup under a mutex: first use and rare
// paths only) or, per request, through SnapshotMetrics.
class GatewayMetrics {
 public:
  explicit GatewayMetrics(Registry& registry, GatewayMetricsSources sources = {});
  GatewayMetrics(const GatewayMetrics&) = delete;
  GatewayMetrics& operator=(const GatewayMetrics&) = delete;

  Registry& registry() const { return registry_; }
  unsigned shards() const { return registry_.shards(); }

  CounterHandle requests(std::string_view model, std::string_view deployment, unsigned status);
  ModelMetrics model(std::string_view model);
  DeploymentMetrics deployment(std::string_view owner_model, std::string_view deployment);
  TokenMetrics tokens(std::string_view model, std::string_view key_name);

  // sluice_quality_failures_total; resolved under the family's lock, which
  // only an answer the quality guard failed pays.
  CounterHandle quality_failures(std::string_view deployment, std::string_view reason);

  // Counts each stage in `overruns` once (sluice_budget_exceeded_total).
  void count_budget_overruns(unsigned shard, BudgetOverruns overruns) const;

  // Unlabelled series.
  HistogramHandle gateway_overhead;           // sluice_gateway_overhead_seconds
  ShardedGaugeHandle requests_in_flight;      // sluice_requests_in_flight
  CounterHandle upstream_connections_opened;  // sluice_upstream_connections_opened_total
  CounterHandle client_disconnects;           // sluice_client_disconnects_total
  CounterHandle internal_errors;              // sluice_internal_errors_total

 private:
  Registry& registry_;
  CounterFamily& requests_total_;
  HistogramFamily& request_duration_;
  HistogramFamily& ttft_;
  HistogramFamily& inter_token_gap_;
  HistogramFamily& upstream_connect_;
  CounterFamily& retries_;
  CounterFamily& fallbacks_;
  CounterFamily& hedges_;
  CounterFamily& cache_lookups_;
  CounterFamily& tokens_;
  CounterFamily& budget_exceeded_;
  CounterFamily& quality_failures_;
  std::array<CounterHandle, kBudgetStages.size()> budget_exceeded_by_stage_;
};

namespace detail {

// A small open-addressing map from up to three pointer-sized words to a
// value, owned by one worker thread: no lock, and no allocation once warm.
template <class Value>
class WordKeyCache {
 public:
  struct Key {
    const void* first = nullptr;
    const void* second = nullptr;
    std::uint64_t third = 0;
    bool operator==(const Key&) const = default;
  };

  const Value* find(const Key& key) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = hash(key) & mask();; i = (i + 1) & mask()) {
      const Slot& slot = slots_[i];
      if (!slot.used) return nullptr;
      if (slot.key == key) return &slot.value;
    }
  }

  void insert(const Key& key, const Value& value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    for (std::size_t i = hash(key) & mask();; i = (i + 1) & mask()) {
      Slot& slot = slots_[i];
      if (!slot.used) {
        slot = Slot{key, value, true};
        ++size_;
        return;
      }
      if (slot.key == key) {
        slot.value = value;
        return;
      }
    }
  }

  std::size_t size() const { return size_; }

 private:
  struct Slot {
    Key key;
    Value value;
    bool used = false;
  };

  std::size_t mask() const { return slots_.size() - 1; }

  static std::size_t hash(const Key& key) {
    // Multiplicative mixing of the three words; the top bits are the best mixed.
    std::uint64_t h = reinterpret_cast<std::uintptr_t>(key.first) * 0x9e3779b97f4a7c15ULL;
    h ^= reinterpret_cast<std::uintptr_t>(key.second) * 0xc2b2ae3d27d4eb4fULL;
    h ^= key.third * 0x165667b19e3779f9ULL;
    return static_cast<std::size_t>(h ^ (h >> 29));
  }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.used) insert(slot.key, slot.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace detail

// The label handles for one config snapshot. Build one next to each Config
// (the Snapshot that holds the config should hold this too): model and
// deployment handles are resolved up front, found by the position of the
// config object in its vector, so the per-request cost is pointer arithmetic.
//
// (model, deployment, status) and (model, client key) combinations are too many to
// resolve up front, so each worker keeps its own small hash map keyed by the
// config objects' addresses (plus the status code). Those addresses are
// stable and unique for as long as this object lives, because it keeps the
// config alive: a reload makes a new SnapshotMetrics with fresh maps, so an
// address reused by a later config can never hit a stale entry. A miss
// resolves through the family (under its mutex) once per worker.
class SnapshotMetrics {
 public:
  SnapshotMetrics(GatewayMetrics& metrics, config::ConfigPtr config);

  const config::Config& config() const { return *config_; }

  // `model` must belong to this snapshot's config; another one is resolved
  // through the family, which is slower but still correct.
  ModelMetrics model(const config::Model& model) const;
  // `owner` is the model whose deployments list holds `deployment`.
  DeploymentMetrics deployment(const config::Model& owner,
                               const config::Deployment& deployment) const;

  // sluice_requests_total for the requested model (nullptr: not a configured
  // model, labelled "") and the deployment that answered (nullptr: none).
  // `shard` must be the calling worker's index: the cache is not shared.
  CounterHandle requests(unsigned shard, const config::Model* model,
                         const config::Deployment* deployment, unsigned status);
  // sluice_tokens_total for a client key of this snapshot's config
  // (nullptr when authentication is off: labelled "").
  TokenMetrics tokens(unsigned shard, const config::Model& model, const config::ApiKey* key);
  CounterHandle quality_failures(const config::Deployment& deployment, std::string_view reason) {
    return metrics_.quality_failures(deployment.id, reason);
  }

 private:
  // Position of `model` in config.models; npos when it belongs to another config.
  std::size_t model_index(const config::Model& model) const;

  struct alignas(64) WorkerCache {
    detail::WordKeyCache<CounterHandle> requests;
    detail::WordKeyCache<TokenMetrics> tokens;
  };

  GatewayMetrics& metrics_;
  config::ConfigPtr config_;
  std::vector<ModelMetrics> models_;            // parallel to config.models
  std::vector<std::size_t> first_deployment_;   // per model, into deployments_
  std::vector<DeploymentMetrics> deployments_;  // every model's, in order
  std::vector<WorkerCache> worker_caches_;      // one per shard
};

}  // namespace sluice::metrics

#include "sluice/metrics/gateway_metrics.hpp"

#include <utility>

namespace sluice::metrics {

namespace {

std::string status_label(unsigned status) { return std::to_string(status); }

}  // namespace

GatewayMetrics::GatewayMetrics(Registry& registry, GatewayMetricsSources sources)
    : registry_(registry),
      requests_total_(registry.counter(
          "sluice_requests_total",
          "Requests answered, by public model, the deployment that answered (empty when none "
          "did) and HTTP status.",
          {"model", "deployment", "status"})),
      request_duration_(registry.histogram(
          "sluice_request_duration_seconds",
          "Time from the request head arriving to the last response byte sent, by public model.",
          {"model"})),
      ttft_(registry.histogram("sluice_ttft_seconds",
                               "Time from the request head arriving to the first response byte "
                               "sent to the client, by deployment and the model it belongs to.",
                               {"model", "deployment"})),
      inter_token_gap_(registry.histogram(
          "sluice_inter_token_gap_seconds",
          "Gaps between successive reads of a streamed response, by public model.", {"model"})),
      upstream_connect_(registry.histogram(
          "sluice_upstream_connect_seconds",
          "Time to open a new upstream connection (DNS, TCP and TLS), by deployment.",
          {"deployment"})),
      retries_(registry.counter("sluice_retries_total",
                                "Upstream attempts after the first, by public model.", {"model"})),
      fallbacks_(registry.counter("sluice_fallbacks_total",
                                  "Moves to a fallback model, by the public model asked for.",
                                  {"model"})),
      hedges_(registry.counter(
          "sluice_hedges_total",
          "Hedged attempts fired, and those that answered first (won), by public model.",
          {"model", "outcome"})),
      cache_lookups_(registry.counter(
          "sluice_cache_lookups_total",
          "Response cache lookups of models with a cache, by public model and result (hit, "
          "semantic_hit, miss); requests the cache does not apply to are not counted.",
          {"model", "result"})),
      tokens_(registry.counter(
          "sluice_tokens_total",
          "Tokens as reported by the upstream, by public model, client key and kind.",
          {"model", "key", "kind"})),
      budget_exceeded_(registry.counter("sluice_budget_exceeded_total",
                                        "Requests over a configured latency budget, by stage.",
                                        {"stage"})),
      quality_failures_(registry.counter(
          "sluice_quality_failures_total",
          "Answers that came with a success status but count as failures of their deployment "
          "(router.quality), by deployment and reason (truncated, empty, length_early, stalled, "
          "slow_tokens).",
          {"deployment", "reason"})) {
  for (BudgetStage stage : kBudgetStages) {
    budget_exceeded_by_stage_[static_cast<std::size_t>(stage)] =
        budget_exceeded_.with({to_string(stage)});
  }
  gateway_overhead = registry
                         .histogram("sluice_gateway_overhead_seconds",
                                    "Time spent inside sluice per request, not counting waits "
                                    "for upstreams and clients.")
                         .with({});
  requests_in_flight =
      registry.sharded_gauge("sluice_requests_in_flight", "Requests being handled now.");
  upstream_connections_opened =
      registry.counter("sluice_upstream_connections_opened_total", "New upstream connections.")
          .with({});
  client_disconnects = registry
                           .counter("sluice_client_disconnects_total",
                                    "Requests whose client went away before the response ended.")
                           .with({});
  internal_errors = registry
                        .counter("sluice_internal_errors_total",
                                 "Exceptions that escaped the code serving a connection or an "
                                 "upstream attempt; each ended its connection. A bug if not 0.")
                        .with({});

  // Read once per scrape, so idle and active come from the same moment.
  registry.gauge_collector(
      "sluice_upstream_connections",
      "Upstream connections in the pools, by state (an HTTP/2 connection is idle while it "
      "carries no stream).",
      {"state"}, [read = sources.upstream_connections](std::vector<GaugeSample>& out) {
        if (!read) return;
        const UpstreamConnectionCounts counts = read();
        out.push_back({{"idle"}, static_cast<double>(counts.idle)});
        out.push_back({{"active"}, static_cast<double>(counts.active)});
      });
  registry.gauge_collector(
      "sluice_upstream_streams_active", "HTTP/2 streams in flight to upstreams.", {},
      [read = std::move(sources.upstream_connections)](std::vector<GaugeSample>& out) {
        if (!read) return;
        out.push_back({{}, static_cast<double>(read().streams)});
      });
  if (sources.state_backend_up) {
    registry.gauge_collector(
        "sluice_state_backend_up",
        "1 while every worker's connection to the shared state backend (Redis) is up, else 0.", {},
        [read = std::move(sources.state_backend_up)](std::vector<GaugeSample>& out) {
          out.push_back({{}, read() ? 1.0 : 0.0});
        });
  }
  registry.gauge_collector(
      "sluice_deployment_cooldown", "1 while a deployment is cooling down after failures, else 0.",
      {"deployment"},
      [read = std::move(sources.deployment_cooldowns)](std::vector<GaugeSample>& out) {
        if (!read) return;
        std::vector<DeploymentCooldown> states;
        read(states);
        for (DeploymentCooldown& state : states) {
          out.push_back({{std::move(state.deployment)}, state.cooling_down ? 1.0 : 0.0});
        }
      });
  registry.gauge_collector(
      "sluice_deadline_seconds",
      "The first-byte (ttft) and stall (idle) deadlines a deployment's attempts get now, for "
      "deployments with an adaptive (auto) deadline.",
      {"deployment", "kind"},
      [read = std::move(sources.deployment_deadlines)](std::vector<GaugeSample>& out) {
        if (!read) return;
        std::vector<DeploymentDeadlines> deadlines;
        read(deadlines);
        for (DeploymentDeadlines& entry : deadlines) {
          out.push_back({{entry.deployment, "ttft"}, entry.ttft});
          out.push_back({{std::move(entry.deployment), "idle"}, entry.idle});
        }
      });
  registry.gauge_collector(
      "sluice_concurrency_limit",
      "The adaptive cap on a deployment's requests in flight (max_parallel: auto).", {"deployment"},
      [read = std::move(sources.concurrency_limits)](std::vector<GaugeSample>& out) {
        if (!read) return;
        std::vector<DeploymentLimit> limits;
        read(limits);
        for (DeploymentLimit& entry : limits) {
          out.push_back({{std::move(entry.deployment)}, static_cast<double>(entry.limit)});
        }
      });
}

CounterHandle GatewayMetrics::quality_failures(std::string_view deployment,
                                               std::string_view reason) {
  return quality_failures_.with({deployment, reason});
}

CounterHandle GatewayMetrics::requests(std::string_view model, std::string_view deployment,
                                       unsigned status) {
  return requests_total_.with({model, deployment, status_label(status)});
}

ModelMetrics GatewayMetrics::model(std::string_view model) {
  ModelMetrics handles;
  handles.request_duration = request_duration_.with({model});
  handles.inter_token_gap = inter_token_gap_.with({model});
  handles.retries = retries_.with({model});
  handles.fallbacks = fallbacks_.with({model});
  handles.hedges_fired = hedges_.with({model, "fired"});
  handles.hedges_won = hedges_.with({model, "won"});
  handles.cache_hits = cache_lookups_.with({model, "hit"});
  handles.cache_semantic_hits = cache_lookups_.with({model, "semantic_hit"});
  handles.cache_misses = cache_lookups_.with({model, "miss"});
  return handles;
}

DeploymentMetrics GatewayMetrics::deployment(std::string_view owner_model,
                                             std::string_view deployment) {
  DeploymentMetrics handles;
  handles.ttft = ttft_.with({owner_model, deployment});
  handles.upstream_connect = upstream_connect_.with({deployment});
  return handles;
}

TokenMetrics GatewayMetrics::tokens(std::string_view model, std::string_view key_name) {
  TokenMetrics handles;
  handles.prompt = tokens_.with({model, key_name, "prompt"});
  handles.completion = tokens_.with({model, key_name, "completion"});
  return handles;
}

void GatewayMetrics::count_budget_overruns(unsigned shard, BudgetOverruns overruns) const {
  if (overruns.empty()) return;
  for (BudgetStage stage : kBudgetStages) {
    if (overruns.contains(stage)) {
      budget_exceeded_by_stage_[static_cast<std::size_t>(stage)].add(shard);
    }
  }
}

// ---- SnapshotMetrics

SnapshotMetrics::SnapshotMetrics(GatewayMetrics& metrics, config::ConfigPtr config)
    : metrics_(metrics), config_(std::move(config)), worker_caches_(metrics.shards()) {
  models_.reserve(config_->models.size());
  first_deployment_.reserve(config_->models.size());
  for (const config::Model& model : config_->models) {
    models_.push_back(metrics_.model(model.name));
    first_deployment_.push_back(deployments_.size());
    for (const config::Deployment& deployment : model.deployments) {
      deployments_.push_back(metrics_.deployment(model.name, deployment.id));
    }
  }
}

std::size_t SnapshotMetrics::model_index(const config::Model& model) const {
  // std::less gives a total order even for pointers into other arrays.
  const std::vector<config::Model>& models = config_->models;
  if (models.empty() || std::less<>()(&model, models.data()) ||
      !std::less<>()(&model, models.data() + models.size())) {
    return static_cast<std::size_t>(-1);
  }
  return static_cast<std::size_t>(&model - models.data());
}

ModelMetrics SnapshotMetrics::model(const config::Model& model) const {
  const std::size_t index = model_index(model);
  if (index < models_.size()) return models_[index];
  return metrics_.model(model.name);
}

DeploymentMetrics SnapshotMetrics::deployment(const config::Model& owner,
                                              const config::Deployment& deployment) const {
  const std::size_t index = model_index(owner);
  if (index < models_.size()) {
    const std::vector<config::Deployment>& list = owner.deployments;
    if (!list.empty() && !std::less<>()(&deployment, list.data()) &&
        std::less<>()(&deployment, list.data() + list.size())) {
      return deployments_[first_deployment_[index] +
                          static_cast<std::size_t>(&deployment - list.data())];
    }
  }
  return metrics_.deployment(owner.name, deployment.id);
}

CounterHandle SnapshotMetrics::requests(unsigned shard, const config::Model* model,
                                        const config::Deployment* deployment, unsigned status) {
  auto resolve = [&] {
    return metrics_.requests(model ? std::string_view(model->name) : std::string_view(),
                             deployment ? std::string_view(deployment->id) : std::string_view(),
                             status);
  };
  if (shard >= worker_caches_.size()) return resolve();
  auto& cache = worker_caches_[shard].requests;
  const detail::WordKeyCache<CounterHandle>::Key key{model, deployment, status};
  if (const CounterHandle* cached = cache.find(key)) return *cached;
  const CounterHandle handle = resolve();
  cache.insert(key, handle);
  return handle;
}

TokenMetrics SnapshotMetrics::tokens(unsigned shard, const config::Model& model,
                                     const config::ApiKey* key) {
  auto resolve = [&] {
    return metrics_.tokens(model.name, key ? std::string_view(key->name) : std::string_view());
  };
  if (shard >= worker_caches_.size()) return resolve();
  auto& cache = worker_caches_[shard].tokens;
  const detail::WordKeyCache<TokenMetrics>::Key cache_key{&model, key, 0};
  if (const TokenMetrics* cached = cache.find(cache_key)) return *cached;
  const TokenMetrics handles = resolve();
  cache.insert(cache_key, handles);
  return handles;
}

}  // namespace sluice::metrics

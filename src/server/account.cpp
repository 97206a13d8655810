#include <spdlog/spdlog.h>
#include <algorithm>

#include "sluice/metrics/budgets.hpp"
#include "sluice/server/phases.hpp"

namespace sluice::server {

using namespace std::string_view_literals;

namespace {

// When the answer ended: the time relay_answer read for the router, or now
// for an answer that did not come through it.
TimePoint settle_answered_at(RequestContext& context) {
  context.answered_at = known_or_now(context.answered_at);
  return context.answered_at;
}

// Metrics and the access-log line for a finished request.
void count_and_log(RequestContext& context, bool client_gone) {
  auto& record = context.record;
  auto& metrics = *context.snapshot->metrics;
  auto& gateway_metrics = context.worker.gateway().metrics();
  auto shard = context.worker.index();
  auto total = settle_answered_at(context) - context.head_started;
  record.total_ms = to_ms(total);
  record.gateway_overhead_us = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(context.gateway_time).count());
  record.stream = context.stream;
  record.client_disconnected = client_gone;
  record.bytes_in = context.request.body().size();
  if (context.key) record.key_name = context.key->name;
  if (auto p50 = context.gaps.p50()) record.gap_p50_ms = to_ms(*p50);
  if (auto max = context.gaps.max()) record.gap_max_ms = to_ms(*max);
  if (context.usage) {
    record.prompt_tokens = context.usage->prompt_tokens;
    record.completion_tokens = context.usage->completion_tokens;
  }

  for (const auto& attempt : record.attempts) {
    if (attempt.connect_ms) gateway_metrics.upstream_connections_opened.add(shard);
  }
  gateway_metrics.gateway_overhead.observe(
      shard, std::chrono::duration<double>(context.gateway_time).count());
  if (client_gone) gateway_metrics.client_disconnects.add(shard);
  if (context.model) {
    metrics.requests(shard, context.model, context.answered, record.status).add(shard);
    auto model_metrics = metrics.model(*context.model);
    model_metrics.request_duration.observe(shard, std::chrono::duration<double>(total).count());
    unsigned hedges = 0;
    for (const auto& attempt : record.attempts) hedges += attempt.outcome == "lost_hedge"sv;
    if (context.attempts > 1 + hedges)
      model_metrics.retries.add(shard, context.attempts - 1 - hedges);
    if (context.answered) {
      const auto& deployments = context.model->deployments;
      const bool from_fallback =
          std::none_of(deployments.begin(), deployments.end(),
                       [&](const auto& deployment) { return &deployment == context.answered; });
      if (from_fallback) model_metrics.fallbacks.add(shard);
    }
    if (record.cache == "hit"sv) {
      model_metrics.cache_hits.add(shard);
    } else if (record.cache == "semantic_hit"sv) {
      model_metrics.cache_semantic_hits.add(shard);
    } else if (record.cache == "miss"sv) {
      model_metrics.cache_misses.add(shard);
    }
    const bool hedge_won =
        std::find(record.tags.begin(), record.tags.end(), "hedge:won"sv) != record.tags.end();
    if (hedge_won) model_metrics.hedges_won.add(shard);
    if (hedges > 0 || hedge_won) model_metrics.hedges_fired.add(shard);
    if (context.answered && context.upstream_ttfb) {
      for (const auto& owner : context.snapshot->config->models) {
        if (context.answered < owner.deployments.data() ||
            context.answered >= owner.deployments.data() + owner.deployments.size()) {
          continue;
        }
        auto deployment_metrics = metrics.deployment(owner, *context.answered);
        deployment_metrics.ttft.observe(
            shard, std::chrono::duration<double>(*context.upstream_ttfb).count());
        if (context.upstream_connect) {
          deployment_metrics.upstream_connect.observe(
              shard, std::chrono::duration<double>(*context.upstream_connect).count());
        }
      }
    }
    if (context.usage) {
      const config::ApiKey* key = nullptr;
      for (const auto& candidate : context.snapshot->config->auth.keys) {
        if (context.key && candidate.name == context.key->name) key = &candidate;
      }
      auto tokens = metrics.tokens(shard, *context.model, key);
      tokens.prompt.add(shard, context.usage->prompt_tokens);
      tokens.completion.add(shard, context.usage->completion_tokens);
    }
  } else {
    metrics.requests(shard, nullptr, nullptr, record.status).add(shard);
  }

  const auto& budgets = context.snapshot->config->budgets;
  metrics::StageDurations measured{context.gateway_time, context.upstream_ttfb, total};
  record.over_budget =
      metrics::over_budget({budgets.gateway, budgets.upstream_ttfb, budgets.total}, measured);
  if (!record.over_budget.empty()) {
    gateway_metrics.count_budget_overruns(shard, record.over_budget);
    spdlog::warn(
        "request {} over its latency budget: gateway {:.3f} ms, upstream ttfb {} ms, "
        "total {:.3f} ms",
        context.request_id, to_ms(context.gateway_time),
        context.upstream_ttfb ? std::to_string(to_ms(*context.upstream_ttfb)) : "-", to_ms(total));
  }
  auto& access_log = context.worker.gateway().access_log();
  if (!access_log.enabled()) return;
  // Only the log line shows them: copied and formatted only for it. The wall
  // clock is read here, a few microseconds after the answer ended, rather
  // than when the head arrived: without a log, no request reads it.
  record.timestamp = std::chrono::system_clock::now() -
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(total);
  record.request_id = context.request_id;
  record.trace_id = context.trace.trace_id_hex();
  access_log.write(record);
}

// What a request spent upstream, to settle its reservation with. Without
// an answer, every attempt failed before its first byte: nothing, unless the
// client left while they ran. With one, what the upstream reported (nullopt,
// when it reported nothing, keeps the estimate).
std::optional<std::uint64_t> tokens_spent(const RequestContext& context, const RequestJob& job) {
  switch (job.answered_by) {
    case AnsweredBy::gateway:
      return std::nullopt;
    case AnsweredBy::cache:
      return 0;
    case AnsweredBy::upstream:
      break;
  }
  if (context.answered == nullptr && !context.client_gone) return 0;
  return context.usage_tokens;
}

}  // namespace

void account(RequestContext& context, RequestJob& job, bool keep) {
  // Settled before anything else: the client may already be sending its
  // next request.
  const auto spent = tokens_spent(context, job);
  if (job.shared_admitted) settle_shared_limits(context, job, spent);
  context.snapshot->auth->complete(job.admission, spent, settle_answered_at(context));
  count_and_log(context, !keep && context.client_gone);
}

}  // namespace sluice::server

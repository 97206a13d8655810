#include <array>
#include <string>

#include "sluice/auth/limits.hpp"
#include "sluice/common/gcra.hpp"
#include "sluice/server/gateway.hpp"
#include "sluice/server/phases.hpp"
#include "sluice/state/limit_scripts.hpp"

namespace sluice::server {

namespace net = boost::asio;

namespace {

std::optional<auth::SharedVerdict> verdict_of(const std::optional<AdmitAnswer>& answer) {
  if (!answer) return std::nullopt;
  auth::SharedVerdict verdict;
  switch (answer->refused) {
    case 0:
      verdict.refused = auth::SharedVerdict::Refused::none;
      break;
    case 1:
      verdict.refused = auth::SharedVerdict::Refused::max_parallel;
      break;
    case 2:
      verdict.refused = auth::SharedVerdict::Refused::rpm;
      break;
    case 3:
      verdict.refused = auth::SharedVerdict::Refused::tpm;
      break;
    default:
      return std::nullopt;
  }
  verdict.rpm_owed_ns = answer->rpm_owed_ns;
  verdict.tpm_owed_ns = answer->tpm_owed_ns;
  return verdict;
}

SharedBudget shared_budget(const config::State& settings, const std::string& tag, std::uint64_t rpm,
                           std::uint64_t tpm, unsigned max_parallel) {
  const std::string prefix = state::tagged_key(settings.redis.key_prefix, tag, ":");
  const GcraRate requests(rpm);
  return {prefix + "rpm:" + std::to_string(rpm),
          prefix + "tpm:" + std::to_string(tpm),
          prefix + "held:" + std::to_string(max_parallel),
          std::to_string(requests.interval_ns),
          std::to_string(requests.window_ns),
          std::to_string(max_parallel),
          std::to_string(settings.lease_ttl.count())};
}

}  // namespace

SharedBudget shared_key_budget(const config::State& settings, const auth::KeyPolicy& key) {
  return shared_budget(settings, "key:" + key.name, key.limits.rpm, key.limits.tpm,
                       key.limits.max_parallel);
}

SharedBudget shared_deployment_budget(const config::State& settings,
                                      const config::Deployment& deployment) {
  // `max_parallel: auto` follows each instance's own latencies: not shared.
  return shared_budget(settings, "dep:" + deployment.id, deployment.rpm, 0,
                       deployment.max_parallel_auto ? 0 : deployment.max_parallel);
}

net::awaitable<Next> take_shared_limits(RequestContext& context, RequestJob& job, Next next) {
  const auth::AuthStage& stage = *context.snapshot->auth;
  auth::Admission& admission = job.admission;
  const auth::KeyPolicy& key = *admission.key;
  const config::ApiKeyLimits& limits = key.limits;
  WorkerState* shared = context.worker.shared_state();

  std::optional<auth::SharedVerdict> verdict;
  if (limits.rpm == 0 && limits.tpm == 0 && limits.max_parallel == 0) {
    verdict.emplace();  // nothing to count, anywhere
  } else if (shared != nullptr && shared->redis().up()) {
    const SharedBudget& budget = context.snapshot->key_budget(key);
    const auth::KeyLimits* live = stage.limiters().find(key.name);
    const std::uint64_t estimate = admission.reserved_tokens();
    const std::string cost =
        std::to_string(limits.tpm > 0 && estimate > 0 ? live->tokens.cost_ns(estimate) : 0);
    const bool tpm_limited = limits.tpm > 0;
    auto answer = co_await shared->admit(budget, context.snapshot, tpm_limited, cost);
    verdict = verdict_of(answer);
    if (answer) job.shared_lease = std::move(answer->permit);
  }

  if (verdict) {
    stage.conclude_shared(admission, *verdict);
    job.shared_admitted = admission.allowed();
  } else if (shared != nullptr &&
             shared->settings().on_unavailable == config::State::OnUnavailable::deny) {
    co_return job.refuse(ApiError::overloaded(
        "The gateway's shared rate limits are unavailable. Please try again shortly."));
  } else {
    stage.take_local_limits(admission, context.body_read);
  }
  admission.append_headers(context.response_fields);
  if (!admission.allowed()) co_return job.refuse(*admission.error);
  co_return next;
}

net::awaitable<SharedDeploymentVerdict> take_shared_deployment_limits(
    WorkerState& shared, const SharedBudget& budget,
    const std::shared_ptr<const Snapshot>& keep_alive, std::unique_ptr<SharedLease>& lease) {
  if (!shared.redis().up()) co_return SharedDeploymentVerdict::unavailable;
  // No tpm here: the budget's tpm key is never read.
  auto answer = co_await shared.admit(budget, keep_alive, false, "0");
  auto verdict = verdict_of(answer);
  if (!verdict) co_return SharedDeploymentVerdict::unavailable;
  if (verdict->refused != auth::SharedVerdict::Refused::none) {
    co_return SharedDeploymentVerdict::at_limit;
  }
  lease = std::move(answer->permit);
  co_return SharedDeploymentVerdict::admitted;
}

void settle_shared_limits(RequestContext& context, RequestJob& job,
                          std::optional<std::uint64_t> tokens_spent) {
  WorkerState* shared = context.worker.shared_state();
  if (shared == nullptr) return;
  job.shared_admitted = false;
  SharedLease* lease =
      job.shared_lease && job.shared_lease->held() ? job.shared_lease.get() : nullptr;
  const auth::Admission& admission = job.admission;
  const auth::KeyPolicy& key = *admission.key;
  const std::uint64_t reserved = admission.reserved_tokens();
  // An estimate that was right leaves nothing to settle.
  std::int64_t delta = 0;
  if (key.limits.tpm > 0 && tokens_spent && *tokens_spent != reserved) {
    const auth::KeyLimits* live = context.snapshot->auth->limiters().find(key.name);
    // Difference of the two costs, as TokenBucket::settle charges it.
    delta = live->tokens.cost_ns(*tokens_spent) - live->tokens.cost_ns(reserved);
  }
  if (delta == 0 && lease == nullptr) return;
  shared->settle(context.snapshot->key_budget(key), context.snapshot, delta, lease);
}

}  // namespace sluice::server

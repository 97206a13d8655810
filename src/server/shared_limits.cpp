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

// The most a key's tokens may owe in Redis: 2^52 ns (about 52 days), where
// the scripts' doubles are still exact. The local bucket's cap is a year,
// which no sane budget reaches either.
constexpr std::int64_t kMostSharedDebtNs = std::int64_t{1} << 52;

std::optional<auth::SharedVerdict> verdict_of(const std::optional<state::Reply>& reply) {
  if (!reply || reply->type != state::Reply::Type::array || reply->elements.size() != 3) {
    return std::nullopt;
  }
  for (const auto& element : reply->elements) {
    if (element.type != state::Reply::Type::integer) return std::nullopt;
  }
  auth::SharedVerdict verdict;
  switch (reply->elements[0].integer) {
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
  verdict.rpm_owed_ns = reply->elements[1].integer;
  verdict.tpm_owed_ns = reply->elements[2].integer;
  return verdict;
}

SharedBudget shared_budget(const config::State& settings, const std::string& tag,
                           std::uint64_t rpm, std::uint64_t tpm, unsigned max_parallel) {
  const std::string prefix = state::tagged_key(settings.redis.key_prefix, tag, ":");
  const GcraRate requests(rpm);
  return {prefix + "rpm:" + std::to_string(rpm),
          prefix + "tpm:" + std::to_string(tpm),
          prefix + "par:" + std::to_string(max_parallel),
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
    std::string lease_id = limits.max_parallel > 0 ? shared->next_lease_id() : std::string();
    const std::string cost =
        std::to_string(limits.tpm > 0 && estimate > 0 ? live->tokens.cost_ns(estimate) : 0);
    std::array<std::string_view, 3> key_views{budget.rpm_key, budget.tpm_key, budget.parallel_key};
    std::array<std::string_view, 7> arg_views{budget.interval_ns, budget.window_ns,
                                              limits.tpm > 0 ? "1" : "0", cost,
                                              budget.max_parallel, lease_id, budget.lease_ttl_ms};
    auto reply = co_await shared->redis().eval(state::admit_script(), key_views, arg_views);
    verdict = verdict_of(reply);
    if (verdict && verdict->refused == auth::SharedVerdict::Refused::none &&
        limits.max_parallel > 0) {
      job.shared_lease = std::make_unique<SharedLease>();
      job.shared_lease->set = budget.parallel_key;
      job.shared_lease->id = std::move(lease_id);
      shared->hold(*job.shared_lease);
    }
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
    WorkerState& shared, const config::Deployment& deployment, const SharedBudget& budget,
    std::unique_ptr<SharedLease>& lease) {
  if (!shared.redis().up()) co_return SharedDeploymentVerdict::unavailable;
  const bool leased = deployment.max_parallel > 0 && !deployment.max_parallel_auto;
  std::string lease_id = leased ? shared.next_lease_id() : std::string();
  // No tpm here: the script's tpm key is never read, the rpm key stands in.
  std::array<std::string_view, 3> key_views{budget.rpm_key, budget.rpm_key, budget.parallel_key};
  std::array<std::string_view, 7> arg_views{budget.interval_ns, budget.window_ns, "0", "0",
                                            budget.max_parallel, lease_id, budget.lease_ttl_ms};
  auto reply = co_await shared.redis().eval(state::admit_script(), key_views, arg_views);
  auto verdict = verdict_of(reply);
  if (!verdict) co_return SharedDeploymentVerdict::unavailable;
  if (verdict->refused != auth::SharedVerdict::Refused::none) {
    co_return SharedDeploymentVerdict::at_limit;
  }
  if (leased) {
    lease = std::make_unique<SharedLease>();
    lease->set = budget.parallel_key;
    lease->id = std::move(lease_id);
    shared.hold(*lease);
  }
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
  if (key.limits.tpm == 0 || !tokens_spent || *tokens_spent == reserved) {
    if (lease != nullptr) shared->release(*lease);
    return;
  }
  const auth::KeyLimits* live = context.snapshot->auth->limiters().find(key.name);
  // Difference of the two costs, as TokenBucket::settle charges it.
  const std::int64_t delta = live->tokens.cost_ns(*tokens_spent) - live->tokens.cost_ns(reserved);
  const std::string& tpm_key = context.snapshot->key_budget(key).tpm_key;
  std::array<std::string, 2> args{std::to_string(delta), std::to_string(kMostSharedDebtNs)};
  if (lease == nullptr) {
    std::array<std::string_view, 1> keys{tpm_key};
    std::array<std::string_view, 2> arg_views{args[0], args[1]};
    shared->redis().send_eval(state::settle_script(), keys, arg_views);
    return;
  }
  // Settled and released in one call: Redis, one thread for every
  // instance, runs one script instead of a script and a command.
  std::array<std::string_view, 2> keys{tpm_key, lease->set};
  std::array<std::string_view, 3> arg_views{args[0], args[1], lease->id};
  shared->redis().send_eval(state::settle_and_release_script(), keys, arg_views);
  shared->forget(*lease);
}

}  // namespace sluice::server

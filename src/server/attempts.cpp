#include "sluice/server/attempts.hpp"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "sluice/http/http_head.hpp"
#include "sluice/router/adaptive.hpp"
#include "sluice/server/internal_errors.hpp"

namespace sluice::server {

namespace net = boost::asio;
using net::as_tuple;
using net::use_awaitable;
using namespace std::chrono_literals;

net::awaitable<bool> read_body_into(upstream::Exchange& exchange, std::vector<char>& buffer,
                                    std::size_t limit, std::string& body) {
  while (body.size() < limit) {
    auto read = exchange.read_buffered_body(buffer.data(), buffer.size());
    if (!read) read = co_await exchange.read_body(buffer.data(), buffer.size());
    if (!read->ok()) co_return false;
    if (read->value() == 0) co_return true;
    body.append(buffer.data(), read->value());
  }
  co_return exchange.finished();
}

namespace {

constexpr std::size_t kMaxErrorBody = std::size_t{256} * 1024;

// Reads a (small) error body whole, so it can be classified and, when it is
// returned to the client, sent with a Content-Length.
net::awaitable<std::string> read_error_body(upstream::Exchange& exchange,
                                            std::vector<char>& buffer) {
  std::string body;
  co_await read_body_into(exchange, buffer, kMaxErrorBody, body);
  co_return body;
}

// An upstream's error body may quote the key it was sent; it never reaches
// the client.
void redact(std::string& text, const std::string& secret) {
  if (secret.size() < 4) return;
  for (auto pos = text.find(secret); pos != std::string::npos; pos = text.find(secret, pos)) {
    text.replace(pos, secret.size(), "***");
    pos += 3;
  }
}

// Ends an attempt's coroutine however its frame goes: an orphaned task is
// deleted here, and a frame destroyed unfinished (the event loop shut down
// first) leaves nothing running for the race to wait for.
class AttemptCoroutineEnd {
 public:
  AttemptCoroutineEnd(Worker& worker, AttemptTask& task) : worker_(worker), task_(task) {}
  ~AttemptCoroutineEnd() {
    if (!task_.orphaned) {
      task_.running = false;
      return;
    }
    // The request it was for is gone, so nobody else will report it.
    if (task_.escaped) report_internal_error(worker_, "an upstream attempt", task_.escaped);
    delete &task_;
  }
  AttemptCoroutineEnd(const AttemptCoroutineEnd&) = delete;
  AttemptCoroutineEnd& operator=(const AttemptCoroutineEnd&) = delete;

 private:
  Worker& worker_;
  AttemptTask& task_;
};

// Whether an attempt that takes its deployment's shared limits itself (a
// hedge) may start: false when the limits refuse it, or the race is over.
net::awaitable<bool> admitted_by_shared_limits(Worker& worker, AttemptTask& task,
                                               std::shared_ptr<const Snapshot> snapshot) {
  WorkerState& shared = *worker.shared_state();
  const SharedDeploymentVerdict verdict = co_await take_shared_deployment_limits(
      shared, task.wiring->shared_budget, snapshot, task.shared_lease);
  if (verdict == SharedDeploymentVerdict::at_limit ||
      (verdict == SharedDeploymentVerdict::unavailable &&
       shared.settings().on_unavailable == config::State::OnUnavailable::deny)) {
    task.refused_by_shared_limits = true;
    co_return false;
  }
  co_return !task.abort_handle.aborted();
}

net::awaitable<void> run_attempt(Worker& worker, const upstream::Origin& origin, AttemptTask& task,
                                 net::steady_timer& wakeup,
                                 std::shared_ptr<const Snapshot> snapshot) {
  const AttemptCoroutineEnd end(worker, task);
  try {
    if (task.attempt.hedge) inject_fault(FaultPoint::hedge_attempt);
    bool starts = true;
    if (task.takes_shared_limits)
      starts = co_await admitted_by_shared_limits(worker, task, snapshot);
    if (starts) {
      task.result.emplace(co_await worker.transport(*task.wiring)
                              .start(origin, task.request, task.limits, task.abort_handle));
    }
  } catch (...) {
    task.escaped = std::current_exception();
  }
  if (task.orphaned) co_return;
  task.running = false;
  wakeup.cancel();
}

// The client's fields for `deployment`: a header the deployment configures
// replaces the client's of the same name, which would otherwise go first
// and be the one most upstreams read.
std::string_view client_fields_for(const config::Deployment& deployment,
                                   std::string_view client_fields, std::string& kept) {
  if (deployment.headers.empty()) return client_fields;
  return lines_without(client_fields, kept, [&](std::string_view name) {
    return std::any_of(deployment.headers.begin(), deployment.headers.end(),
                       [&](const auto& header) { return iequals(header.first, name); });
  });
}

// Fills in the request `task` sends to the attempt's deployment; the
// attempt starts `now`, the time the plan chose it at.
void prepare_attempt(const RequestContext& context, const ForwardedRequest& inputs,
                     AttemptTask& task, const router::Attempt& attempt, TimePoint now) {
  const auto& deployment = *attempt.deployment;
  task.attempt = attempt;
  task.wiring = &context.snapshot->wiring(deployment);
  task.request =
      upstream::Request{"POST",
                        {deployment.base_url.path_prefix, inputs.endpoint, inputs.query},
                        {client_fields_for(deployment, inputs.client_fields, task.client_fields),
                         inputs.gateway_fields, task.wiring->fields},
                        {inputs.body_prefix,
                         inputs.form_data ? std::string_view(deployment.upstream_model)
                                          : std::string_view(task.wiring->model_literal),
                         inputs.body_suffix, inputs.body_addition, inputs.body_closing}};
  task.limits = upstream::Limits{deployment.timeouts.connect, deployment.timeouts.ttft,
                                 deployment.timeouts.idle, now + deployment.timeouts.total, now};
  if (deployment.timeouts.adaptive()) {
    const auto deadlines =
        router::current_deadlines(deployment, context.snapshot->config->router.adaptive,
                                  *attempt.state, now, attempt.prompt_class);
    task.limits.ttft = deadlines.ttft;
    task.limits.idle = deadlines.idle;
  }
  task.client_dialect = inputs.dialect;
  const auto& adapter = *task.wiring->adapter;
  if (!adapter.passes_through(inputs.dialect)) {
    if (auto refusal = adapter.adapt_request(task.request, task.adapted)) {
      task.refused_by_adapter = std::make_unique<ApiError>(std::move(*refusal));
    }
  }
}

void launch(RequestContext& context, const ForwardedRequest& inputs, AttemptTask& task,
            const router::Attempt& attempt, TimePoint now, stream::ClientWatch* watch,
            net::steady_timer& wakeup) {
  prepare_attempt(context, inputs, task, attempt, now);
  if (task.refused_by_adapter) return;
  task.running = true;
  if (watch) watch->watch(&task.abort_handle);
  // The snapshot the request holds keeps the origin alive for the attempt.
  // What the attempt throws goes to the request that raced it (run_attempt);
  // the barrier stands for anything else.
  // Only an attempt that will wait for Redis needs the snapshot beyond the
  // request's own hold on it.
  std::shared_ptr<const Snapshot> keep_alive;
  if (task.takes_shared_limits) keep_alive = context.snapshot;
  net::co_spawn(
      context.client.get_executor(),
      run_attempt(context.worker, task.wiring->origin, task, wakeup, std::move(keep_alive)),
      InternalErrorBarrier(context.worker, "an upstream attempt"));
}

metrics::AttemptRecord attempt_record(const config::Deployment& deployment,
                                      const upstream::Exchange& exchange, std::string outcome) {
  const auto& timing = exchange.timing();
  std::optional<double> connect_ms, tls_ms;
  if (!timing.reused) {
    connect_ms = to_ms(timing.connected - timing.started);
    if (timing.secured > timing.connected) tls_ms = to_ms(timing.secured - timing.connected);
  }
  return {
      deployment.id, std::move(outcome), connect_ms, tls_ms, to_ms(timing.first_byte - timing.sent),
      timing.reused};
}

// Classifies a finished attempt that produced no usable head and reports it
// to the plan; `failed` is what it left. (Filled in place: an awaited result
// would take a second slot in the caller's frame.)
net::awaitable<void> settle_failure(RequestContext& context, router::Plan& plan,
                                    AttemptTally& tally, AttemptTask& task, FailedAttempt& failed) {
  inject_fault(FaultPoint::attempt_failed);
  failed = {};
  const auto& deployment = *task.attempt.deployment;
  tally.deployment_id = deployment.id;
  if (task.refused_by_adapter) {
    // The request is one this deployment's protocol cannot carry: no fault
    // of the deployment's, and no other attempt would fare better with it.
    tally.records.push_back(
        {deployment.id, "refused_by_adapter", std::nullopt, std::nullopt, std::nullopt, false});
    plan.abandon(task.attempt);
    failed.kind = router::ResultKind::client_error;
    failed.gateway_error = std::move(*task.refused_by_adapter);
    co_return;
  }
  auto& result = *task.result;
  if (!result) {
    const auto& error = result.error();
    tally.records.push_back(
        {deployment.id, to_string(error.failure), std::nullopt, std::nullopt, std::nullopt, false});
    spdlog::debug("request {}: deployment {} failed: {}", context.request_id, deployment.id,
                  error.describe());
    router::AttemptResult failure{router::ResultKind::retriable, error.is_timeout(), std::nullopt,
                                  std::nullopt, std::nullopt};
    // A first byte that never came took at least the deadline: without that
    // sample the deadline would sink on its own timeouts.
    if (error.failure == upstream::Failure::first_byte_timeout && deployment.timeouts.ttft_auto) {
      failure.censored_ttft = task.limits.ttft;
    }
    plan.report(task.attempt, failure, Clock::now());
    std::string message = "Upstream deployment " + deployment.id + " failed: " + error.describe();
    failed.gateway_error = error.is_timeout() ? ApiError::upstream_timeout(std::move(message))
                                              : ApiError::upstream_unreachable(std::move(message));
    co_return;
  }
  auto& exchange = *result.value();
  failed.status = exchange.status();
  tally.records.push_back(
      attempt_record(deployment, exchange, "http_" + std::to_string(failed.status)));
  failed.body = co_await read_error_body(exchange, context.relay_buffers.copy_buffer());
  redact(failed.body, deployment.api_key);
  auto content_type = exchange.content_type();
  failed.content_type = content_type.empty() ? "application/json" : std::string(content_type);
  // Classified in the upstream's own words (a context-window error is told
  // by them), before they are translated.
  failed.kind = router::classify_status(failed.status, failed.body);
  // An upstream of another protocol words its errors its own way: the client
  // gets them in its endpoint's shape, with the same status.
  if (const auto& adapter = *task.wiring->adapter; !adapter.passes_through(task.client_dialect)) {
    if (auto translator = adapter.translate_answer(task.client_dialect)) {
      std::string translated;
      translator->status(failed.status);  // the body's meaning may hang on it
      translator->body(failed.body, translated);
      failed.body = std::move(translated);
      failed.content_type = translator->content_type(failed.content_type);
    }
  }
  failed.retry_after = exchange.retry_after();
  auto ttft = std::chrono::duration_cast<router::Micros>(exchange.timing().first_byte -
                                                         exchange.timing().sent);
  plan.report(task.attempt, {failed.kind, false, ttft, failed.retry_after, std::nullopt},
              Clock::now());
  spdlog::debug("request {}: deployment {} answered {}", context.request_id, deployment.id,
                failed.status);
}

// Launches the plan's hedge into `slot`, if it has one now.
void launch_hedge(RequestContext& context, const AttemptsCall& call,
                  std::unique_ptr<AttemptTask>& slot, net::steady_timer& wakeup) {
  const auto now = Clock::now();
  auto hedge = call.plan.next_hedge(now);
  if (!hedge) return;
  inject_fault(FaultPoint::hedge_launched);
  ++call.tally.count;
  slot = std::make_unique<AttemptTask>();
  slot->takes_shared_limits =
      context.worker.shared_state() != nullptr && has_shared_limits(*hedge->deployment);
  launch(context, call.request, *slot, *hedge, now, call.watch, wakeup);
}

// The primary attempt and at most one hedge, racing for the first byte; a
// slot is filled when its attempt is launched. The helpers below keep their
// loops out of run_attempts's frame, where every local of a coroutine takes
// a slot of its own.
class Race {
 public:
  Race(RequestContext& context, stream::ClientWatch* watch) : context_(context), watch_(watch) {}
  // A race is over before it ends, unless an exception unwinds it: then an
  // attempt still running is stopped and left to its coroutine, which
  // still uses it.
  ~Race() {
    for (auto& task : tasks_) {
      if (!task || !task->running) continue;
      if (watch_) watch_->unwatch(&task->abort_handle);
      task->abort_handle.abort();
      task->orphan_snapshot = context_.snapshot;
      task->orphaned = true;
      static_cast<void>(task.release());
    }
  }
  Race(const Race&) = delete;
  Race& operator=(const Race&) = delete;

  std::unique_ptr<AttemptTask>& operator[](std::size_t i) { return tasks_[i]; }
  auto begin() { return tasks_.begin(); }
  auto end() { return tasks_.end(); }
  auto begin() const { return tasks_.begin(); }
  auto end() const { return tasks_.end(); }
  static constexpr std::size_t size() { return 2; }

 private:
  std::array<std::unique_ptr<AttemptTask>, 2> tasks_;
  RequestContext& context_;
  stream::ClientWatch* watch_;
};

bool any_running(const Race& tasks) {
  return std::any_of(tasks.begin(), tasks.end(),
                     [](const auto& task) { return task && task->running; });
}

AttemptTask* finished_with_usable_head(const Race& tasks) {
  for (const auto& task : tasks) {
    if (task && !task->running && task->has_usable_head()) return task.get();
  }
  return nullptr;
}

// What an attempt's coroutine threw, if one did.
std::exception_ptr escaped(const Race& tasks) {
  for (const auto& task : tasks) {
    if (task && task->escaped) return task->escaped;
  }
  return nullptr;
}

void stop_losers(Race& tasks, const AttemptTask* winner) {
  for (auto& task : tasks) {
    if (task && task.get() != winner && task->running) {
      task->stopped = Clock::now();
      task->abort_handle.abort();
    }
  }
}

void abandon_all(Race& tasks, router::Plan& plan) {
  for (auto& task : tasks) {
    if (task) plan.abandon(task->attempt);
  }
}

// Reports the winner to the plan and the access log, and takes it out of the
// race.
std::unique_ptr<AttemptTask> take_winner(router::Plan& plan, AttemptTally& tally, Race& tasks,
                                         AttemptTask* winner) {
  const auto& exchange = *winner->result->value();
  const auto& deployment = *winner->attempt.deployment;
  tally.deployment_id = deployment.id;
  auto ttft = std::chrono::duration_cast<router::Micros>(exchange.timing().first_byte -
                                                         exchange.timing().sent);
  plan.report(winner->attempt,
              {router::ResultKind::success, false, ttft, std::nullopt, std::nullopt},
              exchange.timing().first_byte);
  tally.answered = &deployment;
  tally.records.push_back(attempt_record(deployment, exchange, "ok"));
  if (plan.diagnosing() && !exchange.timing().reused) {
    const auto& timing = exchange.timing();
    plan.note_new_connection(
        winner->attempt,
        std::chrono::duration_cast<router::Micros>(timing.connected - timing.started),
        std::chrono::duration_cast<router::Micros>(timing.secured - timing.connected),
        timing.first_byte);
  }
  for (const auto& task : tasks) {
    if (task && task.get() != winner && task->abort_handle.aborted()) {
      tally.records.push_back({task->attempt.deployment->id, "lost_hedge", std::nullopt,
                               std::nullopt, std::nullopt, false});
    }
  }
  tally.hedge_won = winner->attempt.hedge;
  auto& slot = tasks[0].get() == winner ? tasks[0] : tasks[1];
  // The request went out with the head, and its fields point into
  // the caller's storage: nothing may read them once the winner leaves.
  slot->request = {};
  return std::move(slot);
}

bool client_gone(const stream::ClientWatch* watch) { return watch && watch->client_gone(); }

}  // namespace

net::awaitable<AttemptsOutcome> run_attempts(RequestContext& context, AttemptsCall call) {
  auto& plan = call.plan;
  auto* watch = call.watch;
  // The race's timer is made when the race first waits: a request whose only
  // attempt runs in this coroutine never needs one (making one looks up the
  // timer service under a lock).
  std::optional<net::steady_timer> race_timer;
  auto wakeup = [&]() -> net::steady_timer& {
    if (!race_timer) race_timer.emplace(context.client.get_executor());
    return *race_timer;
  };
  AttemptsOutcome outcome;

  for (auto now = Clock::now(); auto attempt = plan.next(now); now = Clock::now()) {
    ++call.tally.count;
    if (attempt->wait > 0ms) {
      // No attempt runs yet: the race's timer serves for the pause.
      auto& pause = wakeup();
      pause.expires_after(attempt->wait);
      co_await pause.async_wait(as_tuple(use_awaitable));
      if (client_gone(watch)) {
        plan.abandon(*attempt);
        outcome.client_gone = true;
        co_return outcome;
      }
      now = Clock::now();
    }

    std::unique_ptr<SharedLease> shared_lease;
    if (WorkerState* shared = context.worker.shared_state();
        shared != nullptr && has_shared_limits(*attempt->deployment)) {
      const config::Deployment& deployment = *attempt->deployment;
      const SharedDeploymentVerdict verdict = co_await take_shared_deployment_limits(
          *shared, context.snapshot->wiring(deployment).shared_budget, context.snapshot,
          shared_lease);
      if (verdict == SharedDeploymentVerdict::at_limit) {
        // Full across the instances: another deployment may take it.
        plan.at_shared_limit(*attempt);
        --call.tally.count;
        continue;
      }
      if (verdict == SharedDeploymentVerdict::unavailable &&
          shared->settings().on_unavailable == config::State::OnUnavailable::deny) {
        plan.abandon(*attempt);
        outcome.last_failure = std::make_unique<FailedAttempt>();
        outcome.last_failure->kind = router::ResultKind::client_error;
        outcome.last_failure->gateway_error = ApiError::overloaded(
            "The gateway's shared rate limits are unavailable. Please try again shortly.");
        co_return outcome;
      }
      // Unavailable with on_unavailable local: the plan's own limits stand.
    }

    Race tasks(context, watch);
    tasks[0] = std::make_unique<AttemptTask>();
    tasks[0]->shared_lease = std::move(shared_lease);
    AttemptTask* winner = nullptr;
    std::optional<TimePoint> hedge_at;
    if (!call.hedges || !attempt->hedge_after) {
      // Nothing races an attempt without a hedge: it runs in this coroutine,
      // which spares a spawn and a wake-up per request.
      auto& task = *tasks[0];
      prepare_attempt(context, call.request, task, *attempt, now);
      if (!task.refused_by_adapter) {
        if (watch) watch->watch(&task.abort_handle);
        task.result.emplace(
            co_await context.worker.transport(*task.wiring)
                .start(task.wiring->origin, task.request, task.limits, task.abort_handle));
        if (task.has_usable_head()) winner = &task;
      }
    } else {
      launch(context, call.request, *tasks[0], *attempt, now, watch, wakeup());
      hedge_at = tasks[0]->limits.started + *attempt->hedge_after;
    }
    while (!winner) {
      winner = finished_with_usable_head(tasks);
      if (winner || !any_running(tasks) || escaped(tasks)) break;
      auto& timer = wakeup();
      timer.expires_at(hedge_at ? *hedge_at : TimePoint::max());
      co_await timer.async_wait(as_tuple(use_awaitable));
      if (hedge_at && Clock::now() >= *hedge_at) {
        hedge_at.reset();
        if (tasks[0]->running && !client_gone(watch))
          launch_hedge(context, call, tasks[1], wakeup());
      }
    }

    // Stop the loser, if still running, and wait until its coroutine is done
    // with the task's storage.
    stop_losers(tasks, winner);
    while (any_running(tasks)) {
      auto& timer = wakeup();
      timer.expires_at(TimePoint::max());
      co_await timer.async_wait(as_tuple(use_awaitable));
    }
    if (watch) {
      for (auto& task : tasks) {
        if (task) watch->unwatch(&task->abort_handle);
      }
    }
    if (auto error = escaped(tasks)) std::rethrow_exception(error);

    if (client_gone(watch)) {
      abandon_all(tasks, plan);
      outcome.client_gone = true;
      co_return outcome;
    }

    // Failed attempts count against their deployment, except one aborted
    // because the other won.
    bool answer_now = false;
    for (auto& task : tasks) {
      if (!task || task.get() == winner) continue;
      if (task->refused_by_shared_limits) {
        // Full across the instances, or Redis away under deny: the hedge
        // was never sent, and is no attempt.
        plan.at_shared_limit(task->attempt);
        --call.tally.count;
        continue;
      }
      bool lost_race = winner && task->abort_handle.aborted();
      bool superseded = winner && task->result && task->result->ok() && task->has_usable_head();
      if (lost_race) {
        plan.lost_race(
            task->attempt,
            std::chrono::duration_cast<router::Micros>(task->stopped - task->limits.started),
            task->stopped);
        continue;
      }
      if (superseded) {
        plan.abandon(task->attempt);
        continue;
      }
      if (!outcome.last_failure) outcome.last_failure = std::make_unique<FailedAttempt>();
      co_await settle_failure(context, plan, call.tally, *task, *outcome.last_failure);
      if (client_gone(watch)) {
        outcome.client_gone = true;
        co_return outcome;
      }
      if (outcome.last_failure->kind == router::ResultKind::client_error) answer_now = true;
    }
    if (!winner) {
      if (answer_now || !plan.can_retry()) break;
      continue;
    }

    outcome.winner = take_winner(plan, call.tally, tasks, winner);
    co_return outcome;
  }
  outcome.client_gone = client_gone(watch);
  co_return outcome;
}

}  // namespace sluice::server

#include "sluice/server/pipeline.hpp"

#include <spdlog/spdlog.h>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include "sluice/common/json_scan.hpp"
#include "sluice/http/eager_write.hpp"
#include "sluice/http/http_head.hpp"
#include "sluice/metrics/budgets.hpp"
#include "sluice/metrics/server_timing.hpp"
#include "sluice/openai/endpoints.hpp"
#include "sluice/openai/multipart_body.hpp"
#include "sluice/openai/request_body.hpp"
#include "sluice/server/cache_step.hpp"
#include "sluice/server/internal_errors.hpp"
#include "sluice/server/model_list.hpp"
#include "sluice/shaping/shaping.hpp"
#include "sluice/stream/client_watch.hpp"
#include "sluice/stream/relay.hpp"
#include "sluice/upstream/client.hpp"

namespace sluice::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using net::as_tuple;
using net::use_awaitable;
using namespace std::chrono_literals;
using namespace std::string_view_literals;

namespace {

// The lines the gateway adds to the client's forwarded ones: its request id
// and the next hop of the trace.
void append_gateway_fields(std::string& fields, std::string_view request_id,
                           const metrics::TraceContext& next_hop) {
  fields.append("x-request-id: "sv).append(request_id).append("\r\n"sv);
  fields.append("traceparent: "sv);
  next_hop.append_traceparent(fields);
  fields.append("\r\n"sv);
}

constexpr std::size_t kMaxErrorBody = std::size_t{256} * 1024;

// Appends the body to `body` until its end or `limit` bytes; returns whether
// it was read to its end.
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

// Appends the lines that say which request this was, which deployment
// answered it and after how many attempts.
void append_request_fields(std::string& fields, const RequestContext& context) {
  fields.append("x-request-id: "sv).append(context.request_id).append("\r\n"sv);
  if (!context.deployment_id.empty()) {
    fields.append("x-sluice-deployment: "sv).append(context.deployment_id).append("\r\n"sv);
  }
  if (context.attempts > 0) {
    fields.append("x-sluice-attempts: "sv)
        .append(std::to_string(context.attempts))
        .append("\r\n"sv);
  }
}

constexpr std::size_t kTypicalResponseFieldBytes = 256;

// Every line sluice adds to an answer of this request.
std::string sluice_fields(const RequestContext& context) {
  std::string fields;
  fields.reserve(160 + context.response_fields.size());
  append_request_fields(fields, context);
  fields.append(context.response_fields);
  return fields;
}

net::awaitable<bool> write_response(RequestContext& context, unsigned status,
                                    std::string_view content_type, std::string_view body,
                                    std::string_view extra_fields) {
  std::string head;
  HeadWriter writer(head);
  writer.status_line(status)
      .field("Content-Type", content_type)
      .field("Content-Length", body.size())
      .raw_fields(extra_fields);
  if (!context.timing_sent) {
    // An answer of the gateway's own: all of its time is sluice's.
    context.gateway_time += Clock::now() - context.body_read;
    std::string timing;
    metrics::render_server_timing(
        timing, {context.gateway_time, context.upstream_connect, context.upstream_ttfb});
    writer.raw_fields(timing);
    context.timing_sent = true;
  }
  context.record.status = status;
  context.record.bytes_out = body.size();
  if (!context.keep_alive) writer.field("Connection", "close");
  writer.finish();
  bool head_only = context.request.method() == http::verb::head;
  std::array<net::const_buffer, 2> wire = {net::buffer(head),
                                           net::buffer(head_only ? std::string_view() : body)};
  auto [ec, n] = co_await write_eagerly(context.client, context.client_deadline,
                                        context.snapshot->config->server.write_timeout, wire);
  co_return !ec && context.keep_alive;
}

// The models a key may use; the full list, rendered once per config, when it
// may use them all.
std::string models_for(const RequestContext& context, const auth::KeyPolicy* key) {
  if (!key || key->models.empty()) return context.snapshot->models_json;
  return render_model_list(*context.snapshot->config, key);
}

struct ProxyInputs {
  std::string_view endpoint;
  std::string_view query;
  // Header lines that travel upstream: the client's, as received, and the
  // gateway's own, made once for all the attempts by whoever makes them.
  std::string_view client_fields;
  std::string_view gateway_fields;
  // The body is forwarded as [prefix, upstream model literal, suffix,
  // addition, closing]; the addition is empty unless a field is added. A
  // multipart/form-data body takes the upstream model's name as it is.
  bool form_data = false;
  std::string_view body_prefix;
  std::string_view body_suffix;
  std::string_view body_addition;
  std::string_view body_closing;
  bool strip_usage_only_chunks = false;
  CacheStep* cache_step = nullptr;  // set when the answer may be cached
};

using StartResult = Result<std::unique_ptr<upstream::Exchange>, upstream::UpstreamError>;

// One upstream attempt: run inline, or in a coroutine of its own when a
// hedge may race it. The target, fields and body its request points into
// belong to pick_upstream, the job and the snapshot.
struct AttemptTask {
  router::Attempt attempt;
  const Snapshot::DeploymentWiring* wiring = nullptr;
  upstream::Request request;
  upstream::Limits limits;  // limits.started: when the attempt began
  upstream::AbortHandle abort_handle;
  std::optional<StartResult> result;
  bool running = false;
  // The client's fields without those the deployment sets itself, when the
  // client sent any of them.
  std::string client_fields;
  TimePoint stopped{};  // when the other attempt's answer stopped this one
  // Thrown in the attempt's own coroutine: the request rethrows it.
  std::exception_ptr escaped;
  // The race was unwound while the attempt ran: the attempt's coroutine
  // owns the task from then, and keeps the origin's snapshot alive.
  bool orphaned = false;
  std::shared_ptr<const Snapshot> orphan_snapshot;

  bool has_usable_head() const { return result && result->ok() && result->value()->status() < 400; }
};

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

net::awaitable<void> run_attempt(Worker& worker, const upstream::Origin& origin, AttemptTask& task,
                                 net::steady_timer& wakeup) {
  const AttemptCoroutineEnd end(worker, task);
  try {
    if (task.attempt.hedge) inject_fault(FaultPoint::hedge_attempt);
    task.result.emplace(co_await worker.transport(*task.wiring)
                            .start(origin, task.request, task.limits, task.abort_handle));
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
void prepare_attempt(const RequestContext& context, const ProxyInputs& inputs, AttemptTask& task,
                     const router::Attempt& attempt, TimePoint now) {
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
}

void launch(RequestContext& context, const ProxyInputs& inputs, AttemptTask& task,
            const router::Attempt& attempt, TimePoint now, stream::ClientWatch& watch,
            net::steady_timer& wakeup) {
  prepare_attempt(context, inputs, task, attempt, now);
  task.running = true;
  watch.watch(&task.abort_handle);
  // The snapshot the request holds keeps the origin alive for the attempt.
  // What the attempt throws goes to the request that raced it (run_attempt);
  // the barrier stands for anything else.
  net::co_spawn(context.client.get_executor(),
                run_attempt(context.worker, task.wiring->origin, task, wakeup),
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

// What a failed attempt left for the client, should it be the last one.
struct FailedAttempt {
  router::ResultKind kind = router::ResultKind::retriable;
  std::optional<ApiError> gateway_error;  // a connection-level failure
  unsigned status = 0;                    // an upstream HTTP error, relayed as is
  std::string content_type;
  std::string body;
  std::optional<std::chrono::milliseconds> retry_after;
};

// Classifies a finished attempt that produced no usable head and reports it
// to the plan; `failed` is what it left. (Filled in place: an awaited result
// would take a second slot in the caller's frame.)
net::awaitable<void> settle_failure(RequestContext& context, router::Plan& plan, AttemptTask& task,
                                    FailedAttempt& failed) {
  inject_fault(FaultPoint::attempt_failed);
  failed = {};
  const auto& deployment = *task.attempt.deployment;
  context.deployment_id = deployment.id;
  auto& result = *task.result;
  if (!result) {
    const auto& error = result.error();
    context.record.attempts.push_back(
        {deployment.id, to_string(error.failure), std::nullopt, std::nullopt, std::nullopt, false});
    spdlog::debug("request {}: deployment {} failed: {}", context.request_id, deployment.id,
                  error.describe());
    plan.report(task.attempt,
                {router::ResultKind::retriable, error.is_timeout(), std::nullopt, std::nullopt},
                Clock::now());
    std::string message = "Upstream deployment " + deployment.id + " failed: " + error.describe();
    failed.gateway_error = error.is_timeout() ? ApiError::upstream_timeout(std::move(message))
                                              : ApiError::upstream_unreachable(std::move(message));
    co_return;
  }
  auto& exchange = *result.value();
  failed.status = exchange.status();
  context.record.attempts.push_back(
      attempt_record(deployment, exchange, "http_" + std::to_string(failed.status)));
  failed.body = co_await read_error_body(exchange, context.relay_buffers.copy_buffer());
  redact(failed.body, deployment.api_key);
  auto content_type = exchange.content_type();
  failed.content_type = content_type.empty() ? "application/json" : std::string(content_type);
  failed.retry_after = exchange.retry_after();
  failed.kind = router::classify_status(failed.status, failed.body);
  auto ttft = std::chrono::duration_cast<router::Micros>(exchange.timing().first_byte -
                                                         exchange.timing().sent);
  plan.report(task.attempt, {failed.kind, false, ttft, failed.retry_after}, Clock::now());
  spdlog::debug("request {}: deployment {} answered {}", context.request_id, deployment.id,
                failed.status);
}

net::awaitable<bool> respond_failure(RequestContext& context, const FailedAttempt& failed) {
  if (failed.gateway_error) co_return co_await respond_error(context, *failed.gateway_error);
  std::string extra = sluice_fields(context);
  if (failed.retry_after) {
    auto seconds = std::chrono::duration_cast<std::chrono::seconds>(*failed.retry_after).count();
    extra.append("Retry-After: ").append(std::to_string(seconds)).append("\r\n");
  }
  co_return co_await write_response(context, failed.status, failed.content_type, failed.body,
                                    extra);
}

// No attempt produced a usable head: the client gets the last failure, or,
// when no attempt could be made, an overload error. A coroutine of its own,
// so that pick_upstream's frame does not carry the answers' slots.
net::awaitable<bool> answer_without_winner(RequestContext& context,
                                           const FailedAttempt* last_failure) {
  if (last_failure) co_return co_await respond_failure(context, *last_failure);
  // Every deployment is at its limits.
  co_return co_await respond_error(
      context,
      ApiError::overloaded("No deployment of model `" + context.model->name +
                           "` can take the request now (all at max_parallel or rpm)."),
      "Retry-After: 1\r\n");
}

// The attempt whose head the client will get; it outlives the race that
// chose it, so the race's state is gone while the body is relayed.
struct Picked {
  std::unique_ptr<AttemptTask> winner;
  bool keep = false;  // without a winner: whether the connection may go on
};

// The lines the gateway adds to what the attempts forward: the request id
// and the next hop of its trace, in the connection's string for them.
std::string_view gateway_fields_for(RequestContext& context) {
  auto next_random = [&worker = context.worker] { return worker.next_random(); };
  auto& fields = context.strings.upstream_fields;
  fields.clear();
  append_gateway_fields(fields, context.request_id, metrics::next_hop(context.trace, next_random));
  return fields;
}

// Launches the plan's hedge into `slot`, if it has one now.
void launch_hedge(RequestContext& context, const ProxyInputs& inputs, router::Plan& plan,
                  std::unique_ptr<AttemptTask>& slot, stream::ClientWatch& watch,
                  net::steady_timer& wakeup) {
  const auto now = Clock::now();
  auto hedge = plan.next_hedge(now);
  if (!hedge) return;
  inject_fault(FaultPoint::hedge_launched);
  ++context.attempts;
  slot = std::make_unique<AttemptTask>();
  launch(context, inputs, *slot, *hedge, now, watch, wakeup);
}

// The primary attempt and at most one hedge, racing for the first byte; a
// slot is filled when its attempt is launched. The helpers below keep their
// loops out of pick_upstream's frame, where every local of a coroutine takes
// a slot of its own.
class Race {
 public:
  explicit Race(RequestContext& context) : context_(context) {}
  // A race is over before it ends, unless an exception unwinds it: then an
  // attempt still running is stopped and left to its coroutine, which
  // still uses it.
  ~Race() {
    for (auto& task : tasks_) {
      if (!task || !task->running) continue;
      context_.watch.unwatch(&task->abort_handle);
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
std::unique_ptr<AttemptTask> take_winner(RequestContext& context, router::Plan& plan, Race& tasks,
                                         AttemptTask* winner) {
  const auto& exchange = *winner->result->value();
  const auto& deployment = *winner->attempt.deployment;
  context.deployment_id = deployment.id;
  auto ttft = std::chrono::duration_cast<router::Micros>(exchange.timing().first_byte -
                                                         exchange.timing().sent);
  plan.report(winner->attempt, {router::ResultKind::success, false, ttft, std::nullopt},
              exchange.timing().first_byte);
  context.answered = &deployment;
  context.record.deployment = deployment.id;
  context.record.attempts.push_back(attempt_record(deployment, exchange, "ok"));
  for (const auto& task : tasks) {
    if (task && task.get() != winner && task->abort_handle.aborted()) {
      context.record.attempts.push_back({task->attempt.deployment->id, "lost_hedge", std::nullopt,
                                         std::nullopt, std::nullopt, false});
    }
  }
  if (winner->attempt.hedge) context.record.tags.push_back("hedge:won");
  auto& slot = tasks[0].get() == winner ? tasks[0] : tasks[1];
  // The request went out with the head, and its fields point into
  // pick_upstream's frame: nothing may read them once the winner leaves it.
  slot->request = {};
  return std::move(slot);
}

// Runs the plan's attempts (with their hedges) until one produces a usable
// head, and reports that to the plan. Without one, the client gets the last
// failure or an overload error here, unless it is gone.
net::awaitable<Picked> pick_upstream(RequestContext& context, ProxyInputs inputs,
                                     router::Plan& plan, stream::ClientWatch& watch) {
  inputs.client_fields = context.request.forwarded_fields();
  inputs.gateway_fields = gateway_fields_for(context);
  // The race's timer is made when the race first waits: a request whose only
  // attempt runs in this coroutine never needs one (making one looks up the
  // timer service under a lock).
  std::optional<net::steady_timer> race_timer;
  auto wakeup = [&]() -> net::steady_timer& {
    if (!race_timer) race_timer.emplace(context.client.get_executor());
    return *race_timer;
  };
  // On the heap: rare, and large for a frame that every request allocates.
  std::unique_ptr<FailedAttempt> last_failure;

  for (auto now = Clock::now(); auto attempt = plan.next(now); now = Clock::now()) {
    ++context.attempts;
    if (attempt->wait > 0ms) {
      // No attempt runs yet: the race's timer serves for the pause.
      auto& pause = wakeup();
      pause.expires_after(attempt->wait);
      co_await pause.async_wait(as_tuple(use_awaitable));
      if (watch.client_gone()) {
        plan.abandon(*attempt);
        co_return Picked{};
      }
      now = Clock::now();
    }

    Race tasks(context);
    tasks[0] = std::make_unique<AttemptTask>();
    AttemptTask* winner = nullptr;
    std::optional<TimePoint> hedge_at;
    if (!attempt->hedge_after) {
      // Nothing races an attempt without a hedge: it runs in this coroutine,
      // which spares a spawn and a wake-up per request.
      auto& task = *tasks[0];
      prepare_attempt(context, inputs, task, *attempt, now);
      watch.watch(&task.abort_handle);
      task.result.emplace(
          co_await context.worker.transport(*task.wiring)
              .start(task.wiring->origin, task.request, task.limits, task.abort_handle));
      if (task.has_usable_head()) winner = &task;
    } else {
      launch(context, inputs, *tasks[0], *attempt, now, watch, wakeup());
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
        if (tasks[0]->running && !watch.client_gone()) {
          launch_hedge(context, inputs, plan, tasks[1], watch, wakeup());
        }
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
    for (auto& task : tasks) {
      if (task) watch.unwatch(&task->abort_handle);
    }
    if (auto error = escaped(tasks)) std::rethrow_exception(error);

    if (watch.client_gone()) {
      abandon_all(tasks, plan);
      co_return Picked{};
    }

    // Failed attempts count against their deployment, except one aborted
    // because the other won.
    bool answer_now = false;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      auto& task = tasks[i];
      if (!task || task.get() == winner) continue;
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
      if (!last_failure) last_failure = std::make_unique<FailedAttempt>();
      co_await settle_failure(context, plan, *task, *last_failure);
      if (watch.client_gone()) co_return Picked{};
      if (last_failure->kind == router::ResultKind::client_error) answer_now = true;
    }
    if (!winner) {
      if (answer_now || !plan.can_retry()) break;
      continue;
    }

    co_return Picked{take_winner(context, plan, tasks, winner), true};
  }

  if (watch.client_gone()) co_return Picked{};
  bool keep = co_await answer_without_winner(context, last_failure.get());
  co_return Picked{nullptr, keep};
}

// The upstream broke between its head and its first body byte: the client
// has seen nothing yet, so it still gets a proper error.
net::awaitable<bool> respond_broken_upstream(RequestContext& context,
                                             const config::Deployment& deployment,
                                             const upstream::UpstreamError& error) {
  std::string message = "Upstream deployment " + deployment.id + " failed: " + error.describe();
  // Built before the co_await: GCC 12 miscompiles a ?: temporary in the
  // arguments of an awaited call (it freed an invalid pointer here).
  const ApiError api_error = error.is_timeout()
                                 ? ApiError::upstream_timeout(std::move(message))
                                 : ApiError::upstream_unreachable(std::move(message));
  co_return co_await respond_error(context, api_error);
}

// Relays the winner's response to the client and settles the attempt.
net::awaitable<bool> relay_answer(RequestContext& context, const ProxyInputs& inputs,
                                  router::Plan& plan, AttemptTask& winner,
                                  stream::ClientWatch& watch) {
  auto& exchange = *winner.result->value();
  const auto& deployment = *winner.attempt.deployment;
  const auto& timing = exchange.timing();
  context.upstream_ttfb = timing.first_byte - timing.sent;
  if (!timing.reused) context.upstream_connect = timing.secured - timing.started;
  // sluice's own time: before the request went upstream, and from the
  // response head to the first write to the client (measured by the relay
  // below; Server-Timing reports it up to here).
  context.gateway_time += winner.limits.started - context.body_read;
  // The relayed answer's own lines go after the ones the stages added, in the
  // same string: room for all of them at once.
  context.response_fields.reserve(kTypicalResponseFieldBytes);
  metrics::render_server_timing(context.response_fields,
                                {context.gateway_time + (Clock::now() - timing.first_byte),
                                 context.upstream_connect, context.upstream_ttfb});
  context.timing_sent = true;

  watch.watch(&winner.abort_handle);
  stream::Relay relay(context.client, context.client_deadline, context.relay_buffers,
                      context.snapshot->config->server.write_timeout);
  stream::RelayOptions relay_options;
  relay_options.strip_usage_only_chunks = inputs.strip_usage_only_chunks;
  relay_options.client_reads_chunks = context.request.version() >= 11;
  relay_options.gaps = &context.gaps;
  relay_options.gap_histogram = context.snapshot->metrics->model(*context.model).inter_token_gap;
  relay_options.shard = context.worker.index();
  if (inputs.cache_step) {
    relay_options.capture = &inputs.cache_step->captured;
    relay_options.capture_limit = kMaxCachedResponseBytes;
    // Stored before the client has the whole answer, so asking again at
    // once is a hit.
    relay_options.on_upstream_complete = [&step = *inputs.cache_step,
                                          &exchange](const stream::RelayOutcome& so_far) {
      if (!so_far.capture_overflowed && exchange.status() == 200) {
        remember_response(step, exchange.is_event_stream());
      }
    };
  }
  append_request_fields(context.response_fields, context);
  auto outcome =
      co_await relay.run(exchange, context.response_fields, context.keep_alive, relay_options);
  if (outcome.first_write != TimePoint{}) {
    context.gateway_time += outcome.first_write - timing.first_byte;
    context.record.ttft_ms = to_ms(outcome.first_write - context.head_started);
  }
  context.record.status = exchange.status();
  context.record.bytes_out = outcome.bytes_out;
  if (outcome.usage) {
    context.usage = outcome.usage;
    context.usage_tokens = outcome.usage->total_tokens;
  }
  watch.unwatch(&winner.abort_handle);
  const auto finished_at = Clock::now();
  exchange.note_finished(finished_at);
  // A client that left, or stopped reading, cut the response short: that
  // is no outcome of the deployment. An upstream that broke is, even if the
  // client then missed the error event.
  const bool upstream_broke =
      outcome.upstream_error && outcome.upstream_error->failure != upstream::Failure::aborted;
  if (!outcome.complete && !upstream_broke && (outcome.client_failed || watch.client_gone())) {
    plan.left_by_client(winner.attempt);
  } else {
    plan.finish(winner.attempt, outcome.complete,
                std::chrono::duration_cast<router::Micros>(finished_at - winner.limits.started),
                finished_at);
  }
  if (outcome.nothing_sent && outcome.upstream_error && !watch.client_gone()) {
    co_return co_await respond_broken_upstream(context, deployment, *outcome.upstream_error);
  }
  context.answered_at = finished_at;
  co_return outcome.complete&& context.keep_alive && !outcome.close_delimited;
}

net::awaitable<bool> proxy(RequestContext& context, const ProxyInputs& inputs,
                           stream::ClientWatch& watch) {
  auto plan =
      context.snapshot->router->plan(*context.model, context.stream, context.worker.next_random());
  auto picked = co_await pick_upstream(context, inputs, plan, watch);
  if (!picked.winner) co_return picked.keep;
  co_return co_await relay_answer(context, inputs, plan, *picked.winner, watch);
}

}  // namespace

net::awaitable<bool> respond_body(RequestContext& context, unsigned status,
                                  std::string_view content_type, std::string_view body,
                                  std::string_view extra_fields) {
  std::string fields = sluice_fields(context);
  fields.append(extra_fields);
  co_return co_await write_response(context, status, content_type, body, fields);
}

net::awaitable<bool> respond_json(RequestContext& context, unsigned status, std::string_view body,
                                  std::string_view extra_fields) {
  co_return co_await respond_body(context, status, "application/json", body, extra_fields);
}

net::awaitable<Result<std::string, ApiError>> internal_post(RequestContext& context,
                                                            const config::Model& model,
                                                            std::string_view endpoint,
                                                            std::string_view body_after_model) {
  constexpr std::size_t kMaxInternalBody = std::size_t{16} * 1024 * 1024;
  ProxyInputs inputs;
  inputs.endpoint = endpoint;
  const std::string added_fields =
      "Content-Type: application/json\r\nx-request-id: " + context.request_id + "\r\n";
  inputs.gateway_fields = added_fields;
  inputs.body_prefix = R"({"model":)";
  inputs.body_suffix = body_after_model;
  auto plan = context.snapshot->router->plan(model, false, context.worker.next_random());
  std::string failure = "no deployment of model `" + model.name + "` can take the request now";

  for (auto now = Clock::now(); auto attempt = plan.next(now); now = Clock::now()) {
    if (attempt->wait > 0ms) {
      net::steady_timer pause(context.client.get_executor(), attempt->wait);
      co_await pause.async_wait(as_tuple(use_awaitable));
      now = Clock::now();
    }
    const auto& deployment = *attempt->deployment;
    AttemptTask task;
    prepare_attempt(context, inputs, task, *attempt, now);
    auto result = co_await context.worker.transport(*task.wiring)
                      .start(task.wiring->origin, task.request, task.limits, task.abort_handle);
    if (!result) {
      const auto& error = result.error();
      plan.report(*attempt,
                  {router::ResultKind::retriable, error.is_timeout(), std::nullopt, std::nullopt},
                  Clock::now());
      failure = "deployment " + deployment.id + " failed: " + error.describe();
      if (!plan.can_retry()) break;
      continue;
    }
    auto& exchange = *result.value();
    auto ttft = std::chrono::duration_cast<router::Micros>(exchange.timing().first_byte -
                                                           exchange.timing().sent);
    std::string body;
    if (exchange.status() >= 400) {
      co_await read_body_into(exchange, context.relay_buffers.copy_buffer(), kMaxErrorBody, body);
      auto kind = router::classify_status(exchange.status(), body);
      plan.report(*attempt, {kind, false, ttft, exchange.retry_after()}, Clock::now());
      failure = "deployment " + deployment.id + " answered " + std::to_string(exchange.status());
      if (kind == router::ResultKind::client_error || !plan.can_retry()) break;
      continue;
    }
    plan.report(*attempt, {router::ResultKind::success, false, ttft, std::nullopt}, Clock::now());
    bool complete = co_await read_body_into(exchange, context.relay_buffers.copy_buffer(),
                                            kMaxInternalBody, body);
    const auto finished_at = Clock::now();
    plan.finish(*attempt, complete,
                std::chrono::duration_cast<router::Micros>(finished_at - task.limits.started),
                finished_at);
    if (complete) co_return body;
    failure = "deployment " + deployment.id + ": the response broke off or was too large";
    if (!plan.can_retry()) break;
  }
  co_return ApiError::upstream_unreachable(std::move(failure));
}

net::awaitable<bool> respond_error(RequestContext& context, const ApiError& error,
                                   std::string_view extra_fields) {
  co_return co_await respond_json(context, error.status, error.to_json(), extra_fields);
}

namespace {

// When the answer ended: the time relay_answer read for the router, or now
// for an answer that did not come through it.
TimePoint settle_answered_at(RequestContext& context) {
  context.answered_at = known_or_now(context.answered_at);
  return context.answered_at;
}

// Metrics and the access-log line for a finished request.
void account(RequestContext& context, bool client_gone) {
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

}  // namespace

void ConnectionStrings::reset() {
  constexpr std::size_t kKeptCapacity = 1024;
  for (auto* text : {&request_id, &response_fields, &upstream_fields}) {
    if (text->capacity() > kKeptCapacity) {
      std::string().swap(*text);
    } else {
      text->clear();
    }
  }
}

void Pipeline::begin(RequestContext& context) {
  auto next_random = [&worker = context.worker] { return worker.next_random(); };
  auto incoming = metrics::parse_traceparent(context.request["traceparent"]);
  context.trace = incoming ? *incoming : metrics::new_trace_context(next_random);
}

void Pipeline::end(RequestContext& context, bool keep) {
  account(context, !keep && context.client_gone);
}

namespace {

// The request counts in sluice_requests_in_flight while this lives, however
// handle() is left: an exception unwinding it must not leave the gauge up.
class InFlightRequest {
 public:
  explicit InFlightRequest(Worker& worker) : worker_(worker) {
    worker_.gateway().metrics().requests_in_flight.add(worker_.index());
  }
  ~InFlightRequest() { worker_.gateway().metrics().requests_in_flight.sub(worker_.index()); }
  InFlightRequest(const InFlightRequest&) = delete;
  InFlightRequest& operator=(const InFlightRequest&) = delete;

 private:
  Worker& worker_;
};

// What a request that goes upstream carries from its admission to the end of
// its relay: the admission to settle, and the storage the forwarded body and
// fields point into.
struct ProxyJob {
  auth::Admission admission;
  CacheStep cache_step;
  ProxyInputs inputs;
  std::optional<shaping::ShapedRequest> shaped;
  std::string without_cache_field;
  std::string respliced;
  std::string with_default_model;  // the body, when it named no model
};

// What screen_request decided, before anything is written to the client.
struct Screening {
  enum class Verdict { refuse, health, models, one_model, proceed };
  Verdict verdict = Verdict::proceed;
  std::string model_id;             // one_model: the model described
  std::optional<ApiError> refusal;  // refuse: the answer
  std::string_view refusal_fields;  // refuse: header lines it carries ("Allow: ...")
  // proceed: what the cache and the forwarding need.
  std::string_view endpoint;
  std::string_view query;
  std::string_view body;  // as shaped
  std::optional<RequestBody> inspected;
};

Screening answered_here(Screening::Verdict verdict) {
  Screening screening;
  screening.verdict = verdict;
  return screening;
}

Screening refuse(ApiError error, std::string_view fields = {}) {
  Screening screening;
  screening.verdict = Screening::Verdict::refuse;
  screening.refusal = std::move(error);
  screening.refusal_fields = fields;
  return screening;
}

// Routes the path, checks the key and the body, shapes and admits, writing
// nothing: the request is refused, answered by the gateway itself, or goes
// on to the cache and the upstream. Plain code, so the coroutine that acts
// on the verdict keeps none of this in its frame.
Screening screen_request(RequestContext& context, ProxyJob& job) {
  auto& request = context.request;
  std::string_view target = request.target();
  auto query_start = target.find('?');
  std::string_view path = target.substr(0, query_start);
  std::string_view query =
      query_start == std::string_view::npos ? std::string_view() : target.substr(query_start);
  auto method = request.method();

  if (path == "/health") {
    if (method != http::verb::get && method != http::verb::head) {
      return refuse(ApiError::method_not_allowed(request.method_string(), path),
                    "Allow: GET, HEAD\r\n");
    }
    return answered_here(Screening::Verdict::health);
  }
  const auto& auth = *context.snapshot->auth;
  auto presented_key =
      auth::extract_presented_key([&](std::string_view name) { return request[name]; });
  // GET /v1/models lists the models, GET /v1/models/{model} describes one.
  constexpr std::string_view kModelsPath = "/v1/models";
  if (path.starts_with(kModelsPath) &&
      (path.size() == kModelsPath.size() || path[kModelsPath.size()] == '/')) {
    if (method != http::verb::get && method != http::verb::head) {
      return refuse(ApiError::method_not_allowed(request.method_string(), path),
                    "Allow: GET, HEAD\r\n");
    }
    std::optional<std::string> name;
    if (path.size() > kModelsPath.size()) {
      name = model_name_from_path(path.substr(kModelsPath.size() + 1));
      if (!name) return refuse(ApiError::unknown_path(path));
      context.record.model = *name;
    }
    // One model is admitted as a request for it: a key that may not use it
    // is told the model does not exist, as it is on the proxied paths.
    job.admission = auth.admit({presented_key.value_or(""), name ? *name : std::string_view(), 0,
                                context.body_read, &context.key_memo});
    job.admission.append_headers(context.response_fields);
    context.key = job.admission.key;
    if (!job.admission.allowed()) return refuse(*job.admission.error);
    if (!name) return answered_here(Screening::Verdict::models);
    if (!context.snapshot->config->find_model(*name)) {
      return refuse(ApiError::model_not_found(*name));
    }
    Screening screening = answered_here(Screening::Verdict::one_model);
    screening.model_id = std::move(*name);
    return screening;
  }
  auto endpoint = proxied_endpoint(path);
  if (!endpoint) return refuse(ApiError::unknown_path(path));
  if (method != http::verb::post) {
    return refuse(ApiError::method_not_allowed(request.method_string(), path), "Allow: POST\r\n");
  }

  // A missing key is refused before the body is looked at; an unknown one
  // when the stage hashes it, below.
  if (auth.enabled() && !presented_key) {
    auto admission = auth.admit({"", "", 0, Clock::now()});
    return refuse(*admission.error);
  }
  std::string_view body = request.body();
  const auto form_boundary = form_data_boundary(request.content_type());
  auto inspect = [&] {
    return form_boundary ? inspect_multipart_body(body, *form_boundary)
                         : inspect_request_body(body);
  };
  auto inspected = inspect();
  if (!inspected && inspected.error().code == "missing_required_parameter" &&
      inspected.error().param == "model") {
    // A body that names no model goes to the endpoint's default model, if
    // one is configured, as if it had named it.
    if (const auto* fallback = context.snapshot->config->default_model_for(*endpoint)) {
      job.with_default_model = form_boundary
                                   ? with_model_field(body, *form_boundary, fallback->name)
                                   : with_model_member(body, fallback->name);
      body = job.with_default_model;
      inspected = inspect();
    }
  }
  if (!inspected) return refuse(inspected.error());
  const auto& model_name = inspected->model;
  context.model = context.snapshot->config->find_model(model_name);
  // Rules and shaping come before admission so that the key is charged for
  // the body that goes upstream; the key's model check stays on the name
  // the client asked for. Models without either never parse the body.
  auto max_tokens = inspected->max_tokens;
  if (context.model && shaping::shapes(*context.model)) {
    // Rules read a JSON request; a form's fields are not read, so its rules
    // see an empty request (no messages, no tools), and nothing is shaped.
    job.shaped = shaping::shape_request(*context.snapshot->config, *context.model, *endpoint,
                                        inspected->form_data ? "{}"sv : body);
    if (!job.shaped->body.empty()) {
      body = job.shaped->body;
      max_tokens = job.shaped->max_tokens;
    }
  }
  const auto text_bytes = inspected->form_data ? inspected->form_text_bytes : body.size();
  // Only a request that goes on reserves tokens: one refused below (an
  // unknown model, no rule that matches) spends nothing upstream.
  const bool goes_on = context.model && (!job.shaped || job.shaped->target);
  job.admission = auth.admit({presented_key.value_or(""), model_name,
                              goes_on ? auth::estimate_tokens(text_bytes, max_tokens) : 0,
                              context.body_read, &context.key_memo});
  job.admission.append_headers(context.response_fields);
  // Refused requests are logged with the key and model too: a 429 is worth
  // little to an operator without knowing whose.
  context.key = job.admission.key;
  context.record.model = model_name;
  if (!job.admission.allowed()) return refuse(*job.admission.error);
  if (!context.model) return refuse(ApiError::model_not_found(model_name));
  context.stream = inspected->stream;
  if (job.shaped) {
    if (!job.shaped->target) {
      return refuse(
          ApiError::invalid_request("No rule of model `" + model_name + "` matches this request.",
                                    "model", "no_matching_rule"));
    }
    context.model = job.shaped->target;
    if (job.shaped->routed) {
      context.record.routed_to = job.shaped->target->name;
      context.response_fields.append("x-sluice-model: ")
          .append(job.shaped->target->name)
          .append("\r\n");
    }
    if (job.shaped->report.changed()) {
      context.record.shaped = job.shaped->report.joined();
      context.response_fields.append("x-sluice-shaped: ")
          .append(context.record.shaped)
          .append("\r\n");
    }
  }

  Screening screening;
  screening.endpoint = *endpoint;
  screening.query = query;
  screening.body = body;
  screening.inspected = std::move(*inspected);
  return screening;
}

// What the upstream attempts send: the body with the upstream's model
// spliced in (and sluice's own fields out), and what the relay must strip.
void prepare_forwarding(RequestContext& context, ProxyJob& job, const Screening& screening) {
  const auto& inspected = *screening.inspected;
  job.inputs.endpoint = screening.endpoint;
  job.inputs.query = screening.query;
  if (job.cache_step.cache) job.inputs.cache_step = &job.cache_step;
  if (inspected.form_data) {
    // A form is forwarded as it came but for the model field's value.
    const auto model = *inspected.model_value;
    job.inputs.form_data = true;
    job.inputs.body_prefix = screening.body.substr(0, model.begin);
    job.inputs.body_suffix = screening.body.substr(model.end);
    return;
  }
  // `cache` is sluice's own field, never sent upstream; a body without it is
  // forwarded as it came.
  std::string_view forwarded = screening.body;
  if (inspected.has_cache_field) {
    auto json = nlohmann::json::parse(screening.body);
    json.erase("cache");
    job.without_cache_field = json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    forwarded = job.without_cache_field;
  }
  const auto splice = splice_model(
      forwarded, job.respliced,
      forwarded.data() == context.request.body().data() ? inspected.model_value : std::nullopt);
  job.inputs.body_prefix = splice.before_model;
  job.inputs.body_suffix = splice.after_model;
  job.inputs.body_closing = splice.closing;

  // A key with a token budget needs the real usage of every stream, and so
  // does a cache entry that may be replayed to a client asking for it: ask
  // the upstream for the usage chunk when the client did not, and keep that
  // chunk from the client.
  constexpr std::string_view kIncludeUsage = R"(,"stream_options":{"include_usage":true})";
  const auto endpoint = screening.endpoint;
  bool wants_usage = ((context.key && context.key->limits.tpm > 0) || job.inputs.cache_step) &&
                     context.stream && !inspected.has_stream_options &&
                     (endpoint == "/chat/completions" || endpoint == "/completions");
  if (wants_usage) {
    job.inputs.body_addition = kIncludeUsage;
    job.inputs.strip_usage_only_chunks = true;
  }
}

// Everything before the upstream: screens the request and answers it when
// the gateway can (refusals, /health, /v1/models, cache hits). Returns
// whether the connection may go on when it answered; nullopt when `job` is
// ready to go upstream.
// The requests that need more than forwarding: answers of the gateway's
// own, and the cache.
net::awaitable<std::optional<bool>> admit_request(RequestContext& context, ProxyJob& job,
                                                  std::unique_ptr<Screening> pending) {
  const auto& screening = *pending;
  switch (screening.verdict) {
    case Screening::Verdict::refuse:
      co_return co_await respond_error(context, *screening.refusal, screening.refusal_fields);
    case Screening::Verdict::health:
      co_return co_await respond_json(context, 200, R"({"status":"ok"})");
    case Screening::Verdict::models: {
      const auto models = models_for(context, job.admission.key);
      bool keep = co_await respond_json(context, 200, models);
      context.snapshot->auth->complete(job.admission, std::nullopt, Clock::now());
      co_return keep;
    }
    case Screening::Verdict::one_model: {
      bool keep = co_await respond_json(context, 200, render_model(screening.model_id));
      context.snapshot->auth->complete(job.admission, std::nullopt, Clock::now());
      co_return keep;
    }
    case Screening::Verdict::proceed:
      break;
  }

  if (context.model->cache.mode != config::Cache::Mode::off) {
    auto cached = co_await answer_from_cache(context, screening.endpoint, *screening.inspected,
                                             job.cache_step);
    if (cached) {
      // Nothing was spent upstream: the request counts against rpm, its
      // tokens are not charged.
      context.snapshot->auth->complete(job.admission, 0, Clock::now());
      co_return *cached;
    }
  }
  prepare_forwarding(context, job, screening);
  co_return std::nullopt;
}

// What a proxied request spent upstream, to settle its reservation with.
// Without an answer, every attempt failed before its first byte: nothing,
// unless the client left while they ran. With one, what the upstream
// reported (nullopt, when it reported nothing, keeps the estimate).
std::optional<std::uint64_t> tokens_spent(const RequestContext& context) {
  if (context.answered == nullptr && !context.watch.client_gone()) return 0;
  return context.usage_tokens;
}

// Screens the request. One that only needs forwarding (the usual case) is
// prepared for it here, in plain code, and null is returned; otherwise the
// screening, for admit_request, on the heap: it is rare, and large for the
// frame every request allocates.
std::unique_ptr<Screening> screen_and_prepare(RequestContext& context, ProxyJob& job) {
  auto screening = screen_request(context, job);
  if (screening.verdict == Screening::Verdict::proceed &&
      context.model->cache.mode == config::Cache::Mode::off) {
    prepare_forwarding(context, job, screening);
    return nullptr;
  }
  return std::make_unique<Screening>(std::move(screening));
}

}  // namespace

net::awaitable<bool> Pipeline::handle(RequestContext& context) {
  const InFlightRequest in_flight(context.worker);
  begin(context);
  // Only the stages before the upstream that must wait (answers of the
  // gateway's own, the cache) run in a frame of their own; a held stream
  // keeps only `job` alive here.
  ProxyJob job;
  std::optional<bool> answered;
  if (auto pending = screen_and_prepare(context, job)) {
    answered = co_await admit_request(context, job, std::move(pending));
  }
  bool keep = false;
  if (answered) {
    keep = *answered;
  } else {
    auto& watch = context.watch;
    watch.start();
    keep = co_await proxy(context, job.inputs, watch);
    // Settled as soon as the response has ended: the client may already be
    // sending its next request.
    context.snapshot->auth->complete(job.admission, tokens_spent(context),
                                     settle_answered_at(context));
    watch.stop();
    context.client_gone = watch.client_gone();
    keep = keep && !watch.client_gone();
  }
  end(context, keep);
  co_return keep;
}

}  // namespace sluice::server

#include "sluice/server/forward.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include "sluice/metrics/server_timing.hpp"
#include "sluice/router/quality.hpp"
#include "sluice/server/attempts.hpp"
#include "sluice/server/phases.hpp"
#include "sluice/server/respond.hpp"
#include "sluice/stream/relay.hpp"
#include "sluice/stream/translating_relay.hpp"

namespace sluice::server {

namespace net = boost::asio;
using namespace std::string_view_literals;

void forwarded_request(const ForwardingInputs& inputs, ForwardingStorage& storage,
                       ForwardedRequest& forwarded) {
  const auto& resolution = inputs.resolution;
  const auto& inspected = resolution.inspected;
  const auto body = resolution.body();
  forwarded.endpoint = inputs.endpoint;
  forwarded.dialect = protocol::dialect_of(inputs.endpoint);
  forwarded.query = inputs.query;
  forwarded.cache_step = inputs.cache_step;
  forwarded.client_wants_usage = inspected.include_usage;
  forwarded.prompt_class =
      static_cast<std::uint8_t>(router::prompt_class_of(resolution.text_bytes / 4));
  forwarded.max_tokens = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(resolution.max_tokens.value_or(0), UINT32_MAX));
  if (inspected.form_data) {
    // A form is forwarded as it came but for the model field's value.
    const auto model = *inspected.model_value;
    forwarded.form_data = true;
    forwarded.body_prefix = body.substr(0, model.begin);
    forwarded.body_suffix = body.substr(model.end);
    return;
  }
  // `cache` is sluice's own field, never sent upstream; a body without it is
  // forwarded as it came.
  std::string_view sent = body;
  if (inspected.has_cache_field) {
    auto json = nlohmann::json::parse(body);
    json.erase("cache");
    storage.without_cache_field =
        json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    sent = storage.without_cache_field;
  }
  // The model's place, as inspected, holds only in the body as received.
  const auto splice = splice_model(
      sent, storage.respliced,
      sent.data() == inputs.received_body.data() ? inspected.model_value : std::nullopt);
  forwarded.body_prefix = splice.before_model;
  forwarded.body_suffix = splice.after_model;
  forwarded.body_closing = splice.closing;

  // Ask the upstream for the usage chunk when the client did not, and keep
  // that chunk from the client.
  constexpr std::string_view kIncludeUsage = R"(,"stream_options":{"include_usage":true})";
  const bool wants_usage =
      inputs.needs_usage && inputs.stream && !inspected.has_stream_options &&
      (inputs.endpoint == "/chat/completions" || inputs.endpoint == "/completions");
  if (wants_usage) {
    forwarded.body_addition = kIncludeUsage;
    forwarded.strip_usage_only_chunks = true;
  }
}

namespace {

// The lines the gateway adds to what the attempts forward: the request id
// and the next hop of its trace, in the connection's string for them.
std::string_view gateway_fields_for(RequestContext& context) {
  auto next_random = [&worker = context.worker] { return worker.next_random(); };
  auto& fields = context.strings.upstream_fields;
  fields.clear();
  fields.append("x-request-id: "sv).append(context.request_id).append("\r\n"sv);
  fields.append("traceparent: "sv);
  metrics::next_hop(context.trace, next_random).append_traceparent(fields);
  fields.append("\r\n"sv);
  return fields;
}

// The attempts' tally becomes the request's: its answer's headers, metrics
// and access-log line.
void take_tally(RequestContext& context, AttemptTally& tally) {
  context.attempts = tally.count;
  context.deployment_id = std::move(tally.deployment_id);
  context.record.attempts = std::move(tally.records);
  context.answered = tally.answered;
  if (tally.answered) context.record.deployment = tally.answered->id;
  if (tally.hedge_won) context.record.tags.push_back("hedge:won");
}

net::awaitable<bool> respond_failure(RequestContext& context, const FailedAttempt& failed) {
  if (failed.gateway_error) co_return co_await respond_error(context, *failed.gateway_error);
  std::string retry_after;
  if (failed.retry_after) {
    // Retry-After has whole seconds only: rounded up, so that a client that
    // keeps to it does not come back before the upstream's own time
    // (retry-after-ms: 1500 is "Retry-After: 2").
    auto seconds = std::chrono::ceil<std::chrono::seconds>(*failed.retry_after).count();
    retry_after.append("Retry-After: ").append(std::to_string(seconds)).append("\r\n");
  }
  co_return co_await respond_body(context, failed.status, failed.content_type, failed.body,
                                  retry_after);
}

// No attempt produced a usable head: the client gets the last failure, or,
// when no attempt could be made, an overload error. A coroutine of its own,
// so that forward's frame does not carry the answers' slots.
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

// Relays the winner's answer through its deployment's protocol adapter
// (a coroutine of its own: answers that pass through never allocate its
// frame).
net::awaitable<stream::RelayOutcome> relay_translated(RequestContext& context, AttemptTask& winner,
                                                      stream::AnswerTranslator& translator,
                                                      const stream::RelayOptions& options) {
  stream::TranslatingRelay relay(context.client, context.client_deadline, context.relay_buffers,
                                 context.snapshot->config->server.write_timeout);
  co_return co_await relay.run(winner.exchange(), translator, context.response_fields,
                               context.keep_alive, options);
}

// Feeds the deployment's gap window (`idle: auto`) with the stream's
// longest gap: a stall deadline must let every healthy stream's longest
// pause through, not just its typical one. A stream the deadline ended
// counts as a gap of the deadline, so the deadline cannot sink on its own
// stalls.
void record_stream_gaps(const AttemptTask& winner, const stream::RelayOutcome& outcome,
                        const metrics::GapTracker& gaps, TimePoint now) {
  auto& window = winner.attempt.state->gaps;
  if (outcome.upstream_error &&
      outcome.upstream_error->failure == upstream::Failure::idle_timeout) {
    window.add(winner.limits.idle, now);
  } else if (auto longest = gaps.max(); longest && outcome.complete) {
    window.add(std::chrono::duration_cast<router::Micros>(*longest), now);
  }
}

// The quality guard (router.quality): whether the answer, though relayed
// as it came, counts as a failure of its deployment. Only OpenAI chat and
// text completions are judged, as the client gets them (relayed as they
// came, or translated from another protocol's answer): their end ([DONE]
// after a finish_reason, a closed object) and usage have one known shape.
bool guard_answer(RequestContext& context, const ForwardedRequest& inputs,
                  const AttemptTask& winner, const stream::RelayOutcome& outcome,
                  bool passed_through, TimePoint finished_at) {
  const auto& exchange = *winner.result->value();
  router::AnswerFacts facts;
  facts.stream = exchange.is_event_stream();
  facts.complete = outcome.complete;
  facts.stalled =
      outcome.upstream_error && outcome.upstream_error->failure == upstream::Failure::idle_timeout;
  const bool openai_answer = passed_through || inputs.dialect == protocol::Dialect::openai;
  const bool judged = openai_answer && exchange.status() == 200 &&
                      (inputs.endpoint == "/chat/completions" || inputs.endpoint == "/completions");
  if (!judged && !facts.stalled) return false;
  if (!judged) facts.complete = false;  // only the stall is told
  facts.saw_done = outcome.saw_done;
  facts.saw_finish_reason = outcome.saw_finish_reason;
  facts.json_ends_object = outcome.json_ends_object;
  facts.finish_length = outcome.finish_length;
  if (inputs.max_tokens > 0) facts.max_tokens = inputs.max_tokens;
  if (outcome.usage) facts.completion_tokens = outcome.usage->completion_tokens;
  facts.streaming_time =
      std::chrono::duration_cast<router::Micros>(finished_at - exchange.timing().first_byte);
  const auto failure = router::judge_answer(facts, context.snapshot->config->router.quality);
  if (failure == router::QualityFailure::none) return false;
  const auto reason = router::to_string(failure);
  context.snapshot->metrics->quality_failures(*winner.attempt.deployment, reason)
      .add(context.worker.index());
  context.record.tags.push_back("quality:" + std::string(reason));
  // A stall already ended the answer as a failure.
  return failure != router::QualityFailure::stalled;
}

// Reports the relayed answer's end to the plan: a failure when it broke
// off, or when the quality guard finds it wanting. (Plain code: its locals
// stay out of the relay's coroutine frame.)
void settle_answer(RequestContext& context, const ForwardedRequest& inputs, router::Plan& plan,
                   const AttemptTask& winner, const stream::RelayOutcome& outcome,
                   bool passed_through, TimePoint finished_at) {
  bool ok = outcome.complete;
  if (winner.attempt.deployment->timeouts.idle_auto && winner.result->value()->is_event_stream()) {
    record_stream_gaps(winner, outcome, context.gaps, finished_at);
  }
  if (context.snapshot->config->router.quality.enabled &&
      guard_answer(context, inputs, winner, outcome, passed_through, finished_at)) {
    ok = false;
  }
  plan.finish(winner.attempt, ok,
              std::chrono::duration_cast<router::Micros>(finished_at - winner.limits.started),
              finished_at);
}

// The answer's head fields and the relay's options, before the first byte
// goes to the client. (This and finish_answer are plain code, so that their
// locals stay out of relay_answer's coroutine frame: a frame over about 1 KiB
// is not recycled by Asio and costs the allocator's slow path per request.)
stream::RelayOptions begin_answer(RequestContext& context, const ForwardedRequest& inputs,
                                  AttemptTask& winner, stream::ClientWatch& watch) {
  auto& exchange = *winner.result->value();
  const auto& timing = exchange.timing();
  context.upstream_ttfb = timing.first_byte - timing.sent;
  if (!timing.reused) context.upstream_connect = timing.secured - timing.started;
  // sluice's own time: before the request went upstream, and from the
  // response head to the first write to the client (measured by the relay;
  // Server-Timing reports it up to here).
  context.gateway_time += winner.limits.started - context.body_read;
  // The relayed answer's own lines go after the ones the stages added, in the
  // same string: room for all of them at once.
  context.response_fields.reserve(kTypicalResponseFieldBytes);
  metrics::render_server_timing(context.response_fields,
                                {context.gateway_time + (Clock::now() - timing.first_byte),
                                 context.upstream_connect, context.upstream_ttfb});
  context.timing_sent = true;

  watch.watch(&winner.abort_handle);
  stream::RelayOptions relay_options;
  relay_options.strip_usage_only_chunks = inputs.strip_usage_only_chunks;
  relay_options.error_event = protocol::stream_error_event(inputs.dialect);
  relay_options.client_reads_chunks = context.request.version() >= 11;
  relay_options.inspect_end = context.snapshot->config->router.quality.enabled;
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
  return relay_options;
}

// What the relayed answer tells the record and the plan, once it ended.
void finish_answer(RequestContext& context, const ForwardedRequest& inputs, router::Plan& plan,
                   AttemptTask& winner, stream::ClientWatch& watch,
                   const stream::RelayOutcome& outcome, bool passed_through) {
  auto& exchange = *winner.result->value();
  if (outcome.first_write != TimePoint{}) {
    context.gateway_time += outcome.first_write - exchange.timing().first_byte;
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
  context.answered_at = finished_at;
  // A client that left, or stopped reading, cut the response short: that
  // is no outcome of the deployment. An upstream that broke is, even if the
  // client then missed the error event.
  const bool upstream_broke =
      outcome.upstream_error && outcome.upstream_error->failure != upstream::Failure::aborted;
  if (!outcome.complete && !upstream_broke && (outcome.client_failed || watch.client_gone())) {
    plan.left_by_client(winner.attempt);
  } else {
    settle_answer(context, inputs, plan, winner, outcome, passed_through, finished_at);
  }
}

// Relays the winner's response to the client and settles the attempt.
net::awaitable<bool> relay_answer(RequestContext& context, const ForwardedRequest& inputs,
                                  router::Plan& plan, AttemptTask& winner,
                                  stream::ClientWatch& watch) {
  stream::RelayOptions relay_options = begin_answer(context, inputs, winner, watch);
  stream::RelayOutcome outcome;
  // An adapter may rewrite requests yet leave answers as they are (no
  // translator): those are spliced through like any other.
  std::unique_ptr<stream::AnswerTranslator> translator;
  if (const auto& adapter = *winner.wiring->adapter; !adapter.passes_through(inputs.dialect)) {
    translator = adapter.translate_answer(inputs.dialect);
  }
  if (!translator) {
    stream::Relay relay(context.client, context.client_deadline, context.relay_buffers,
                        context.snapshot->config->server.write_timeout);
    outcome = co_await relay.run(*winner.result->value(), context.response_fields,
                                 context.keep_alive, relay_options);
  } else {
    if (inputs.dialect == protocol::Dialect::openai) {
      relay_options.strip_usage_only_chunks = !inputs.client_wants_usage;
    }
    outcome = co_await relay_translated(context, winner, *translator, relay_options);
  }
  finish_answer(context, inputs, plan, winner, watch, outcome, !translator);
  if (outcome.nothing_sent && outcome.upstream_error && !watch.client_gone()) {
    context.answered_at = {};  // the error answer below is the one the record times
    co_return co_await respond_broken_upstream(context, *winner.attempt.deployment,
                                               *outcome.upstream_error);
  }
  co_return outcome.complete&& context.keep_alive && !outcome.close_delimited;
}

// Whether the forwarded stream needs the upstream's usage chunk: for a key
// with a token budget, for a cache entry that may be replayed to a client
// asking for it, and for the quality guard (an empty answer).
bool needs_usage(const RequestContext& context, const RequestJob& job) {
  return (context.key && context.key->limits.tpm > 0) || job.cache_step.cache != nullptr ||
         context.snapshot->config->router.quality.enabled;
}

// The request's prompt-size class, when the router keeps windows by class.
std::size_t prompt_class_for(const RequestContext& context, const ForwardedRequest& forwarded) {
  return context.snapshot->config->router.prompt_classes ? forwarded.prompt_class
                                                         : router::kNoPromptClass;
}

// Runs the plan's attempts and relays the winner's answer; without one, the
// client gets the last failure. The watch on the client ends with it.
net::awaitable<bool> attempt_and_relay(RequestContext& context, const ForwardedRequest& forwarded) {
  auto& watch = context.watch;
  auto plan =
      context.snapshot->router->plan(*context.model, context.stream, context.worker.next_random(),
                                     prompt_class_for(context, forwarded));
  bool keep = false;
  {
    AttemptTally tally;
    auto outcome = co_await run_attempts(context, {forwarded, plan, &watch, true, tally});
    take_tally(context, tally);
    if (outcome.client_gone) {
      keep = false;
    } else if (!outcome.winner) {
      keep = co_await answer_without_winner(context, outcome.last_failure.get());
    } else {
      keep = co_await relay_answer(context, forwarded, plan, *outcome.winner, watch);
    }
  }
  watch.stop();
  context.client_gone = watch.client_gone();
  co_return keep && !context.client_gone;
}

}  // namespace

// Plain code that hands over attempt_and_relay's awaitable: a request costs
// one coroutine frame here, not two.
net::awaitable<bool> forward(RequestContext& context, RequestJob& job) {
  job.answered_by = AnsweredBy::upstream;
  const auto& request = context.request;
  forwarded_request(
      {job.resolution, job.route.endpoint, job.route.query, request.body(), context.stream,
       needs_usage(context, job), job.cache_step.cache ? &job.cache_step : nullptr},
      job.forwarding_storage, job.forwarded);
  job.forwarded.client_fields = request.forwarded_fields();
  job.forwarded.gateway_fields = gateway_fields_for(context);

  context.watch.start();
  return attempt_and_relay(context, job.forwarded);
}

net::awaitable<Result<std::string, ApiError>> internal_post(RequestContext& context,
                                                            const config::Model& model,
                                                            std::string_view endpoint,
                                                            std::string_view body_after_model) {
  constexpr std::size_t kMaxInternalBody = std::size_t{16} * 1024 * 1024;
  ForwardedRequest forwarded;
  forwarded.endpoint = endpoint;
  const std::string added_fields =
      "Content-Type: application/json\r\nx-request-id: " + context.request_id + "\r\n";
  forwarded.gateway_fields = added_fields;
  forwarded.body_prefix = R"({"model":)";
  forwarded.body_suffix = body_after_model;
  auto plan = context.snapshot->router->plan(model, false, context.worker.next_random());
  // Its attempts are its own, not the client request's: they stay out of
  // that request's headers and access-log line.
  AttemptTally tally;
  std::string failure = "no deployment of model `" + model.name + "` can take the request now";
  for (;;) {
    auto outcome = co_await run_attempts(context, {forwarded, plan, nullptr, false, tally});
    if (!outcome.winner) {
      if (const auto* failed = outcome.last_failure.get()) {
        failure = failed->gateway_error ? failed->gateway_error->message
                                        : "deployment " + tally.deployment_id + " answered " +
                                              std::to_string(failed->status);
      }
      break;
    }
    // A winner whose body breaks off is a failure the plan may retry.
    auto& winner = *outcome.winner;
    std::string body;
    const bool complete = co_await read_body_into(
        winner.exchange(), context.relay_buffers.copy_buffer(), kMaxInternalBody, body);
    const auto finished_at = Clock::now();
    plan.finish(winner.attempt, complete,
                std::chrono::duration_cast<router::Micros>(finished_at - winner.limits.started),
                finished_at);
    if (complete) co_return body;
    failure = "deployment " + tally.deployment_id + ": the response broke off or was too large";
    if (!plan.can_retry()) break;
  }
  co_return ApiError::upstream_unreachable(std::move(failure));
}

}  // namespace sluice::server

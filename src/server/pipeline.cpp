#include "sluice/server/pipeline.hpp"

#include "sluice/server/phases.hpp"

namespace sluice::server {

namespace net = boost::asio;

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

namespace {

// resolve → authorize → shape: plain code that writes nothing, so that no
// coroutine keeps any of it in its frame.
Next decide(RequestContext& context, RequestJob& job) {
  auto next = resolve(context, job);
  if (next == Next::go_on) next = authorize(context, job);
  if (next == Next::go_on) next = shape(context, job);
  return next;
}

// The phases that may wait before the answer is written: the shared
// limits, the gateway's own answers, the cache. Only the requests that need
// one of them allocate this coroutine's frame.
net::awaitable<bool> answer_after_waits(RequestContext& context, RequestJob& job, Next next) {
  if (job.admission.limits_pending()) next = co_await take_shared_limits(context, job, next);
  if (next == Next::answer_here) co_return co_await respond_here(context, job);
  std::optional<bool> cached;
  if (has_cache(*context.model)) cached = co_await look_up_cache(context, job);
  if (cached) co_return *cached;
  co_return co_await forward(context, job);
}

}  // namespace

// The request counts in sluice_requests_in_flight while this lives, however
// it is left: an exception unwinding the connection must not leave the
// gauge up.
Pipeline::Request::Request(RequestContext& context) : context_(context) {
  context_.worker.gateway().metrics().requests_in_flight.add(context_.worker.index());
}

Pipeline::Request::~Request() {
  context_.worker.gateway().metrics().requests_in_flight.sub(context_.worker.index());
}

net::awaitable<bool> Pipeline::Request::answer() {
  begin(context_);
  const Next next = decide(context_, job_);
  if (next == Next::go_on && !job_.admission.limits_pending() && !has_cache(*context_.model)) {
    return forward(context_, job_);
  }
  return answer_after_waits(context_, job_, next);
}

void Pipeline::Request::account(bool keep) { server::account(context_, job_, keep); }

}  // namespace sluice::server

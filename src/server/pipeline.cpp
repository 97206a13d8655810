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

// resolve → authorize → shape: plain code that writes nothing, so that the
// coroutine keeps none of it in its frame.
Next decide(RequestContext& context, RequestJob& job) {
  auto next = resolve(context, job);
  if (next == Next::go_on) next = authorize(context, job);
  if (next == Next::go_on) next = shape(context, job);
  return next;
}

}  // namespace

net::awaitable<bool> Pipeline::handle(RequestContext& context) {
  const InFlightRequest in_flight(context.worker);
  begin(context);
  RequestJob job;
  bool keep = false;
  Next next = decide(context, job);
  if (job.admission.limits_pending()) next = co_await take_shared_limits(context, job, next);
  if (next == Next::answer_here) {
    keep = co_await respond_here(context, job);
  } else {
    std::optional<bool> cached;
    if (has_cache(*context.model)) cached = co_await look_up_cache(context, job);
    if (cached) {
      keep = *cached;
    } else {
      keep = co_await forward(context, job);
    }
  }
  account(context, job, keep);
  co_return keep;
}

}  // namespace sluice::server

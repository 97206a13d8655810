#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/common/recycling_allocator.hpp"
#include "sluice/common/result.hpp"
#include "sluice/metrics/access_log.hpp"
#include "sluice/openai/api_error.hpp"
#include "sluice/router/router.hpp"
#include "sluice/server/forwarded_request.hpp"
#include "sluice/server/request_context.hpp"
#include "sluice/server/shared_state.hpp"
#include "sluice/upstream/client.hpp"

// The one loop that runs a plan's attempts: retries, failover to the next
// deployment and to fallback models, waits the plan asks for, hedges, and
// every outcome reported to the plan (and so to cooldowns and the latency
// window). Client requests and the gateway's own requests (the semantic
// cache's embeddings) both go through it.
namespace sluice::server {

using StartResult = Result<std::unique_ptr<upstream::Exchange>, upstream::UpstreamError>;

// One upstream attempt: run inline, or in a coroutine of its own when a
// hedge may race it. The target, fields and body its request points into
// belong to the caller's ForwardedRequest, the task and the snapshot.
struct AttemptTask : PerThreadRecycled {
  router::Attempt attempt;
  const Snapshot::DeploymentWiring* wiring = nullptr;
  upstream::Request request;
  upstream::Limits limits;  // limits.started: when the attempt began
  upstream::AbortHandle abort_handle;
  std::optional<StartResult> result;
  bool running = false;
  protocol::Dialect client_dialect = protocol::Dialect::openai;  // as the adapter sees it
  // The client's fields without those the deployment sets itself, when the
  // client sent any of them.
  std::string client_fields;
  // What the deployment's protocol adapter rewrote of the request; or why
  // it could not, in which case the attempt was not made.
  std::string adapted;
  std::unique_ptr<ApiError> refused_by_adapter;  // rare: kept out of the task's size
  TimePoint stopped{};                           // when the other attempt's answer stopped this one
  // Thrown in the attempt's own coroutine: the request rethrows it.
  std::exception_ptr escaped;
  // The race was unwound while the attempt ran: the attempt's coroutine
  // owns the task from then, and keeps the origin's snapshot alive.
  bool orphaned = false;
  std::shared_ptr<const Snapshot> orphan_snapshot;
  // The deployment's max_parallel permit in Redis (state.backend redis),
  // given back with the task.
  std::unique_ptr<SharedLease> shared_lease;
  // A hedge onto a deployment whose limits the instances share takes them
  // in its own coroutine before it starts, so that the race does not wait
  // for Redis; refused, it never starts.
  bool takes_shared_limits = false;
  bool refused_by_shared_limits = false;

  bool has_usable_head() const { return result && result->ok() && result->value()->status() < 400; }
  upstream::Exchange& exchange() { return *result->value(); }
};

// What a failed attempt left for the client, should it be the last one.
struct FailedAttempt {
  router::ResultKind kind = router::ResultKind::retriable;
  std::optional<ApiError> gateway_error;  // a connection-level failure
  unsigned status = 0;                    // an upstream HTTP error, relayed as is
  std::string content_type;
  std::string body;
  std::optional<std::chrono::milliseconds> retry_after;
};

// What the attempts did, for the answer's headers, the metrics and the
// access log of the request they served.
struct AttemptTally {
  unsigned count = 0;         // attempts made, hedges included
  std::string deployment_id;  // the last deployment that answered or failed
  decltype(metrics::RequestRecord::attempts) records;  // as the access log keeps them
  const config::Deployment* answered = nullptr;        // the winner's
  bool hedge_won = false;
};

struct AttemptsCall {
  const ForwardedRequest& request;
  router::Plan& plan;
  // The client whose leaving stops the attempts; null for a request of the
  // gateway's own, which no client waits on directly.
  stream::ClientWatch* watch = nullptr;
  bool hedges = true;  // whether the plan's hedges are launched
  AttemptTally& tally;
};

struct AttemptsOutcome {
  // The attempt whose head the client gets; it outlives the race that chose
  // it, so the race's state is gone while its body is read. Its request no
  // longer points anywhere.
  std::unique_ptr<AttemptTask> winner;
  // Without a winner: the last failure, or null when the plan allowed no
  // attempt (every deployment at its limits).
  std::unique_ptr<FailedAttempt> last_failure;
  bool client_gone = false;
};

// Runs the plan's attempts (and their hedges) until one produces a usable
// head, which is reported to the plan, or the plan allows no more.
boost::asio::awaitable<AttemptsOutcome> run_attempts(RequestContext& context, AttemptsCall call);

// Reads an answer's body into `body` until its end or `limit` bytes; returns
// whether it was read to its end.
boost::asio::awaitable<bool> read_body_into(upstream::Exchange& exchange, std::vector<char>& buffer,
                                            std::size_t limit, std::string& body);

}  // namespace sluice::server

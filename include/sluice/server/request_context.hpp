#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "sluice/common/clock.hpp"
#include "sluice/http/socket_deadline.hpp"
#include "sluice/metrics/access_log.hpp"
#include "sluice/metrics/gap_tracker.hpp"
#include "sluice/metrics/trace_context.hpp"
#include "sluice/protocol/dialect.hpp"
#include "sluice/server/client_request.hpp"
#include "sluice/server/gateway.hpp"
#include "sluice/stream/client_watch.hpp"
#include "sluice/stream/relay.hpp"
#include "sluice/stream/sse_scanner.hpp"

namespace sluice::server {

// Strings a client connection lends to each of its requests in turn: cleared
// rather than freed between them, so that a request on a kept-alive
// connection allocates none of them.
struct ConnectionStrings {
  std::string request_id;       // RequestContext::request_id
  std::string response_fields;  // RequestContext::response_fields
  std::string upstream_fields;  // the gateway's lines every attempt forwards

  // Empties them for the next request; one that grew past a typical head's
  // size is let go, so an idle connection holds little.
  void reset();
};

// What every stage reads and fills in for one request.
struct RequestContext {
  Worker& worker;
  std::shared_ptr<const Snapshot> snapshot;
  ClientRequest& request;
  boost::asio::ip::tcp::socket& client;
  SocketDeadline& client_deadline;        // the connection's; disarmed while no wait needs it
  stream::Relay::Buffers& relay_buffers;  // lent by the worker for the connection
  stream::ClientWatch& watch;             // the connection's, started for each proxied request
  auth::KeyMemo& key_memo;                // the key the connection presented last
  ConnectionStrings& strings;             // the connection's, reset for this request
  bool keep_alive = true;

  std::string& request_id = strings.request_id;
  // When the request's first bytes were seen (for one read whole at once,
  // when that read was parsed): idle time before it is the connection's.
  TimePoint head_started{};
  TimePoint body_read{};
  // When the proxied answer ended; one reading of the clock serves the
  // router, the rate limits and the access log.
  TimePoint answered_at{};

  // Filled by the stages.
  const auth::KeyPolicy* key = nullptr;  // who is calling (auth on)
  // "Name: value\r\n" lines every response to this request carries
  // (rate-limit headers, timing).
  std::string& response_fields = strings.response_fields;
  const config::Model* model = nullptr;
  bool stream = false;
  // The API the client's endpoint speaks: the gateway's own errors are
  // worded in it.
  protocol::Dialect dialect = protocol::Dialect::openai;
  unsigned attempts = 0;
  std::optional<std::uint64_t> usage_tokens{};  // prompt + completion, as the upstream reported
  std::optional<stream::Usage> usage{};

  // Observability: the access-log record the stages fill in, the trace, and
  // the time spent in sluice's own code (not waiting on upstream or client).
  metrics::RequestRecord record{};
  metrics::TraceContext trace{};
  metrics::GapTracker gaps{};
  std::chrono::nanoseconds gateway_time{0};
  std::optional<std::chrono::nanoseconds> upstream_ttfb{};
  std::optional<std::chrono::nanoseconds> upstream_connect{};
  bool timing_sent = false;  // a Server-Timing header went out already
  bool client_gone = false;  // the client left before its answer was complete
  const config::Deployment* answered = nullptr;
  std::string deployment_id{};
};

}  // namespace sluice::server

#pragma once

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/result.hpp"
#include "sluice/http/eager_write.hpp"
#include "sluice/upstream/connection.hpp"
#include "sluice/upstream/dns_cache.hpp"
#include "sluice/upstream/exchange.hpp"
#include "sluice/upstream/http1_exchange.hpp"
#include "sluice/upstream/origin.hpp"
#include "sluice/upstream/pool.hpp"
#include "sluice/upstream/tls_contexts.hpp"
#include "sluice/upstream/transport.hpp"

namespace sluice::upstream {

using ClientDeps = TransportDeps;

// The HTTP/1.1 transport: one request at a time on each connection of the
// worker's pool, a connection kept alive going back to the pool after its
// response.
class Http1Client final : public Transport {
 public:
  explicit Http1Client(ClientDeps deps) : deps_(deps) {}

  // Interim heads (103 Early Hints, 100 Continue) are read and dropped
  // within the first-byte deadline, and a 101 is a bad_response. A pooled
  // connection that turns out dead before any response byte is replaced by
  // a fresh one once.
  boost::asio::awaitable<Result<std::unique_ptr<Exchange>, UpstreamError>> start(
      const Origin& origin, const Request& request, const Limits& limits,
      AbortHandle& abort_handle) override;

  // Opens a connection and parks it in the pool.
  boost::asio::awaitable<std::optional<UpstreamError>> warm(const Origin& origin,
                                                            const Limits& limits) override;

  Pool& pool() { return deps_.pool; }

  // Opens a connection to the origin (name lookup, TCP, TLS) within
  // limits.connect, counted as opened in the pool. `alpn`, in ALPN's wire
  // format, is offered in a TLS handshake; empty offers nothing.
  boost::asio::awaitable<Result<std::unique_ptr<Connection>, UpstreamError>> connect(
      const Origin& origin, const Limits& limits, AbortHandle& abort_handle, Timing& timing,
      std::string_view alpn = {});

 private:
  struct OutgoingRequest;

  // A connection of the pool to the origin, or null when it has none idle.
  std::unique_ptr<Connection> take_pooled(const Origin& origin, Timing& timing);
  // Writes the request's head and offers the whole request to the socket,
  // without waiting.
  WriteProgress send_now(Http1Exchange& exchange, const Origin& origin, const Request& request,
                         OutgoingRequest& outgoing);

  ClientDeps deps_;
  // Where each request's head is written just before it is sent: a head
  // sent without a wait needs no string of its own. One that has to wait is
  // copied out first, since other requests write theirs here meanwhile.
  std::string head_scratch_;
};

// The name the gateway's callers and tests knew it by.
using Client = Http1Client;

}  // namespace sluice::upstream

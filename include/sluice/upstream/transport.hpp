#pragma once

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <optional>

#include "sluice/common/result.hpp"
#include "sluice/upstream/exchange.hpp"
#include "sluice/upstream/origin.hpp"

namespace sluice::upstream {

class Pool;
class DnsCache;
class TlsContexts;

// What a worker lends each of its transports: its own connection pool, and
// the gateway's name cache and TLS contexts. All outlive the transports.
struct TransportDeps {
  Pool& pool;
  DnsCache& dns;
  TlsContexts& tls;
};

// A way of carrying requests to an upstream (HTTP/1.1 over pooled
// connections, ...). Knows nothing of routing or auth. Each worker thread
// has its own instance of every registered transport (upstream/transports.hpp),
// so an implementation needs no locks: its requests interleave only where
// they wait.
class Transport {
 public:
  Transport() = default;
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Sends the request and waits for the final response head, within
  // limits.ttft of the connection being ready (and limits.deadline). Interim
  // heads (1xx) are not handed over. Calls abort_handle.notify_sent() once
  // the request is written, and lets abort_handle stop whatever it awaits;
  // abort_handle outlives the exchange.
  virtual boost::asio::awaitable<Result<std::unique_ptr<Exchange>, UpstreamError>> start(
      const Origin& origin, const Request& request, const Limits& limits,
      AbortHandle& abort_handle) = 0;

  // Opens what start would need for `origin` and keeps it, so the first
  // request pays no handshake.
  virtual boost::asio::awaitable<std::optional<UpstreamError>> warm(const Origin& origin,
                                                                    const Limits& limits) = 0;

  // At shutdown, on the worker's thread or once it has stopped, while its
  // event loop still exists: closes and lets go of what the transport keeps
  // open, so nothing of it outlives the loop.
  virtual void shut_down() {}
};

}  // namespace sluice::upstream

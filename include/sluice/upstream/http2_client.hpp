#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "sluice/upstream/client.hpp"
#include "sluice/upstream/transport.hpp"

namespace sluice::upstream {

class Http2Session;

// Gauges of the HTTP/2 transport, summed over every worker's instance by
// whoever reads them (metrics, tests).
struct Http2Counters {
  std::atomic<std::int64_t> connections{0};  // HTTP/2 connections open
  std::atomic<std::int64_t> streams{0};      // streams in flight on them
  std::atomic<std::uint64_t> opened{0};      // HTTP/2 connections opened
};
// The process's; every worker's transport adds to it.
Http2Counters& http2_counters();

// The HTTP/2 transport (nghttp2): one connection per origin per worker
// carries many streams, and a further one is opened when the peer's
// SETTINGS_MAX_CONCURRENT_STREAMS is reached. An https origin whose ALPN
// choice is http/1.1 is handed to the HTTP/1.1 transport from then on.
class Http2Client final : public Transport {
 public:
  explicit Http2Client(const TransportDeps& deps);
  ~Http2Client() override;

  boost::asio::awaitable<Result<std::unique_ptr<Exchange>, UpstreamError>> start(
      const Origin& origin, const Request& request, const Limits& limits,
      AbortHandle& abort_handle) override;

  // Opens one HTTP/2 connection to the origin, unless it has one.
  boost::asio::awaitable<std::optional<UpstreamError>> warm(const Origin& origin,
                                                            const Limits& limits) override;

  void shut_down() override;

  // HTTP/2 connections open to the origin from this worker.
  std::size_t connection_count(const std::string& origin_key) const;

 private:
  // A connection to the origin with room for another stream, or null.
  std::shared_ptr<Http2Session> usable_session(const std::string& origin_key);
  // Opens a connection, or says the origin speaks HTTP/1.1 (null session,
  // no error).
  boost::asio::awaitable<Result<std::shared_ptr<Http2Session>, UpstreamError>> open_session(
      const Origin& origin, const Limits& limits, AbortHandle& abort_handle, Timing& timing);

  TransportDeps deps_;
  Http1Client http1_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Http2Session>>> sessions_;
  // Per origin, while a connection to it is being opened: cancelled once it
  // is ready, which wakes the requests waiting for it.
  std::unordered_map<std::string, std::shared_ptr<boost::asio::steady_timer>> opening_;
  // Origins whose ALPN choice was http/1.1: carried by http1_.
  std::unordered_set<std::string> http1_origins_;
};

}  // namespace sluice::upstream

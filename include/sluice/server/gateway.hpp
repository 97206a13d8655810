#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/intrusive/list.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "sluice/auth/stage.hpp"
#include "sluice/cache/response_cache.hpp"
#include "sluice/common/xorshift.hpp"
#include "sluice/config/config.hpp"
#include "sluice/metrics/access_log.hpp"
#include "sluice/metrics/gateway_metrics.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/protocol/adapter.hpp"
#include "sluice/router/router.hpp"
#include "sluice/server/event_loop.hpp"
#include "sluice/server/shared_state.hpp"
#include "sluice/state/redis_client.hpp"
#include "sluice/stream/relay.hpp"
#include "sluice/upstream/client.hpp"
#include "sluice/upstream/transports.hpp"

namespace sluice::server {

// Everything a request needs that belongs to one config generation. Requests
// hold the snapshot they started with, so a reload never changes a request
// midway.
struct Snapshot {
  config::ConfigPtr config;
  std::shared_ptr<router::Router> router;
  std::shared_ptr<auth::AuthStage> auth;
  std::shared_ptr<metrics::SnapshotMetrics> metrics;
  std::shared_ptr<cache::Caches> caches;  // carried over on reload, see Caches
  std::string models_json;                // GET /v1/models, rendered once
  // The listeners' TLS (server.tls, server.admin_tls), read from their files
  // for this snapshot; null while off. A connection keeps the one it was
  // accepted with.
  std::shared_ptr<boost::asio::ssl::context> listener_tls;
  std::shared_ptr<boost::asio::ssl::context> admin_tls;
  // What each deployment of `config` needs per request, made once rather
  // than per request: where it connects (pool key, Host value), the header
  // lines it adds (its `headers` and its key), the model name it is sent
  // as a JSON string literal, the adapter of the protocol it speaks, and
  // the transport that carries its requests (its place in
  // upstream::registered_transports()).
  struct DeploymentWiring {
    upstream::Origin origin;
    std::string fields;
    std::string model_literal;
    std::unique_ptr<const protocol::Adapter> adapter;
    std::size_t transport = upstream::default_transport();
    // With state.backend: redis and limits to share (has_shared_limits).
    SharedBudget shared_budget{};
  };
  std::unordered_map<const config::Deployment*, DeploymentWiring> deployments;
  // With state.backend: redis: each client key's shared budget, parallel to
  // auth->keys().keys().
  std::vector<SharedBudget> key_budgets;

  const SharedBudget& key_budget(const auth::KeyPolicy& key) const {
    return key_budgets[static_cast<std::size_t>(&key - auth->keys().keys().data())];
  }

  const DeploymentWiring& wiring(const config::Deployment& deployment) const {
    return deployments.at(&deployment);
  }
  const upstream::Origin& origin(const config::Deployment& deployment) const {
    return wiring(deployment).origin;
  }

  static std::shared_ptr<const Snapshot> build(config::ConfigPtr config,
                                               metrics::GatewayMetrics& metrics,
                                               const Snapshot* previous = nullptr);
};

class Gateway;

// A client connection as its worker sees it: enough to close it when the
// gateway drains while it waits, idle, for its next request. Linked into its
// worker's list where it lives (the connection's frame), so that tracking a
// connection allocates nothing; it leaves the list when destroyed.
struct ClientConnection {
  boost::asio::ip::tcp::socket* socket = nullptr;
  bool idle = true;  // between requests, nothing read of the next one yet
  boost::intrusive::list_member_hook<boost::intrusive::link_mode<boost::intrusive::auto_unlink>>
      worker_hook;
};

// One event-loop thread with its own io_context and upstream pool. A client
// connection lives on one worker for its whole life, so the per-connection
// and per-pool state needs no locks and no strands.
class Worker {
 public:
  Worker(Gateway& gateway, unsigned index);
  ~Worker();

  boost::asio::io_context& context() { return context_; }
  // What carries a deployment's requests: this worker's instance of its
  // transport.
  upstream::Transport& transport(const Snapshot::DeploymentWiring& wiring) {
    return transports_[wiring.transport];
  }
  // The default transport (HTTP/1.1 over pool()).
  upstream::Transport& client() { return transports_[upstream::default_transport()]; }
  upstream::Pool& pool() { return pool_; }
  // This worker's part of the shared state backend; null with the local one.
  WorkerState* shared_state() { return shared_state_.get(); }
  Gateway& gateway() { return gateway_; }
  unsigned index() const { return index_; }
  std::uint64_t next_random();
  // Counted only while busy polling is configured.
  const EventLoopCounters& loop_counters() const { return loop_counters_; }
  // The snapshot requests on this worker start with. Read and replaced on
  // the worker's own thread only (Gateway::apply posts the new one).
  const std::shared_ptr<const Snapshot>& snapshot() const { return snapshot_; }

  // What a connection's requests relay in (stream/relay.hpp), lent for the
  // connection's life and kept for the next connection once given back: a
  // new connection allocates none of it. Called on the worker's own thread
  // only.
  struct GiveBackRelayBuffers {
    Worker* worker;
    void operator()(stream::Relay::Buffers* buffers) const;
  };
  using RelayBuffersLoan = std::unique_ptr<stream::Relay::Buffers, GiveBackRelayBuffers>;
  RelayBuffersLoan lend_relay_buffers();
  std::size_t spare_relay_buffers() const { return spare_relay_buffers_.size(); }

  // Called on the worker's own thread only.
  void track(ClientConnection& connection) {
    connections_.push_back(connection);
    ++connections_taken_;
  }
  // Client connections this worker has served since it started.
  std::uint64_t connections_taken() const { return connections_taken_; }
  static void untrack(ClientConnection& connection) { connection.worker_hook.unlink(); }
  std::size_t client_connections() const { return connections_.size(); }
  // Closes the connections that wait idle for a next request; busy ones
  // finish their request and then close, because the gateway is draining.
  void close_idle_connections();
  // Starts opening connections until each upstream origin of the current
  // config has its deployments' warm_connections idle in this worker's pool
  // (each worker has its own pool, so N workers open N times as many).
  // Failures are logged at debug and tried again on the next call.
  void keep_warm();

 private:
  friend class Gateway;
  void take_snapshot(std::shared_ptr<const Snapshot> snapshot);
  boost::asio::awaitable<void> warm_one(std::string origin_key, upstream::Origin origin,
                                        std::chrono::milliseconds connect_timeout);

  std::shared_ptr<const Snapshot> snapshot_;
  boost::intrusive::list<
      ClientConnection,
      boost::intrusive::member_hook<ClientConnection, decltype(ClientConnection::worker_hook),
                                    &ClientConnection::worker_hook>,
      boost::intrusive::constant_time_size<false>>
      connections_;
  std::uint64_t connections_taken_ = 0;
  // Given back by connections that ended, at most kSpareRelayBuffers of them.
  std::vector<std::unique_ptr<stream::Relay::Buffers>> spare_relay_buffers_;
  // Connections being opened by keep_warm, per origin.
  std::unordered_map<std::string, unsigned> warming_;
  Gateway& gateway_;
  unsigned index_;
  // The pool is declared before the context so that it outlives the
  // coroutine frames the context destroys, which may still give connections
  // back to it.
  upstream::Pool pool_;
  upstream::Transports transports_;
  // One thread runs it and only that thread touches its sockets and timers
  // (new connections are handed over as descriptors, and the listener is
  // registered before the thread starts), so the reactor takes no locks:
  // neither per socket operation nor to register a socket or arm a timer.
  // Only the scheduler locks, because other threads post to it.
  boost::asio::io_context context_{static_cast<int>(BOOST_ASIO_CONCURRENCY_HINT_ID |
                                                    BOOST_ASIO_CONCURRENCY_HINT_LOCKING_SCHEDULER)};
  // After the context: its socket and timers go before the context does.
  std::unique_ptr<WorkerState> shared_state_;
  Xorshift64Star random_;  // per worker: no shared state on the request path
  EventLoopCounters loop_counters_;
  std::thread thread_;
};

// What a config reload came to.
struct ReloadOutcome {
  std::string error;  // why the new config was refused; "" when it was applied
  // Settings the new config changes that the gateway took at start (see
  // Gateway::apply): they keep their running values until a restart.
  std::vector<std::string> restart_required;
};

// The whole server: listener, workers, the current config snapshot. Used by
// the binary and, in-process, by the integration tests.
class Gateway {
 public:
  explicit Gateway(const config::ConfigPtr& config);
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Binds the listener (throws on failure) and starts the worker threads.
  void start();
  // Stops accepting, closes every connection and joins the threads.
  void stop();
  // Graceful stop: stops accepting, lets requests in flight (streams
  // included) finish for up to `drain_timeout`, closes idle connections at
  // once, then stops.
  void drain_and_stop(std::chrono::milliseconds drain_timeout);
  bool draining() const { return draining_.load(std::memory_order_relaxed); }

  std::uint16_t port() const { return bound_port_; }
  std::string listen_url() const;

  // The current snapshot, for threads other than the workers (admin,
  // reload, tests); a worker reads its own copy, Worker::snapshot().
  std::shared_ptr<const Snapshot> snapshot() const {
    std::lock_guard lock(snapshot_mutex_);
    return snapshot_;
  }
  // Replaces the snapshot for new requests; in-flight ones finish on theirs.
  // Returns once every worker has the new one, so a request sent after it
  // returns is served by `config`; a worker must therefore never call it.
  // Returns the YAML paths of the settings taken at start that `config`
  // changes (config::start_only_changes), which keep their running values.
  std::vector<std::string> apply(const config::ConfigPtr& config);

  std::atomic<unsigned>& open_connections() { return open_connections_; }
  metrics::Registry& registry() { return registry_; }
  metrics::GatewayMetrics& metrics() { return *metrics_; }
  metrics::AccessLog& access_log() { return *access_log_; }
  // The admin listener's port (0 when it is off).
  std::uint16_t admin_port() const { return admin_port_; }
  // What SIGHUP and POST /admin/reload run. The binary sets it to re-read
  // its config file.
  void set_reload_handler(std::function<ReloadOutcome()> handler) {
    reload_handler_ = std::move(handler);
  }
  ReloadOutcome reload();
  // Run on a worker's own thread when it has gone quiet after work: no
  // upstream connection in use, and none taken nor a client connection
  // accepted for a second or more. Once per quiet spell; set before start().
  // The binary has its allocator give back the pages that work freed.
  void set_quiet_hook(std::function<void()> hook) { quiet_hook_ = std::move(hook); }
  upstream::DnsCache& dns() { return dns_; }
  upstream::TlsContexts& tls() { return tls_; }
  // Whether the shared state backend answers; null with the local backend.
  state::BackendStatus* state_status() const { return state_status_.get(); }
  std::vector<std::unique_ptr<Worker>>& workers() { return workers_; }

 private:
  // Declared first: snapshots hold handles into the registry.
  metrics::Registry registry_;
  std::unique_ptr<metrics::GatewayMetrics> metrics_;
  std::unique_ptr<metrics::AccessLog> access_log_;
  // Not a std::atomic<std::shared_ptr>: libstdc++ 12's load() releases its
  // internal lock with a relaxed store, so its read of the pointer is not
  // ordered before the next store's write (ThreadSanitizer reports it; on a
  // weakly ordered CPU a load could pair the new pointer with the old
  // count). Requests do not read this one anyway (Worker::snapshot).
  mutable std::mutex snapshot_mutex_;
  std::shared_ptr<const Snapshot> snapshot_;
  upstream::DnsCache dns_;
  upstream::TlsContexts tls_;
  std::unique_ptr<state::BackendStatus> state_status_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor_;
  // The admin listener has a thread of its own, so rendering metrics or
  // loading a config file never holds up an event loop that serves clients.
  std::unique_ptr<boost::asio::io_context> admin_context_;
  std::thread admin_thread_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> admin_acceptor_;
  std::uint16_t admin_port_ = 0;
  std::function<ReloadOutcome()> reload_handler_;
  std::function<void()> quiet_hook_;
  std::mutex reload_mutex_;
  std::uint16_t bound_port_ = 0;
  std::string bound_host_;
  std::atomic<unsigned> open_connections_{0};
  std::atomic<bool> draining_{false};
  std::mutex lifecycle_mutex_;
  bool running_ = false;
  // The config start() took its listeners, threads and pools from.
  config::ConfigPtr started_with_;
};

}  // namespace sluice::server

#include "sluice/server/gateway.hpp"

#include "sluice/upstream/http2_client.hpp"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <future>
#include <optional>
#include <random>
#include <utility>

#include "sluice/common/json_scan.hpp"
#include "sluice/http/relay_socket.hpp"
#include "sluice/protocol/adapters.hpp"
#include "sluice/router/adaptive.hpp"
#include "sluice/server/admin.hpp"
#include "sluice/server/internal_errors.hpp"
#include "sluice/server/listener_tls.hpp"
#include "sluice/server/model_list.hpp"
#include "sluice/server/session.hpp"

namespace sluice::server {

namespace net = boost::asio;
using net::as_tuple;
using net::use_awaitable;
using net::ip::tcp;

std::shared_ptr<const Snapshot> Snapshot::build(config::ConfigPtr config,
                                                metrics::GatewayMetrics& metrics,
                                                const Snapshot* previous) {
  auto snapshot = std::make_shared<Snapshot>();
  snapshot->metrics = std::make_shared<metrics::SnapshotMetrics>(metrics, config);
  snapshot->router =
      std::make_shared<router::Router>(config, previous ? previous->router.get() : nullptr);
  snapshot->auth =
      std::make_shared<auth::AuthStage>(*config, previous ? previous->auth.get() : nullptr);
  snapshot->caches =
      std::make_shared<cache::Caches>(*config, previous ? previous->caches.get() : nullptr);
  snapshot->models_json = render_model_list(*config, nullptr);
  if (config->server.tls.enabled()) {
    snapshot->listener_tls = make_listener_tls(config->server.tls, "server.tls");
  }
  if (config->server.admin_tls.enabled()) {
    snapshot->admin_tls = make_listener_tls(config->server.admin_tls, "server.admin_tls");
  }
  for (const auto& model : config->models) {
    for (const auto& deployment : model.deployments) {
      std::string fields = upstream::deployment_fields(deployment);
      std::string model_literal;
      append_json_string(model_literal, deployment.upstream_model);
      auto origin = upstream::Origin::from(deployment, config->upstream);
      const std::size_t transport = upstream::transport_for(origin);
      auto& wiring =
          snapshot->deployments
              .emplace(&deployment,
                       Snapshot::DeploymentWiring{std::move(origin), std::move(fields),
                                                  std::move(model_literal),
                                                  protocol::make_adapter(deployment), transport})
              .first->second;
      if (config->state.shared() && has_shared_limits(deployment)) {
        wiring.shared_budget = shared_deployment_budget(config->state, deployment);
      }
    }
  }
  if (config->state.shared()) {
    for (const auto& key : snapshot->auth->keys().keys()) {
      snapshot->key_budgets.push_back(shared_key_budget(config->state, key));
    }
  }
  snapshot->config = std::move(config);
  return snapshot;
}

Worker::Worker(Gateway& gateway, unsigned index)
    : gateway_(gateway),
      index_(index),
      pool_(upstream::PoolOptions{gateway.snapshot()->config->upstream.max_idle_per_origin,
                                  gateway.snapshot()->config->upstream.idle_expiry}),
      transports_(upstream::TransportDeps{pool_, gateway.dns(), gateway.tls()}),
      random_(std::random_device{}() | (std::uint64_t{std::random_device{}()} << 32)) {
  take_snapshot(gateway.snapshot());
  if (auto* status = gateway.state_status()) {
    shared_state_ =
        std::make_unique<WorkerState>(context_, snapshot_->config->state, *status, next_random());
  }
}

void Worker::take_snapshot(std::shared_ptr<const Snapshot> snapshot) {
  // Requests copy the worker's handle, and a copy of the gateway's would
  // move that handle's count between cores on every request. This handle
  // has a count of its own that only this thread touches, and keeps the
  // gateway's alive.
  auto holder = std::make_shared<std::shared_ptr<const Snapshot>>(std::move(snapshot));
  const Snapshot* shared = holder->get();
  snapshot_ = std::shared_ptr<const Snapshot>(std::move(holder), shared);
}

Worker::~Worker() {
  context_.stop();
  if (thread_.joinable()) thread_.join();
  pool_.shut_down();
  transports_.shut_down();
}

namespace {

// Enough for the connections a worker opens and ends at a steady rate; a
// burst past it gives the rest back to the allocator as it ends.
constexpr std::size_t kSpareRelayBuffers = 256;

}  // namespace

Worker::RelayBuffersLoan Worker::lend_relay_buffers() {
  if (spare_relay_buffers_.empty()) {
    return RelayBuffersLoan(new stream::Relay::Buffers, GiveBackRelayBuffers{this});
  }
  RelayBuffersLoan loan(spare_relay_buffers_.back().release(), GiveBackRelayBuffers{this});
  spare_relay_buffers_.pop_back();
  return loan;
}

void Worker::GiveBackRelayBuffers::operator()(stream::Relay::Buffers* buffers) const {
  std::unique_ptr<stream::Relay::Buffers> given(buffers);
  auto& spares = worker->spare_relay_buffers_;
  if (spares.size() >= kSpareRelayBuffers) return;
  given->release_grown();
  spares.push_back(std::move(given));
}

void Worker::close_idle_connections() {
  for (auto& connection : connections_) {
    if (connection.idle) {
      error_code ignored;
      connection.socket->cancel(ignored);
    }
  }
}

void Worker::keep_warm() {
  struct Wanted {
    upstream::Origin origin;
    std::size_t count = 0;
    std::chrono::milliseconds connect_timeout{0};
  };
  std::unordered_map<std::string, Wanted> wanted;
  auto snapshot = snapshot_;
  for (const auto& model : snapshot->config->models) {
    for (const auto& deployment : model.deployments) {
      if (deployment.warm_connections == 0) continue;
      const auto& origin = snapshot->origin(deployment);
      auto& entry = wanted[origin.key()];
      if (entry.count == 0) entry.origin = origin;
      entry.count += deployment.warm_connections;
      entry.connect_timeout = std::max(entry.connect_timeout, deployment.timeouts.connect);
    }
  }
  for (auto& [key, entry] : wanted) {
    // More than the pool keeps would be closed as soon as they were opened.
    // An HTTP/2 transport keeps one connection of its own and takes the
    // further warm-ups as done; an origin whose ALPN chose HTTP/1.1 fills
    // the pool like any other.
    auto target = std::min<std::size_t>(entry.count, pool_.options().max_idle_per_origin);
    for (auto have = pool_.idle_count(key) + warming_[key]; have < target; ++have) {
      ++warming_[key];
      net::co_spawn(context_, warm_one(key, entry.origin, entry.connect_timeout),
                    InternalErrorBarrier(*this, "warming an upstream connection"));
    }
  }
}

net::awaitable<void> Worker::warm_one(std::string origin_key, upstream::Origin origin,
                                      std::chrono::milliseconds connect_timeout) {
  // Counted by keep_warm(), given back however this ends: a count left
  // raised would keep the origin from being warmed again.
  struct Warming {
    unsigned& count;
    ~Warming() { --count; }
  } warming{warming_[origin_key]};
  upstream::Limits limits;
  limits.connect = connect_timeout;
  auto error = co_await transports_[upstream::transport_for(origin)].warm(origin, limits);
  if (error) spdlog::debug("warming a connection to {} failed: {}", origin_key, error->describe());
}

std::uint64_t Worker::next_random() { return random_(); }

namespace {
unsigned thread_count(const config::Config& config) { return std::max(1u, config.server.threads); }

metrics::AccessLogOptions access_log_options(const config::Config& config) {
  metrics::AccessLogOptions options;
  options.destination = config.log.access_log;
  options.format =
      config.log.format == "text" ? metrics::AccessLogFormat::text : metrics::AccessLogFormat::json;
  return options;
}
}  // namespace

Gateway::Gateway(const config::ConfigPtr& config)
    : registry_(thread_count(*config)), dns_(config->upstream.dns_ttl) {
  metrics::GatewayMetricsSources sources;
  // Read at scrape time from the admin thread: the pool gauges and the
  // deployment states are atomics.
  sources.upstream_connections = [this] {
    metrics::UpstreamConnectionCounts counts;
    for (auto& worker : workers_) {
      counts.idle += static_cast<std::uint64_t>(
          std::max<std::int64_t>(0, worker->pool().counters().idle.load()));
      counts.active += static_cast<std::uint64_t>(
          std::max<std::int64_t>(0, worker->pool().counters().active.load()));
    }
    counts.streams = static_cast<std::uint64_t>(
        std::max<std::int64_t>(0, upstream::http2_counters().streams.load()));
    return counts;
  };
  if (config->state.shared()) {
    sources.state_backend_up = [this] { return state_status_ && state_status_->up(); };
  }
  sources.deployment_cooldowns = [this](std::vector<metrics::DeploymentCooldown>& out) {
    auto current = snapshot();
    auto now = Clock::now();
    for (const auto& model : current->config->models) {
      for (const auto& deployment : model.deployments) {
        auto* state = current->router->state(deployment.id);
        out.push_back({deployment.id, state && state->cooling_down(now)});
      }
    }
  };
  sources.deployment_deadlines = [this](std::vector<metrics::DeploymentDeadlines>& out) {
    auto current = snapshot();
    auto now = Clock::now();
    for (const auto& model : current->config->models) {
      for (const auto& deployment : model.deployments) {
        auto* state = current->router->state(deployment.id);
        if (!state || !deployment.timeouts.adaptive()) continue;
        const auto deadlines =
            router::current_deadlines(deployment, current->config->router.adaptive, *state, now);
        out.push_back({deployment.id, std::chrono::duration<double>(deadlines.ttft).count(),
                       std::chrono::duration<double>(deadlines.idle).count()});
      }
    }
  };
  sources.concurrency_limits = [this](std::vector<metrics::DeploymentLimit>& out) {
    auto current = snapshot();
    for (const auto& model : current->config->models) {
      for (const auto& deployment : model.deployments) {
        auto* state = current->router->state(deployment.id);
        if (!state || !deployment.max_parallel_auto) continue;
        out.push_back({deployment.id, state->concurrency.current()});
      }
    }
  };
  metrics_ = std::make_unique<metrics::GatewayMetrics>(registry_, std::move(sources));
  access_log_ = std::make_unique<metrics::AccessLog>(access_log_options(*config));
  snapshot_ = Snapshot::build(config, *metrics_);
}

ReloadOutcome Gateway::reload() {
  std::lock_guard lock(reload_mutex_);
  if (!reload_handler_) {
    return {"reload is not available: the gateway was not started from a file", {}};
  }
  return reload_handler_();
}

Gateway::~Gateway() { stop(); }

std::string Gateway::listen_url() const {
  bool ipv6 = bound_host_.find(':') != std::string::npos;
  const bool tls = snapshot()->listener_tls != nullptr;
  return (tls ? "https://" : "http://") + (ipv6 ? "[" + bound_host_ + "]" : bound_host_) + ":" +
         std::to_string(bound_port_);
}

std::vector<std::string> Gateway::apply(const config::ConfigPtr& config) {
  auto next = Snapshot::build(config, *metrics_, snapshot().get());
  {
    std::lock_guard lock(snapshot_mutex_);
    snapshot_ = next;
  }
  std::lock_guard lock(lifecycle_mutex_);
  if (!running_) return {};
  // The workers keep running while the lifecycle lock is held (only stop()
  // ends them), so each task below runs and the wait ends.
  std::vector<std::future<void>> taken;
  for (auto& worker : workers_) {
    std::promise<void> promise;
    taken.push_back(promise.get_future());
    net::post(worker->context(), [w = worker.get(), next, promise = std::move(promise)]() mutable {
      w->take_snapshot(next);
      w->keep_warm();
      promise.set_value();
    });
  }
  for (auto& done : taken) done.wait();
  return config::start_only_changes(*started_with_, *config);
}

namespace {

// A connection the listener took, not yet a socket. Its worker makes it one
// on its own thread: worker contexts do not lock their sockets' reactor
// state (see Worker::context_), so not even the registration of a new socket
// may come from another thread.
class AcceptedDescriptor {
 public:
  explicit AcceptedDescriptor(int descriptor) : descriptor_(descriptor) {}
  AcceptedDescriptor(AcceptedDescriptor&& other) noexcept
      : descriptor_(std::exchange(other.descriptor_, -1)) {}
  AcceptedDescriptor& operator=(AcceptedDescriptor&&) = delete;
  AcceptedDescriptor(const AcceptedDescriptor&) = delete;
  AcceptedDescriptor& operator=(const AcceptedDescriptor&) = delete;
  // Closed unless a socket took it (a worker that stopped first, say).
  ~AcceptedDescriptor() {
    if (descriptor_ >= 0) ::close(descriptor_);
  }

  // On the worker's thread: the socket that owns the connection from now.
  std::optional<tcp::socket> into_socket(net::io_context& context, const tcp& protocol) {
    tcp::socket socket(context);
    error_code ec;
    socket.assign(protocol, descriptor_, ec);
    if (ec) {
      spdlog::warn("could not take an accepted connection: {}", ec.message());
      return std::nullopt;
    }
    descriptor_ = -1;
    return socket;
  }

 private:
  int descriptor_;
};

// On `worker`'s thread: serves the connection, or answers it 503.
void take_connection(Gateway& gateway, Worker& worker, AcceptedDescriptor accepted, tcp protocol,
                     bool refused) {
  auto socket = accepted.into_socket(worker.context(), protocol);
  if (!socket) {
    if (!refused) gateway.open_connections().fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  if (const auto& tls = worker.snapshot()->listener_tls) {
    net::co_spawn(worker.context(), serve_tls_connection(worker, std::move(*socket), tls, refused),
                  InternalErrorBarrier(worker, "a TLS client connection"));
    return;
  }
  if (refused) {
    net::co_spawn(worker.context(), refuse_connection(std::move(*socket)),
                  InternalErrorBarrier(worker, "refusing a connection"));
  } else {
    net::co_spawn(worker.context(), serve_connection(worker, std::move(*socket)),
                  InternalErrorBarrier(worker, "a client connection"));
  }
}

// Hands a connection to `worker`, to be served, or answered 503 when the
// gateway holds server.max_connections already. Runs on the accepting
// worker's thread, the only one that adds to the count.
void admit(Gateway& gateway, Worker& accepting, Worker& worker, AcceptedDescriptor accepted,
           tcp protocol) {
  const auto limit = accepting.snapshot()->config->server.max_connections;
  const bool refused = gateway.open_connections().load(std::memory_order_relaxed) >= limit;
  if (!refused) gateway.open_connections().fetch_add(1, std::memory_order_relaxed);
  // A connection the accepting worker keeps starts at once: a trip through
  // its queue would cost an operation's allocation and a turn of the loop.
  // It runs until its first wait (most often through its first request,
  // which came with the connection) before the next one is taken.
  if (&worker == &accepting) {
    take_connection(gateway, worker, std::move(accepted), protocol, refused);
    return;
  }
  net::post(worker.context(),
            [&gateway, &worker, refused, protocol, accepted = std::move(accepted)]() mutable {
              take_connection(gateway, worker, std::move(accepted), protocol, refused);
            });
}

// Connections that arrive together are taken without waiting for each: at
// most this many per wake-up, so the other connections of the accepting
// worker are not starved during a burst.
constexpr int kAcceptsPerWakeup = 64;

// One worker accepts for all and hands the connections round, so that each
// worker serves as many as the others, whatever their addresses.
net::awaitable<void> accept_connections(Gateway& gateway, Worker& accepting,
                                        tcp::acceptor& acceptor) {
  auto& workers = gateway.workers();
  const tcp protocol = acceptor.local_endpoint().protocol();
  std::size_t next = 0;
  for (;;) {
    auto [ec] = co_await acceptor.async_wait(tcp::acceptor::wait_read, as_tuple(use_awaitable));
    if (ec == net::error::operation_aborted || !acceptor.is_open() || gateway.draining()) co_return;
    if (ec) spdlog::warn("waiting for connections failed: {}", ec.message());
    bool failed = static_cast<bool>(ec);
    for (int taken = 0; !failed && taken < kAcceptsPerWakeup;) {
      const int descriptor =
          ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (descriptor >= 0) {
        ++taken;
        AcceptedDescriptor accepted(descriptor);
        try {
          inject_fault(FaultPoint::connection_accepted);
          admit(gateway, accepting, *workers[next++ % workers.size()], std::move(accepted),
                protocol);
        } catch (...) {
          // A bug costs the connection (closed with `accepted`), not the
          // listener: accepting goes on.
          report_internal_error(accepting, "accepting connections", std::current_exception());
        }
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // A connection reset while it was queued: take the next one.
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors, say: pause briefly rather than spin, then keep
      // accepting.
      spdlog::warn("accept failed: {}",
                   error_code(errno, boost::system::system_category()).message());
      failed = true;
      break;
    }
    if (failed) {
      net::steady_timer pause(acceptor.get_executor(), std::chrono::milliseconds(10));
      co_await pause.async_wait(as_tuple(use_awaitable));
    }
  }
}

net::awaitable<void> sweep_idle_connections(Worker& worker) {
  using std::chrono::milliseconds;
  net::steady_timer timer(worker.context());
  worker.keep_warm();
  for (;;) {
    // Often enough that a warm connection the upstream closed is replaced
    // within seconds.
    auto expiry = worker.pool().options().idle_expiry;
    timer.expires_after(
        std::clamp<milliseconds>(expiry / 2, milliseconds(250), milliseconds(5000)));
    auto [ec] = co_await timer.async_wait(as_tuple(use_awaitable));
    if (ec) co_return;
    worker.pool().close_expired(Clock::now());
    worker.keep_warm();
  }
}

// Runs `hook` once `worker` has gone quiet after work: checked every
// second, a worker is quiet when it took no client connection and no
// upstream connection for longer than `quiet_for` and has none in use (a
// second longer: what it freed last is then older than `quiet_for` too). A
// worker that stays busy never runs it, and a quiet one runs it once.
net::awaitable<void> report_quiet(Worker& worker, const std::function<void()>& hook,
                                  std::chrono::milliseconds quiet_for) {
  net::steady_timer timer(worker.context());
  const auto& counters = worker.pool().counters();
  const auto work_done = [&] {
    return worker.connections_taken() + counters.opened.load(std::memory_order_relaxed) +
           counters.reused.load(std::memory_order_relaxed);
  };
  constexpr auto kCheckEvery = std::chrono::seconds(1);
  std::uint64_t seen = work_done();
  bool worked = false;
  std::chrono::milliseconds quiet{0};
  for (;;) {
    timer.expires_after(kCheckEvery);
    auto [ec] = co_await timer.async_wait(as_tuple(use_awaitable));
    if (ec) co_return;
    const std::uint64_t now = work_done();
    if (now != seen || counters.active.load(std::memory_order_relaxed) > 0) {
      seen = now;
      worked = true;
      quiet = std::chrono::milliseconds(0);
    } else if (worked && (quiet += kCheckEvery) > quiet_for) {
      worked = false;
      hook();
    }
  }
}

}  // namespace

void Gateway::start() {
  std::lock_guard lock(lifecycle_mutex_);
  if (running_) return;
  auto config = snapshot()->config;
  started_with_ = config;
  unsigned threads = std::max(1u, config->server.threads);
  if (config->state.shared()) {
    const auto& redis = config->state.redis;
    // Said once at start, either way: the gateway runs on local state until
    // Redis answers, and a wrong password is worth knowing before traffic.
    if (auto failure = state::RedisClient::probe(redis)) {
      spdlog::error(
          "state: Redis at {} did not accept the connection: {}; limits, cooldowns and "
          "the cache stay per instance until it does",
          redis.url, *failure);
    } else {
      spdlog::info("state: Redis at {} answered; limits are shared through it", redis.url);
    }
    state_status_ = std::make_unique<state::BackendStatus>(threads, redis.url);
  }
  for (unsigned i = 0; i < threads; ++i) workers_.push_back(std::make_unique<Worker>(*this, i));

  auto& accept_context = workers_[0]->context();
  tcp::endpoint endpoint(net::ip::make_address(config->server.listen_host),
                         config->server.listen_port);
  acceptor_ = std::make_unique<tcp::acceptor>(accept_context);
  acceptor_->open(endpoint.protocol());
  acceptor_->set_option(net::socket_base::reuse_address(true));
  acceptor_->bind(endpoint);
  acceptor_->listen(net::socket_base::max_listen_connections);
  acceptor_->non_blocking(true);
  prepare_relay_listener(*acceptor_);
  bound_port_ = acceptor_->local_endpoint().port();
  bound_host_ = acceptor_->local_endpoint().address().to_string();

  net::co_spawn(accept_context, accept_connections(*this, *workers_[0], *acceptor_),
                InternalErrorBarrier(*workers_[0], "accepting connections"));

  if (config->server.admin_enabled) {
    tcp::endpoint admin_endpoint(net::ip::make_address(config->server.admin_host),
                                 config->server.admin_port);
    admin_context_ = std::make_unique<net::io_context>(1);
    admin_acceptor_ = std::make_unique<tcp::acceptor>(*admin_context_);
    admin_acceptor_->open(admin_endpoint.protocol());
    admin_acceptor_->set_option(net::socket_base::reuse_address(true));
    admin_acceptor_->bind(admin_endpoint);
    admin_acceptor_->listen();
    admin_port_ = admin_acceptor_->local_endpoint().port();
    net::co_spawn(*admin_context_, serve_admin(*this, *admin_acceptor_), net::detached);
    admin_thread_ = std::thread([context = admin_context_.get()] { context->run(); });
  }
  if (workers_[0]->shared_state_) {
    net::co_spawn(workers_[0]->context(), share_cooldowns(*workers_[0]),
                  InternalErrorBarrier(*workers_[0], "sharing cooldowns"));
  }
  for (auto& worker : workers_) {
    if (worker->shared_state_) worker->shared_state_->start();
    net::co_spawn(worker->context(), sweep_idle_connections(*worker),
                  InternalErrorBarrier(*worker, "closing expired upstream connections"));
    if (quiet_hook_) {
      net::co_spawn(worker->context(),
                    report_quiet(*worker, quiet_hook_, config->server.memory_release_after),
                    InternalErrorBarrier(*worker, "reporting a quiet worker"));
    }
    worker->thread_ = std::thread([&worker = *worker, busy_poll = config->server.busy_poll] {
      run_event_loop(worker.context_, busy_poll, worker.loop_counters_);
    });
  }
  running_ = true;
}

void Gateway::drain_and_stop(std::chrono::milliseconds drain_timeout) {
  {
    std::lock_guard lock(lifecycle_mutex_);
    if (!running_) return;
    draining_ = true;
    net::post(acceptor_->get_executor(), [acceptor = acceptor_.get()] {
      error_code ignored;
      acceptor->close(ignored);
    });
    for (auto& worker : workers_) {
      net::post(worker->context(), [w = worker.get()] { w->close_idle_connections(); });
    }
  }
  auto deadline = Clock::now() + drain_timeout;
  while (open_connections_.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // A connection that turned idle after the first sweep is closed too.
    std::lock_guard lock(lifecycle_mutex_);
    for (auto& worker : workers_) {
      net::post(worker->context(), [w = worker.get()] { w->close_idle_connections(); });
    }
  }
  if (open_connections_.load() > 0) {
    spdlog::warn("drain timeout: closing {} connections still open", open_connections_.load());
  }
  stop();
}

void Gateway::stop() {
  std::lock_guard lock(lifecycle_mutex_);
  if (!running_) return;
  running_ = false;
  for (auto& worker : workers_) worker->context().stop();
  if (admin_context_) admin_context_->stop();
  for (auto& worker : workers_) {
    if (worker->thread_.joinable()) worker->thread_.join();
  }
  if (admin_thread_.joinable()) admin_thread_.join();
  acceptor_.reset();
  admin_acceptor_.reset();
  admin_context_.reset();
  workers_.clear();
}

}  // namespace sluice::server

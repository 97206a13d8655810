#include "sluice/doctor/probe.hpp"

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <exception>
#include <memory>
#include <optional>
#include <random>

#include "sluice/common/clock.hpp"
#include "sluice/common/json_scan.hpp"
#include "sluice/protocol/adapters.hpp"
#include "sluice/upstream/client.hpp"

namespace sluice::doctor {

namespace net = boost::asio;

namespace {

// What every request to the deployment shares, made as the gateway's
// snapshot makes it.
struct Wiring {
  const config::Deployment& deployment;
  upstream::Origin origin;
  std::string fields;
  std::unique_ptr<protocol::Adapter> adapter;
  std::string model_literal;
};

struct Outcome {
  std::string failure;  // empty when the request got its first token
  double connect_ms = 0;
  double tls_ms = 0;
  double ttfb_ms = 0;  // request sent -> response head
  double ttft_ms = 0;  // attempt started -> first body byte
};

constexpr std::string_view kProbeFields =
    "Content-Type: application/json\r\nAccept: text/event-stream\r\n";
// How much of a refusal's body goes into the report.
constexpr std::size_t kQuotedBody = 200;

std::string describe(const upstream::UpstreamError& error) {
  using upstream::Failure;
  const std::string detail = error.ec ? ": " + error.ec.message() : std::string();
  switch (error.failure) {
    case Failure::dns:
      return "DNS lookup failed" + detail;
    case Failure::connect:
      return "cannot connect" + detail;
    case Failure::connect_timeout:
      return "connect timed out" + detail;
    case Failure::tls:
      return "TLS handshake failed" + detail;
    case Failure::first_byte_timeout:
      return "no first byte within timeouts.ttft";
    default:
      return error.describe();
  }
}

net::awaitable<Outcome> send_one(upstream::Http1Client& client, const Wiring& wiring,
                                 const std::string& body) {
  Outcome outcome;
  const auto& deployment = wiring.deployment;
  upstream::Request request{"POST",
                            {deployment.base_url.path_prefix, "/chat/completions", ""},
                            {kProbeFields, "", wiring.fields},
                            {body}};
  std::string adapted;
  if (!wiring.adapter->passes_through(protocol::Dialect::openai)) {
    if (auto refusal = wiring.adapter->adapt_request(request, adapted)) {
      outcome.failure =
          "the " + deployment.provider + " adapter refused the request: " + refusal->message;
      co_return outcome;
    }
  }
  const auto now = Clock::now();
  upstream::Limits limits{deployment.timeouts.connect, deployment.timeouts.ttft,
                          deployment.timeouts.idle, now + deployment.timeouts.total, now};
  upstream::AbortHandle abort_handle;
  auto started = co_await client.start(wiring.origin, request, limits, abort_handle);
  if (!started) {
    outcome.failure = describe(started.error());
    co_return outcome;
  }
  auto& exchange = *started.value();
  const auto& timing = exchange.timing();
  outcome.connect_ms = to_ms(timing.connected - timing.started);
  outcome.tls_ms = to_ms(timing.secured - timing.connected);
  outcome.ttfb_ms = to_ms(timing.first_byte - timing.sent);
  const bool refused = exchange.status() != 200;
  std::string quoted;
  std::array<char, 8192> buffer;
  std::optional<TimePoint> first_data;
  for (;;) {
    // What the connection holds already, else a read of the socket.
    auto read = exchange.read_buffered_body(buffer.data(), buffer.size());
    if (!read) read = co_await exchange.read_body(buffer.data(), buffer.size());
    if (!*read) {
      if (!refused) outcome.failure = describe(read->error());
      break;
    }
    const std::size_t bytes = read->value();
    if (bytes == 0) break;
    if (!first_data) first_data = Clock::now();
    if (refused && quoted.size() < kQuotedBody) {
      quoted.append(buffer.data(), std::min(bytes, kQuotedBody - quoted.size()));
    }
  }
  exchange.note_finished(Clock::now());
  if (refused) {
    for (char& c : quoted) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    outcome.failure = "HTTP " + std::to_string(exchange.status()) +
                      (quoted.empty() ? std::string() : ": " + quoted);
  } else if (outcome.failure.empty() && !first_data) {
    outcome.failure = "the answer had no body";
  } else if (first_data) {
    outcome.ttft_ms = to_ms(*first_data - timing.started);
  }
  co_return outcome;
}

// Runs task(0) ... task(count - 1) at once on this thread and waits for all.
template <class Task>
net::awaitable<void> all_at_once(unsigned count, Task task) {
  auto executor = co_await net::this_coro::executor;
  net::steady_timer all_done(executor, TimePoint::max());
  unsigned left = count;
  for (unsigned i = 0; i < count; ++i) {
    net::co_spawn(
        executor,
        [&, i]() -> net::awaitable<void> {
          co_await task(i);
          if (--left == 0) all_done.cancel();
        },
        net::detached);
  }
  if (left > 0) co_await all_done.async_wait(net::as_tuple(net::use_awaitable));
}

class Prober {
 public:
  Prober(Measurement& measurement, Wiring& wiring, const Plan& plan, const Progress& progress)
      : m_(measurement),
        wiring_(wiring),
        plan_(plan),
        progress_(progress),
        pool_(pool_options()),
        dns_(std::chrono::minutes(10)),
        client_(upstream::ClientDeps{pool_, dns_, tls_}),
        nonce_(std::random_device{}()) {
    small_body_ = probe_body(wiring_.model_literal, synthetic_prompt(kSmallPromptTokens, nonce_));
  }

  ~Prober() { pool_.shut_down(); }

  net::awaitable<void> run() {
    // Bound first: GCC 12 miscompiles a co_await inside a condition.
    const bool reached = co_await network();
    if (!reached) co_return;
    co_await prompt_sizes();
    co_await queueing();
  }

 private:
  static upstream::PoolOptions pool_options() {
    return upstream::PoolOptions{64, std::chrono::minutes(10)};
  }

  // Counts the request; false when it failed. The first request's failure
  // is the deployment's; a later one is counted and its sample left out.
  bool settle(const Outcome& outcome, std::string_view step) {
    ++m_.requests_sent;
    progress_(step, m_.requests_sent, plan_.requests());
    if (outcome.failure.empty()) return true;
    if (m_.requests_sent == 1) {
      m_.failure = outcome.failure;
    } else {
      ++m_.requests_failed;
      m_.last_error = outcome.failure;
    }
    return false;
  }

  upstream::Limits connect_limits() const {
    const auto now = Clock::now();
    return upstream::Limits{wiring_.deployment.timeouts.connect, wiring_.deployment.timeouts.ttft,
                            wiring_.deployment.timeouts.idle, TimePoint::max(), now};
  }

  // Keeps at least `count` idle connections in the pool, opened at once,
  // so that a burst measures the deployment rather than the handshakes.
  net::awaitable<void> warm(unsigned count) {
    const auto idle = pool_.idle_count(wiring_.origin.key());
    if (idle >= count) co_return;
    const auto missing = static_cast<unsigned>(count - idle);
    auto open_one = [this](unsigned) -> net::awaitable<void> {
      auto limits = connect_limits();
      co_await client_.warm(wiring_.origin, limits);
    };
    co_await all_at_once(missing, open_one);
  }

  // Step 1: k requests on fresh connections (each with a name cache and a
  // pool of its own, so DNS, TCP and TLS are all paid and timed), then k on
  // one kept-alive connection.
  net::awaitable<bool> network() {
    const auto& origin = wiring_.origin;
    for (unsigned i = 0; i < plan_.network_each; ++i) {
      upstream::DnsCache fresh_dns(std::chrono::minutes(10));
      upstream::Pool fresh_pool(pool_options());
      upstream::Http1Client fresh_client(upstream::ClientDeps{fresh_pool, fresh_dns, tls_});
      double dns_ms = 0;
      if (!origin.address) {
        const auto before = Clock::now();
        const TimePoint deadline = before + wiring_.deployment.timeouts.connect;
        auto lookup = co_await fresh_dns.resolve(origin.host, origin.port, deadline);
        dns_ms = to_ms(Clock::now() - before);
        if (!lookup) {
          Outcome failed;
          failed.failure = "DNS lookup of " + origin.host + " failed: " + lookup.error().message();
          settle(failed, "network");
          if (!m_.failure.empty()) co_return false;
          continue;
        }
      }
      auto outcome = co_await send_one(fresh_client, wiring_, small_body_);
      fresh_pool.shut_down();
      if (!settle(outcome, "network")) {
        if (!m_.failure.empty()) co_return false;
        continue;
      }
      auto& samples = m_.network;
      samples.dns_ms.push_back(dns_ms);
      samples.connect_ms.push_back(outcome.connect_ms);
      if (origin.tls) samples.tls_ms.push_back(outcome.tls_ms);
      samples.fresh_ttfb_ms.push_back(outcome.ttfb_ms);
      samples.fresh_ttft_ms.push_back(dns_ms + outcome.ttft_ms);
    }
    // Every connection step 3 needs is opened now, long before its first
    // request: a server that holds a new connection before reading it
    // would otherwise charge that hold to the burst as queueing.
    co_await warm(plan_.levels.back());
    for (unsigned i = 0; i < plan_.network_each; ++i) {
      auto outcome = co_await send_one(client_, wiring_, small_body_);
      if (!settle(outcome, "network")) {
        if (!m_.failure.empty()) co_return false;
        continue;
      }
      m_.network.pooled_ttfb_ms.push_back(outcome.ttfb_ms);
      m_.network.pooled_ttft_ms.push_back(outcome.ttft_ms);
    }
    co_return true;
  }

  // Step 2: the sizes in turn, round after round, each prompt new so that
  // no prompt cache answers it.
  net::awaitable<void> prompt_sizes() {
    for (unsigned round = 0; round < plan_.per_size; ++round) {
      for (unsigned size : plan_.prompt_sizes) {
        const auto body =
            probe_body(wiring_.model_literal, synthetic_prompt(size, nonce_ + ++serial_));
        co_await warm(1);
        auto outcome = co_await send_one(client_, wiring_, body);
        if (!settle(outcome, "input length")) continue;
        m_.prompts.push_back({static_cast<double>(size), outcome.ttft_ms});
      }
    }
  }

  // Step 3: each level a burst of that many requests at once, over
  // connections opened beforehand.
  net::awaitable<void> queueing() {
    for (unsigned level : plan_.levels) {
      LevelSamples samples{level, {}};
      const unsigned rounds = level == 1 ? plan_.level_one_rounds : 1;
      for (unsigned round = 0; round < rounds; ++round) {
        co_await warm(level);
        std::vector<Outcome> outcomes(level);
        auto send_at = [&](unsigned i) -> net::awaitable<void> {
          outcomes[i] = co_await send_one(client_, wiring_, small_body_);
        };
        co_await all_at_once(level, send_at);
        for (const auto& outcome : outcomes) {
          if (settle(outcome, "queueing")) samples.ttft_ms.push_back(outcome.ttft_ms);
        }
      }
      m_.levels.push_back(std::move(samples));
    }
  }

  Measurement& m_;
  Wiring& wiring_;
  const Plan& plan_;
  const Progress& progress_;
  upstream::TlsContexts tls_;
  upstream::Pool pool_;
  upstream::DnsCache dns_;
  upstream::Http1Client client_;
  std::uint64_t nonce_;
  std::uint64_t serial_ = 0;
  std::string small_body_;
};

}  // namespace

Measurement measure(const config::Model& model, const config::Deployment& deployment,
                    const Plan& plan, const Progress& progress) {
  Measurement measurement;
  measurement.model = model.name;
  measurement.deployment = deployment.id;
  std::string model_literal;
  append_json_string(model_literal, deployment.upstream_model);
  Wiring wiring{deployment, upstream::Origin::from(deployment),
                upstream::deployment_fields(deployment), protocol::make_adapter(deployment),
                std::move(model_literal)};

  net::io_context context(1);
  std::exception_ptr thrown;
  {
    Prober prober(measurement, wiring, plan, progress);
    net::co_spawn(context, prober.run(), [&](std::exception_ptr failure) { thrown = failure; });
    context.run();
  }
  if (thrown) std::rethrow_exception(thrown);
  return measurement;
}

}  // namespace sluice::doctor

#include "sluice/doctor/passive.hpp"

#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <exception>

#include "sluice/common/clock.hpp"
#include "sluice/config/config.hpp"
#include "sluice/upstream/client.hpp"

namespace sluice::doctor {

namespace net = boost::asio;

namespace {

// A window's percentiles as the admin listener writes them; the mean is
// not kept, so the median stands in for it.
Spread spread_of(const nlohmann::json& window) {
  Spread out;
  if (!window.is_object()) return out;
  out.samples = window.value("samples", std::size_t{0});
  out.median = window.value("p50_ms", 0.0);
  out.p95 = window.value("p95_ms", 0.0);
  out.p99 = window.value("p99_ms", 0.0);
  out.iqr = window.value("p75_ms", 0.0) - window.value("p25_ms", 0.0);
  out.mean = out.median;
  return out;
}

// What the gateway records of its connections: connect and TLS times of the
// new ones, and first-byte times (request sent to response head), mostly on
// kept-alive ones. A new connection costs its connect and TLS time.
std::optional<NetworkFindings> network_of(const nlohmann::json& entry, const Spread& ttfb) {
  if (!entry.contains("connect")) return std::nullopt;
  const auto connect = spread_of(entry["connect"]);
  if (connect.samples == 0 || ttfb.samples == 0) return std::nullopt;
  NetworkFindings out;
  out.connect = connect;
  out.tls = spread_of(entry["tls"]);
  out.pooled_ttfb = out.pooled_ttft = ttfb;
  out.setup_ms = connect.median + out.tls.median;
  out.fresh_ttft = ttfb;
  out.fresh_ttft.median = ttfb.median + out.setup_ms;
  out.fresh_ttft.samples = connect.samples;
  out.share_fresh = std::min(1.0, (out.setup_ms + connect.median) / out.fresh_ttft.median);
  out.share_pooled = ttfb.median > 0 ? std::min(1.0, connect.median / ttfb.median) : 0;
  return out;
}

// Each prompt class's median at the tokens it stands for.
std::optional<PrefillFindings> prefill_of(const nlohmann::json& entry) {
  if (!entry.contains("prompt_classes")) return std::nullopt;
  PrefillFindings out;
  std::vector<PromptSample> points;
  for (const auto& bucket : entry["prompt_classes"]) {
    const auto ttft = spread_of(bucket);
    if (ttft.samples == 0) continue;
    const double tokens = bucket.value("tokens", 0.0);
    out.sizes.push_back({tokens, ttft});
    points.push_back({tokens, ttft.median});
  }
  if (out.sizes.empty()) return std::nullopt;
  out.fit = fit_prefill(points);
  out.largest_tokens = out.sizes.back().tokens;
  if (out.fit.valid)
    out.prefill_ms_at_largest = std::max(0.0, out.fit.ms_per_token * out.largest_tokens);
  return out;
}

std::optional<QueueFindings> queueing_of(const nlohmann::json& entry) {
  if (!entry.contains("in_flight")) return std::nullopt;
  std::vector<LevelFindings> levels;
  for (const auto& bucket : entry["in_flight"]) {
    const auto ttft = spread_of(bucket);
    if (ttft.samples == 0) continue;
    levels.push_back({bucket.value("in_flight", 1u), ttft});
  }
  if (levels.empty()) return std::nullopt;
  return queueing_from_levels(std::move(levels), false);
}

net::awaitable<void> fetch(upstream::Http1Client& client, const upstream::Origin& origin,
                           const std::string& prefix, const std::string& fields, std::string& body,
                           std::string& error) {
  upstream::Request request{"GET", {prefix, "/admin/diagnosis", ""}, {fields}, {}};
  const auto now = Clock::now();
  upstream::Limits limits{std::chrono::seconds(5), std::chrono::seconds(10),
                          std::chrono::seconds(10), now + std::chrono::seconds(30), now};
  upstream::AbortHandle abort_handle;
  auto started = co_await client.start(origin, request, limits, abort_handle);
  if (!started) {
    error = started.error().describe();
    co_return;
  }
  auto& exchange = *started.value();
  std::array<char, 16384> buffer;
  for (;;) {
    // What the connection holds already, else a read of the socket.
    auto read = exchange.read_buffered_body(buffer.data(), buffer.size());
    if (!read) read = co_await exchange.read_body(buffer.data(), buffer.size());
    if (!*read) {
      error = read->error().describe();
      co_return;
    }
    if (read->value() == 0) break;
    body.append(buffer.data(), read->value());
  }
  exchange.note_finished(Clock::now());
  if (exchange.status() != 200) {
    error = "HTTP " + std::to_string(exchange.status()) + ": " + body.substr(0, 200);
  }
}

}  // namespace

std::vector<DeploymentReport> diagnose_gateway(const nlohmann::json& diagnosis) {
  std::vector<DeploymentReport> reports;
  for (const auto& entry : diagnosis.value("deployments", nlohmann::json::array())) {
    DeploymentReport report;
    report.model = entry.value("model", "");
    report.deployment = entry.value("deployment", "");
    const auto ttfb = spread_of(entry.value("ttfb", nlohmann::json::object()));
    report.network = network_of(entry, ttfb);
    report.prefill = prefill_of(entry);
    report.queueing = queueing_of(entry);
    // A deployment without recent traffic (or of an endpoint with no first
    // token, such as embeddings) has nothing to diagnose.
    if (ttfb.samples == 0) continue;
    conclude(report, entry.value("warm_connections", 1u), ttfb.p99);
    reports.push_back(std::move(report));
  }
  return reports;
}

std::optional<std::vector<DeploymentReport>> read_gateway(const std::string& admin_url,
                                                          const std::string& admin_key,
                                                          std::string& error) {
  std::string why;
  std::string url = admin_url;
  while (!url.empty() && url.back() == '/') url.pop_back();
  auto parsed = config::parse_url(url, why);
  if (!parsed) {
    error = "--from " + admin_url + ": " + why;
    return std::nullopt;
  }
  config::Deployment admin;
  admin.id = "admin";
  admin.base_url = *parsed;
  const auto origin = upstream::Origin::from(admin);
  std::string fields;
  if (!admin_key.empty()) fields = "Authorization: Bearer " + admin_key + "\r\n";

  std::string body;
  net::io_context context(1);
  {
    upstream::TlsContexts tls;
    upstream::DnsCache dns(std::chrono::minutes(1));
    upstream::Pool pool(upstream::PoolOptions{1, std::chrono::seconds(10)});
    upstream::Http1Client client(upstream::ClientDeps{pool, dns, tls});
    std::exception_ptr thrown;
    net::co_spawn(context, fetch(client, origin, parsed->path_prefix, fields, body, error),
                  [&](std::exception_ptr failure) { thrown = failure; });
    context.run();
    pool.shut_down();
    if (thrown) std::rethrow_exception(thrown);
  }
  if (!error.empty()) {
    error = "--from " + admin_url + ": " + error;
    return std::nullopt;
  }
  auto document = nlohmann::json::parse(body, nullptr, false);
  if (document.is_discarded() || !document.is_object()) {
    error = admin_url + ": /admin/diagnosis did not answer JSON";
    return std::nullopt;
  }
  if (!document.value("diagnosis", false)) {
    std::fprintf(stderr,
                 "sluice doctor: the gateway keeps no diagnosis windows (router.diagnosis is "
                 "off): only first-byte times are read\n");
  }
  return diagnose_gateway(document);
}

}  // namespace sluice::doctor

#include "sluice/server/admin.hpp"

#include <openssl/crypto.h>

#include <spdlog/spdlog.h>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <nlohmann/json.hpp>

#include "sluice/http/network_errors.hpp"
#include "sluice/openai/api_error.hpp"
#include "sluice/router/adaptive.hpp"
#include "sluice/server/gateway.hpp"

namespace sluice::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using net::as_tuple;
using net::use_awaitable;

namespace {

// The deadlines an attempt gets now and, for an adaptive one, what they come
// from.
nlohmann::json render_deadlines(const config::Deployment& deployment,
                                const config::Adaptive& adaptive, router::DeploymentState& state,
                                TimePoint now) {
  const auto& timeouts = deployment.timeouts;
  const auto describe = [&](bool automatic, const router::LatencyWindow& window,
                            std::chrono::milliseconds static_default,
                            const config::AdaptiveDeadline& policy) {
    if (!automatic) return nlohmann::json{{"ms", static_default.count()}, {"auto", false}};
    const auto deadline =
        router::deadline_from(window, static_default, policy, adaptive.min_samples, now);
    return nlohmann::json{
        {"ms", deadline.value.count()},
        {"auto", true},
        {"measured", deadline.measured},
        {"samples", deadline.samples},
        {"p99_ms", deadline.samples ? nlohmann::json(to_ms(deadline.p99)) : nlohmann::json()}};
  };
  return {{"ttft", describe(timeouts.ttft_auto, state.ttft, timeouts.ttft, adaptive.ttft)},
          {"idle", describe(timeouts.idle_auto, state.gaps, timeouts.idle, adaptive.idle)}};
}

// Each prompt-size class's own first-byte window (before any fallback).
nlohmann::json render_prompt_classes(const router::DeploymentState& state, TimePoint now) {
  constexpr std::array<std::string_view, router::kPromptClasses> kNames = {"<1k", "1k-8k", "8k-32k",
                                                                           ">=32k"};
  nlohmann::json classes = nlohmann::json::array();
  for (std::size_t i = 0; i < router::kPromptClasses; ++i) {
    const auto ttft = state.ttft_by_class[i].summary(now, std::chrono::minutes(1));
    classes.push_back(
        {{"class", kNames[i]},
         {"ttft_samples", ttft.samples},
         {"ttft_p50_ms", ttft.samples ? nlohmann::json(to_ms(ttft.p50)) : nlohmann::json()},
         {"ttft_p95_ms", ttft.samples ? nlohmann::json(to_ms(ttft.p95)) : nlohmann::json()}});
  }
  return classes;
}

}  // namespace

std::string render_routes(Gateway& gateway) {
  auto snapshot = gateway.snapshot();
  auto now = Clock::now();
  constexpr auto kFresh = std::chrono::minutes(1);
  nlohmann::json models = nlohmann::json::array();
  for (const auto& model : snapshot->config->models) {
    nlohmann::json deployments = nlohmann::json::array();
    for (const auto& deployment : model.deployments) {
      auto* state = snapshot->router->state(deployment.id);
      if (!state) continue;
      auto ttft = state->ttft.summary(now, kFresh);
      auto total = state->total.summary(now, kFresh);
      nlohmann::json entry = {
          {"id", deployment.id},
          {"ttft_p50_ms", ttft.samples ? nlohmann::json(to_ms(ttft.p50)) : nlohmann::json()},
          {"ttft_p95_ms", ttft.samples ? nlohmann::json(to_ms(ttft.p95)) : nlohmann::json()},
          {"ttft_samples", ttft.samples},
          {"total_p50_ms", total.samples ? nlohmann::json(to_ms(total.p50)) : nlohmann::json()},
          {"total_samples", total.samples},
          {"in_flight", state->in_flight()},
          {"recent_error_rate", state->recent_error_rate(now)},
          {"attempts_total", state->attempts_total()},
          {"failures_total", state->failures_total()},
          {"cooling_down", state->cooling_down(now)},
      };
      entry["deadlines"] =
          render_deadlines(deployment, snapshot->config->router.adaptive, *state, now);
      if (snapshot->config->router.prompt_classes) {
        entry["prompt_classes"] = render_prompt_classes(*state, now);
      }
      if (deployment.max_parallel_auto) {
        const auto baseline = state->concurrency.baseline();
        entry["concurrency"] = {
            {"limit", state->concurrency.current()},
            {"baseline_ttft_ms",
             baseline.count() > 0 ? nlohmann::json(to_ms(baseline)) : nlohmann::json()},
            {"probing", state->concurrency.probing()}};
      }
      auto until = state->cooldown_until();
      entry["cooldown_remaining_ms"] =
          until && *until > now ? nlohmann::json(to_ms(*until - now)) : nlohmann::json();
      deployments.push_back(std::move(entry));
    }
    models.push_back({{"model", model.name},
                      {"strategy", static_cast<int>(model.strategy)},
                      {"deployments", std::move(deployments)}});
  }
  // Latency windows are this instance's own; limits, cooldowns and the
  // exact cache are shared while the state backend is up.
  nlohmann::json state = {{"backend", "local"}};
  if (const auto* status = gateway.state_status()) {
    state = {{"backend", "redis"}, {"url", status->url()}, {"up", status->up()}};
    if (auto error = status->last_error(); !error.empty()) state["error"] = std::move(error);
  }
  return nlohmann::json{{"models", std::move(models)}, {"state", std::move(state)}}.dump(2);
}

namespace {

// The diagnosis reads the samples of the last few minutes: enough traffic
// for percentiles per bucket, recent enough to describe the upstream now.
constexpr auto kDiagnosisAge = std::chrono::minutes(10);

nlohmann::json window_json(const router::LatencyWindow& window, TimePoint now) {
  const auto at = [&](unsigned percent) {
    return to_ms(window.quantile(now, kDiagnosisAge, percent).value);
  };
  return {{"samples", window.fresh_samples(now, kDiagnosisAge)},
          {"p25_ms", at(25)},
          {"p50_ms", at(50)},
          {"p75_ms", at(75)},
          {"p95_ms", at(95)},
          {"p99_ms", at(99)}};
}

}  // namespace

std::string render_diagnosis(Gateway& gateway) {
  // A prompt class stands for the tokens at its middle (the last, open one
  // for 48k): the fit's x values.
  constexpr std::array<std::string_view, router::kPromptClasses> kClassNames = {"<1k", "1k-8k",
                                                                                "8k-32k", ">=32k"};
  constexpr std::array<unsigned, router::kPromptClasses> kClassTokens = {500, 4500, 20000, 48000};
  auto snapshot = gateway.snapshot();
  const auto& router_config = snapshot->config->router;
  const auto now = Clock::now();
  nlohmann::json deployments = nlohmann::json::array();
  for (const auto& model : snapshot->config->models) {
    for (const auto& deployment : model.deployments) {
      auto* state = snapshot->router->state(deployment.id);
      if (!state) continue;
      nlohmann::json entry = {{"model", model.name},
                              {"deployment", deployment.id},
                              {"warm_connections", deployment.warm_connections},
                              {"ttfb", window_json(state->ttft, now)}};
      if (router_config.diagnosis) {
        entry["connect"] = window_json(state->connect_times, now);
        entry["tls"] = window_json(state->tls_times, now);
        auto by_in_flight = nlohmann::json::array();
        for (std::size_t i = 0; i < router::kInFlightBuckets; ++i) {
          auto bucket = window_json(state->ttft_by_in_flight[i], now);
          bucket["in_flight"] = router::kInFlightBucketFloors[i];
          by_in_flight.push_back(std::move(bucket));
        }
        entry["in_flight"] = std::move(by_in_flight);
      }
      if (router_config.prompt_classes) {
        auto classes = nlohmann::json::array();
        for (std::size_t i = 0; i < router::kPromptClasses; ++i) {
          auto bucket = window_json(state->ttft_by_class[i], now);
          bucket["class"] = kClassNames[i];
          bucket["tokens"] = kClassTokens[i];
          classes.push_back(std::move(bucket));
        }
        entry["prompt_classes"] = std::move(classes);
      }
      deployments.push_back(std::move(entry));
    }
  }
  return nlohmann::json{{"diagnosis", router_config.diagnosis},
                        {"prompt_classes", router_config.prompt_classes},
                        {"deployments", std::move(deployments)}}
      .dump(2);
}

namespace {

bool authorized(const http::request<http::string_body>& request, const std::string& key) {
  if (key.empty()) return true;
  auto header = request[http::field::authorization];
  std::string expected = "Bearer " + key;
  return header.size() == expected.size() &&
         CRYPTO_memcmp(header.data(), expected.data(), expected.size()) == 0;
}

// The admin requests of one connection, over `stream`: a beast::tcp_stream,
// or an ssl_stream over one when server.admin_tls is set.
template <class Stream>
net::awaitable<void> serve_admin_requests(Gateway& gateway, Stream& stream) {
  beast::flat_buffer buffer;
  for (;;) {
    http::request<http::string_body> request;
    beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(30));
    auto [read_ec, n] = co_await http::async_read(stream, buffer, request, as_tuple(use_awaitable));
    if (read_ec) break;

    http::response<http::string_body> response{http::status::ok, request.version()};
    response.keep_alive(request.keep_alive());
    response.set(http::field::content_type, "application/json");
    auto target = request.target();
    auto config = gateway.snapshot()->config;
    if (!authorized(request, config->server.admin_key)) {
      response.result(http::status::unauthorized);
      response.body() = ApiError{401, "The admin listener needs its bearer key.",
                                 "invalid_request_error", "", "invalid_api_key"}
                            .to_json();
    } else if (target == "/metrics" && request.method() == http::verb::get) {
      response.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      response.body() = gateway.registry().render();
    } else if (target == "/admin/routes" && request.method() == http::verb::get) {
      response.body() = render_routes(gateway);
    } else if (target == "/admin/diagnosis" && request.method() == http::verb::get) {
      response.body() = render_diagnosis(gateway);
    } else if (target == "/admin/reload" && request.method() == http::verb::post) {
      auto outcome = gateway.reload();
      if (outcome.error.empty()) {
        response.body() =
            nlohmann::json{{"reloaded", true}, {"restart_required", outcome.restart_required}}
                .dump();
      } else {
        response.result(http::status::unprocessable_entity);
        response.body() =
            ApiError{422, outcome.error, "invalid_request_error", "", "invalid_config"}.to_json();
      }
    } else if (target == "/health") {
      response.body() = R"({"status":"ok"})";
    } else {
      response.result(http::status::not_found);
      response.body() =
          ApiError::unknown_path(std::string_view(target.data(), target.size())).to_json();
    }
    response.prepare_payload();
    auto [write_ec, written] =
        co_await http::async_write(stream, response, as_tuple(use_awaitable));
    if (write_ec || !response.keep_alive()) break;
  }
}

net::awaitable<void> serve_admin_connection(Gateway& gateway, net::ip::tcp::socket socket) {
  // Taken per connection: a reload's new certificate serves the next one.
  auto tls = gateway.snapshot()->admin_tls;
  if (!tls) {
    beast::tcp_stream stream(std::move(socket));
    co_await serve_admin_requests(gateway, stream);
    error_code ignored;
    stream.socket().shutdown(net::ip::tcp::socket::shutdown_send, ignored);
    co_return;
  }
  beast::ssl_stream<beast::tcp_stream> stream(std::move(socket), *tls);
  beast::get_lowest_layer(stream).expires_after(gateway.snapshot()->config->server.header_timeout);
  auto [handshake_ec] =
      co_await stream.async_handshake(net::ssl::stream_base::server, as_tuple(use_awaitable));
  if (handshake_ec) {
    spdlog::debug("admin listener: TLS handshake failed: {}", handshake_ec.message());
    co_return;
  }
  co_await serve_admin_requests(gateway, stream);
  // close_notify, and a short wait for the client's.
  beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(1));
  co_await stream.async_shutdown(as_tuple(use_awaitable));
}

}  // namespace

net::awaitable<void> serve_admin(Gateway& gateway, net::ip::tcp::acceptor& acceptor) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(as_tuple(use_awaitable));
    if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
    if (ec) continue;
    net::co_spawn(acceptor.get_executor(), serve_admin_connection(gateway, std::move(socket)),
                  net::detached);
  }
}

}  // namespace sluice::server

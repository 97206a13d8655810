// What sluice tells about itself: /metrics, /admin/routes, Server-Timing,
// the access log and trace context.
#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// Parses Prometheus text: every sample line is `name{labels} value`; returns
// the samples keyed by the full series text.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*\})?) ([-+0-9.eEinfNa]+)$)");
  std::map<std::string, double> samples;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    std::smatch match;
    EXPECT_TRUE(std::regex_match(line, match, sample)) << "not Prometheus text: " << line;
    if (!match.empty()) samples[match[1]] = std::stod(match[6]);
  }
  return samples;
}

// For tests about a request's own upstream connect.

std::map<std::string, double> scrape(TestGateway& gateway) {
  auto response = http_request(gateway.gateway().admin_port(), "GET", "/metrics");
  EXPECT_EQ(response.status, 200u);
  EXPECT_NE(response.header("content-type").find("text/plain"), std::string::npos);
  return parse_prometheus(response.body);
}

TEST(Observability, MetricsCountExactlyTheRequestsMade) {
  mock::Behaviour behaviour;
  behaviour.ttft = 50ms;
  auto upstream = start_mock(behaviour);
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));
  const std::string series = R"(sluice_requests_total{model="chat",deployment="d1",status="200"})";
  auto before = scrape(gateway);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(
        http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", i % 2 == 0))
            .status,
        200u);
  }
  ASSERT_EQ(
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("nope", false)).status,
      404u);
  // A request leaves the in-flight gauge once its answer is written, which
  // may be after the client has read it.
  std::map<std::string, double> samples;
  EXPECT_TRUE(eventually(
      [&] {
        samples = scrape(gateway);
        return samples[series] - before[series] == 3 && samples["sluice_requests_in_flight"] == 0;
      },
      1s));
  EXPECT_EQ(samples[series] - before[series], 3);
  // The TTFT histogram agrees with the mock's 50 ms.
  const std::string count = R"(sluice_ttft_seconds_count{model="chat",deployment="d1"})";
  const std::string sum = R"(sluice_ttft_seconds_sum{model="chat",deployment="d1"})";
  ASSERT_EQ(samples[count], 3);
  double mean = samples[sum] / samples[count];
  EXPECT_GE(mean, 0.045);
  EXPECT_LT(mean, 0.25);
  EXPECT_GT(samples["sluice_gateway_overhead_seconds_count"], 0);
  EXPECT_EQ(samples["sluice_requests_in_flight"], 0);
}

TEST(Observability, CacheLookupsAreCountedByResult) {
  auto upstream = start_mock();
  TestGateway gateway("models:\n  - name: chat\n    cache: {mode: exact}\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));
  const std::string body =
      R"({"model":"chat","temperature":0,"messages":[{"role":"user","content":"Hi"}]})";
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(http_request(gateway.port(), "POST", "/v1/chat/completions", body).status, 200u);
  }
  // Not cacheable (no zero temperature): not a lookup at all.
  ASSERT_EQ(
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false)).status,
      200u);
  const std::string hits = R"(sluice_cache_lookups_total{model="chat",result="hit"})";
  const std::string misses = R"(sluice_cache_lookups_total{model="chat",result="miss"})";
  std::map<std::string, double> samples;
  EXPECT_TRUE(eventually(
      [&] {
        samples = scrape(gateway);
        return samples[hits] == 2 && samples[misses] == 1;
      },
      1s))
      << "hits " << samples[hits] << ", misses " << samples[misses];
  EXPECT_EQ(samples[R"(sluice_cache_lookups_total{model="chat",result="semantic_hit"})"], 0);
  EXPECT_EQ(upstream->stats().requests, 2u);
}

TEST(Observability, RequestOverItsBudgetIsCounted) {
  mock::Behaviour behaviour;
  behaviour.ttft = 60ms;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(
      "budgets:\n  upstream_ttfb: 20ms\n  gateway: 5s\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("d1", upstream->base_url(), kNoWarmConnections));
  // One client connection: both requests run on one worker and its pool.
  HttpConnection client(gateway.port());
  ASSERT_EQ(client.request("POST", "/v1/chat/completions", chat_body("chat", false)).status, 200u);
  ASSERT_EQ(client.request("POST", "/v1/chat/completions", chat_body("chat", false)).status, 200u);
  std::map<std::string, double> samples;
  EXPECT_TRUE(eventually(
      [&] {
        samples = scrape(gateway);
        return samples[R"(sluice_budget_exceeded_total{stage="upstream_ttfb"})"] == 2;
      },
      1s));
  EXPECT_EQ(samples[R"(sluice_budget_exceeded_total{stage="gateway"})"], 0);
  // One upstream connection served both requests.
  EXPECT_EQ(samples["sluice_upstream_connections_opened_total"], 1);
}

TEST(Observability, RoutesViewShowsACooledDownDeployment) {
  mock::Behaviour failing;
  failing.fail = "500";
  auto broken = start_mock(failing);
  auto healthy = start_mock();
  TestGateway gateway(
      "router:\n  cooldown: {fails: 1, within: 60s, for: 30s}\n"
      "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
      deployment_yaml("broken", broken->base_url()) +
      deployment_yaml("healthy", healthy->base_url()));
  ASSERT_EQ(
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false)).status,
      200u);
  auto routes = http_request(gateway.gateway().admin_port(), "GET", "/admin/routes");
  ASSERT_EQ(routes.status, 200u);
  auto view = json::parse(routes.body);
  auto deployments = view["models"][0]["deployments"];
  ASSERT_EQ(deployments.size(), 2u);
  EXPECT_EQ(deployments[0]["id"], "broken");
  EXPECT_EQ(deployments[0]["cooling_down"], true);
  EXPECT_GT(deployments[0]["cooldown_remaining_ms"].get<double>(), 1000);
  EXPECT_EQ(deployments[1]["cooling_down"], false);
  EXPECT_EQ(deployments[1]["ttft_samples"], 1);
  EXPECT_EQ(deployments[0]["failures_total"], 1);

  auto metrics = scrape(gateway);
  EXPECT_EQ(metrics[R"(sluice_deployment_cooldown{deployment="broken"})"], 1);
  EXPECT_EQ(metrics[R"(sluice_deployment_cooldown{deployment="healthy"})"], 0);
}

TEST(Observability, AdminKeyProtectsTheAdminListener) {
  auto upstream = start_mock();
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0\n"
      "  admin_key: admin-secret-1\nmodels:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("d1", upstream->base_url()));
  auto port = gateway.gateway().admin_port();
  EXPECT_EQ(http_request(port, "GET", "/metrics").status, 401u);
  EXPECT_EQ(http_request(port, "GET", "/metrics", "", bearer("wrong")).status, 401u);
  EXPECT_EQ(http_request(port, "GET", "/metrics", "", bearer("admin-secret-1")).status, 200u);
}

TEST(Observability, ServerTimingOnEveryResponse) {
  mock::Behaviour behaviour;
  behaviour.ttft = 30ms;
  auto upstream = start_mock(behaviour);
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url(), kNoWarmConnections));
  auto proxied =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  auto timing = proxied.header("server-timing");
  EXPECT_NE(timing.find("gateway;dur="), std::string::npos) << timing;
  EXPECT_NE(timing.find("upstream-connect;dur="), std::string::npos) << timing;
  std::smatch ttfb;
  ASSERT_TRUE(std::regex_search(timing, ttfb, std::regex(R"(upstream-ttfb;dur=([0-9.]+))")))
      << timing;
  EXPECT_GE(std::stod(ttfb[1]), 25.0);

  auto error = http_request(gateway.port(), "POST", "/v1/chat/completions", "{bad");
  EXPECT_NE(error.header("server-timing").find("gateway;dur="), std::string::npos);
}

// "2024-05-01T12:34:56.789Z", as the access log writes it.
std::optional<std::chrono::system_clock::time_point> parse_log_time(const std::string& text) {
  std::tm fields{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &fields);
  unsigned millis = 0;
  if (rest == nullptr || std::sscanf(rest, ".%3uZ", &millis) != 1) return std::nullopt;
  return std::chrono::system_clock::from_time_t(timegm(&fields)) +
         std::chrono::milliseconds(millis);
}

TEST(Observability, AccessLogLinesForStreamedAndFailedOverRequests) {
  mock::Behaviour failing;
  failing.fail = "500";
  auto broken = start_mock(failing);
  auto healthy = start_mock();
  TempFile log_file("", ".log");
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 2\nlog:\n  access_log: " + log_file.path() +
      "\nmodels:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
      deployment_yaml("broken", broken->base_url()) +
      deployment_yaml("healthy", healthy->base_url()));
  const auto sent_at = std::chrono::system_clock::now();
  // Each upstream waits before its head, so the request takes long enough
  // for its log time to tell its start from its end.
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true),
                   {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                    {"x-mock-ttft-ms", "30"}});
  const auto answered_at = std::chrono::system_clock::now();
  ASSERT_EQ(response.status, 200u);

  // The trace goes upstream under the same trace id, as a new hop.
  auto forwarded = healthy->recent_requests().back().header("traceparent").value_or("");
  EXPECT_EQ(forwarded.substr(0, 36), "00-4bf92f3577b34da6a3ce929d0e0e4736-");
  EXPECT_NE(forwarded, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");

  std::string line;
  ASSERT_TRUE(eventually(
      [&] {
        std::ifstream in(log_file.path());
        return static_cast<bool>(std::getline(in, line)) && !line.empty();
      },
      3s));
  auto record = json::parse(line);
  EXPECT_EQ(record["request_id"], response.header("x-request-id"));
  EXPECT_EQ(record["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(record["model"], "chat");
  EXPECT_EQ(record["stream"], true);
  EXPECT_EQ(record["status"], 200);
  EXPECT_EQ(record["deployment"], "healthy");
  ASSERT_EQ(record["attempts"].size(), 2u);
  EXPECT_EQ(record["attempts"][0]["deployment"], "broken");
  EXPECT_EQ(record["attempts"][0]["outcome"], "http_500");
  EXPECT_EQ(record["attempts"][1]["deployment"], "healthy");
  EXPECT_EQ(record["attempts"][1]["outcome"], "ok");
  EXPECT_TRUE(record["ttft_ms"].is_number());
  ASSERT_TRUE(record["total_ms"].is_number());
  EXPECT_GE(record["total_ms"].get<double>(), 30.0);
  EXPECT_TRUE(record["gateway_overhead_us"].is_number());
  EXPECT_TRUE(record.contains("gap_p50_ms"));
  // The line's time is when the request arrived, not when its answer ended.
  auto logged_at = parse_log_time(record["ts"].get<std::string>());
  ASSERT_TRUE(logged_at) << record["ts"];
  using std::chrono::milliseconds;
  EXPECT_GE(*logged_at, std::chrono::floor<milliseconds>(sent_at));
  EXPECT_LE(
      *logged_at + std::chrono::duration_cast<milliseconds>(
                       std::chrono::duration<double, std::milli>(record["total_ms"].get<double>())),
      answered_at + milliseconds(2));
  EXPECT_GT(record["bytes_out"].get<double>(), 0);
  EXPECT_EQ(record["client_disconnected"], false);
}

// The access log's lines so far, once `count` are there.
std::vector<json> access_log_lines(const TempFile& log_file, std::size_t count) {
  std::vector<json> records;
  EXPECT_TRUE(eventually(
      [&] {
        records.clear();
        std::ifstream in(log_file.path());
        for (std::string line; std::getline(in, line);) {
          if (!line.empty()) records.push_back(json::parse(line));
        }
        return records.size() >= count;
      },
      3s));
  return records;
}

TEST(Observability, KeptAliveConnectionsIdleTimeIsNoPartOfTheNextRequest) {
  auto upstream = start_mock();
  TempFile log_file("", ".log");
  TestGateway gateway("server:\n  listen: 127.0.0.1:0\n  threads: 1\nlog:\n  access_log: " +
                      log_file.path() + "\nmodels:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));
  HttpConnection client(gateway.port());
  ASSERT_EQ(client.request("POST", "/v1/chat/completions", chat_body("chat", true)).status, 200u);

  // The connection waits 300 ms before its next request.
  std::this_thread::sleep_for(300ms);
  const auto sent_at = std::chrono::system_clock::now();
  ASSERT_EQ(client.request("POST", "/v1/chat/completions", chat_body("chat", true)).status, 200u);

  // A request whose head comes in two parts 100 ms apart started with the
  // first part.
  const std::string body = chat_body("chat", false);
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: sluice\r\n";
  client.send_raw(head);
  std::this_thread::sleep_for(100ms);
  client.send_raw("Content-Type: application/json\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(client.read_head().status, 200u);
  client.read_rest_of_body();

  auto records = access_log_lines(log_file, 3);
  ASSERT_EQ(records.size(), 3u);
  const auto& after_idle = records[1];
  // The mock answers at once: only the idle wait could make it 300 ms.
  EXPECT_LT(after_idle["total_ms"].get<double>(), 200.0) << after_idle;
  EXPECT_LT(after_idle["ttft_ms"].get<double>(), 200.0) << after_idle;
  auto logged_at = parse_log_time(after_idle["ts"].get<std::string>());
  ASSERT_TRUE(logged_at) << after_idle["ts"];
  EXPECT_GE(*logged_at, std::chrono::floor<std::chrono::milliseconds>(sent_at));

  EXPECT_GE(records[2]["total_ms"].get<double>(), 90.0) << records[2];
  EXPECT_LT(records[2]["total_ms"].get<double>(), 300.0) << records[2];
}

}  // namespace
}  // namespace sluice::testing

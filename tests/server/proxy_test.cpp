// The gateway against sluice-mock over real sockets: relay timing, pooling,
// cancellation, rewriting and every error the gateway answers itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "support/canned_upstream.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Tests that count upstream connections open every one themselves.

std::string one_model(const std::string& base_url, const std::string& extra = "",
                      const std::string& server = "") {
  return server + "models:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("d1", base_url, extra);
}

TEST(Proxy, FirstStreamEventReachesClientWhileUpstreamSleepsBeforeSecond) {
  mock::Behaviour behaviour;
  behaviour.interval = 1500ms;
  behaviour.tokens = 3;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(one_model(upstream->base_url()));

  HttpConnection client(gateway.port());
  auto sent = Clock::now();
  client.send("POST", "/v1/chat/completions", chat_body("chat", true));
  auto head = client.read_head();
  ASSERT_EQ(head.status, 200u);
  EXPECT_EQ(head.header("transfer-encoding"), "chunked");
  EXPECT_EQ(head.header("content-type").substr(0, 17), "text/event-stream");
  auto first = client.read_body_piece();
  auto first_at = Clock::now();
  ASSERT_TRUE(first.has_value());
  EXPECT_NE(first->find("tok0"), std::string::npos);
  // The second event is due 1.5 s after the first: the first must not wait for it.
  EXPECT_LT(first_at - sent, 750ms);
  EXPECT_EQ(first->find("tok1"), std::string::npos);
}

TEST(Proxy, WholeStreamIsRelayedIntactAndEndsWithDone) {
  mock::Behaviour behaviour;
  behaviour.tokens = 20;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(one_model(upstream->base_url()));

  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(response.status, 200u);
  auto events = sse_data(response.body);
  ASSERT_EQ(events.size(), 22u);  // 20 tokens, the finish chunk, [DONE]
  std::string text;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["model"], "mock-model");
    auto& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(text.substr(0, 10), "tok0 tok1 ");
}

TEST(Proxy, HundredSequentialRequestsUseOneUpstreamConnection) {
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url(), kNoWarmConnections));

  HttpConnection client(gateway.port());
  for (int i = 0; i < 100; ++i) {
    bool stream = i % 2 == 0;
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", stream));
    ASSERT_EQ(response.status, 200u) << response.body;
  }
  auto stats = upstream->stats();
  EXPECT_EQ(stats.requests, 100u);
  EXPECT_EQ(stats.connections_accepted, 1u);
  // The connection returns to the pool just after the last byte is written.
  EXPECT_TRUE(eventually([&] { return gateway.idle_upstream_connections() == 1; }, 1s));
  EXPECT_EQ(gateway.active_upstream_connections(), 0);
}

TEST(Proxy, ABurstsUpstreamConnectionsStayPooledForTheNextBurst) {
  // Up to 200 requests at once on one worker, each on a connection of its
  // own: all of them wait idle for the next burst (the default keeps up to
  // 1,024 per origin and worker, where 64 would close most), which opens
  // none beyond what it needs over the first burst's.
  constexpr std::size_t kBurst = 200;
  auto upstream = start_mock();
  TestGateway gateway(
      one_model(upstream->base_url(), kNoWarmConnections, "server:\n  threads: 1\n"));
  auto burst = [&] {
    std::vector<std::future<HttpResponse>> responses;
    for (std::size_t i = 0; i < kBurst; ++i) {
      responses.push_back(std::async(std::launch::async, [&] {
        return http_request(gateway.port(), "POST", "/v1/chat/completions",
                            chat_body("chat", false), {{"x-mock-ttft-ms", "600"}});
      }));
    }
    for (auto& response : responses) EXPECT_EQ(response.get().status, 200u);
  };
  auto idle_are = [&](std::uint64_t count) {
    return eventually(
        [&] { return gateway.idle_upstream_connections() == static_cast<std::int64_t>(count); },
        2s);
  };
  burst();
  // A slow machine starts some requests after others ended: fewer than 200
  // overlap, but far more than 64 must, or the test tells nothing.
  const std::uint64_t first = upstream->stats().connections_accepted;
  ASSERT_GT(first, 100u);
  EXPECT_TRUE(idle_are(first));
  burst();
  // Had the pool closed all but 64, the second burst would connect again
  // for most of its requests.
  const std::uint64_t both = upstream->stats().connections_accepted;
  EXPECT_LE(both, kBurst);
  EXPECT_TRUE(idle_are(both));
  EXPECT_EQ(upstream->stats().requests, 2 * kBurst);
}

TEST(Proxy, ClientDisconnectCancelsUpstreamWithin100ms) {
  mock::Behaviour behaviour;
  behaviour.interval = 3000ms;
  behaviour.tokens = 4;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(one_model(upstream->base_url(), kNoWarmConnections));

  {
    HttpConnection client(gateway.port());
    client.send("POST", "/v1/chat/completions", chat_body("chat", true));
    ASSERT_EQ(client.read_head().status, 200u);
    ASSERT_TRUE(client.read_body_piece().has_value());
    ASSERT_EQ(upstream->stats().open_connections, 1u);
    client.close();
    auto closed_at = Clock::now();
    ASSERT_TRUE(eventually([&] { return upstream->stats().streams_cancelled == 1; }, 2s));
    EXPECT_LT(Clock::now() - closed_at, 100ms);
  }
  EXPECT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }, 1s));
  // A connection whose response was cut short is never pooled.
  EXPECT_EQ(gateway.idle_upstream_connections(), 0);
  EXPECT_TRUE(eventually([&] { return gateway.active_upstream_connections() == 0; }, 1s));
}

TEST(Proxy, ClientDisconnectWhileWaitingForFirstByteCancelsUpstream) {
  mock::Behaviour behaviour;
  behaviour.ttft = 5000ms;
  auto upstream = start_mock(behaviour);
  TestGateway gateway(one_model(upstream->base_url(), kNoWarmConnections));

  HttpConnection client(gateway.port());
  client.send("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_TRUE(eventually([&] { return upstream->stats().requests == 1; }, 2s));
  client.close();
  auto closed_at = Clock::now();
  ASSERT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }, 2s));
  EXPECT_LT(Clock::now() - closed_at, 100ms);
}

// How many of `headers` are named `name`, compared case-insensitively.
std::size_t count_named(const Headers& headers, std::string_view name) {
  return static_cast<std::size_t>(
      std::count_if(headers.begin(), headers.end(),
                    [&](const auto& field) { return boost::beast::iequals(field.first, name); }));
}

// The upstream's own fields reach the client; its framing and hop-by-hop
// fields do not, since the gateway frames the answer itself.
TEST(Proxy, UpstreamEndToEndFieldsReachTheClientOnce) {
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url()));
  HttpConnection client(gateway.port());
  for (bool stream : {false, true}) {
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", stream));
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_EQ(response.header("Server"), "sluice-mock");
    EXPECT_EQ(count_named(response.headers, "Server"), 1u);
    EXPECT_EQ(count_named(response.headers, "Content-Type"), 1u);
    EXPECT_EQ(count_named(response.headers, "Connection"), 0u);  // the mock's keep-alive is its own
    if (stream) {
      EXPECT_EQ(response.header("Content-Type"), "text/event-stream");
      EXPECT_EQ(response.header("Cache-Control"), "no-cache");
      EXPECT_EQ(count_named(response.headers, "Transfer-Encoding"), 1u);
      EXPECT_EQ(count_named(response.headers, "Content-Length"), 0u);
    } else {
      EXPECT_EQ(response.header("Content-Type"), "application/json");
      EXPECT_EQ(count_named(response.headers, "Content-Length"), 1u);
      EXPECT_EQ(response.header("Content-Length"), std::to_string(response.body.size()));
    }
  }
}

TEST(Proxy, RewritesModelAndCredentialsAndDropsHopByHopHeaders) {
  auto upstream = start_mock();
  TestGateway gateway(
      "models:\n  - name: chat\n    deployments:\n      - id: d1\n        base_url: " +
      upstream->base_url() +
      "\n        model: upstream-name\n        api_key: sk-deployment-secret\n"
      "        headers: {OpenAI-Organization: org-7}\n");

  auto body = R"({"temperature":0.5,"model":"chat","messages":[{"role":"user","content":"x"}]})";
  auto response = http_request(gateway.port(), "POST", "/v1/chat/completions", body,
                               {{"Authorization", "Bearer client-key"},
                                {"x-api-key", "client-key"},
                                {"x-request-id", "trace-123"},
                                {"Proxy-Connection", "keep-alive"},
                                {"X-Custom", "kept"}});
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-request-id"), "trace-123");
  EXPECT_EQ(response.header("x-sluice-deployment"), "d1");
  EXPECT_EQ(json::parse(response.body)["model"], "upstream-name");

  auto recorded = upstream->recent_requests();
  ASSERT_EQ(recorded.size(), 1u);
  const auto& seen = recorded[0];
  EXPECT_EQ(seen.target, "/v1/chat/completions");
  EXPECT_EQ(seen.header("authorization").value_or(""), "Bearer sk-deployment-secret");
  EXPECT_FALSE(seen.header("x-api-key").has_value());
  EXPECT_FALSE(seen.header("proxy-connection").has_value());
  EXPECT_EQ(seen.header("x-request-id").value_or(""), "trace-123");
  EXPECT_EQ(seen.header("openai-organization").value_or(""), "org-7");
  EXPECT_EQ(seen.header("x-custom").value_or(""), "kept");
  // Only the model value changed; everything else is byte for byte the client's.
  EXPECT_EQ(
      seen.body,
      R"({"temperature":0.5,"model":"upstream-name","messages":[{"role":"user","content":"x"}]})");
}

// A header the deployment configures is the one its upstream gets: the
// client's of the same name, in any spelling, would otherwise go first, and
// most upstreams read the first. The next deployment in line configures
// none, and gets the client's.
TEST(Proxy, ADeploymentsOwnHeaderReplacesTheClientsOfTheSameName) {
  mock::Behaviour failing;
  failing.fail = "500";
  auto configured = start_mock(failing);
  auto unconfigured = start_mock();
  TestGateway gateway(
      "router:\n  retries: 1\n  backoff: {base: 1ms, max: 1ms}\n"
      "models:\n  - name: chat\n    strategy: priority\n    deployments:\n" +
      deployment_yaml("configured", configured->base_url(),
                      "        headers: {OpenAI-Organization: org-operator}\n") +
      deployment_yaml("unconfigured", unconfigured->base_url()));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false),
                   {{"openai-organization", "org-client"}, {"X-Custom", "kept"}});
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-deployment"), "unconfigured");

  for (const auto& [upstream, organization] :
       {std::pair{configured.get(), "org-operator"}, std::pair{unconfigured.get(), "org-client"}}) {
    auto recorded = upstream->recent_requests();
    ASSERT_EQ(recorded.size(), 1u) << organization;
    const Headers received(recorded[0].headers.begin(), recorded[0].headers.end());
    EXPECT_EQ(count_named(received, "openai-organization"), 1u) << organization;
    EXPECT_EQ(recorded[0].header("openai-organization").value_or(""), organization);
    EXPECT_EQ(recorded[0].header("x-custom").value_or(""), "kept") << organization;
  }
}

// What the client's Connection names is hop-by-hop (RFC 9110 §7.6.1): it
// stays with the gateway, whether named before or after it.
TEST(Proxy, FieldsTheClientsConnectionNamesAreNotForwarded) {
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url()));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false),
                   {{"X-Hop-Only", "1"},
                    {"Connection", "keep-alive, X-Hop-Only, x-second-hop"},
                    {"X-Second-Hop", "2"},
                    {"X-Custom", "kept"}});
  ASSERT_EQ(response.status, 200u) << response.body;
  auto recorded = upstream->recent_requests();
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_FALSE(recorded[0].header("x-hop-only").has_value());
  EXPECT_FALSE(recorded[0].header("x-second-hop").has_value());
  EXPECT_EQ(recorded[0].header("x-custom").value_or(""), "kept");
}

// The same for what the upstream's Connection names: it never reaches the
// client.
TEST(Proxy, FieldsTheUpstreamsConnectionNamesAreNotRelayed) {
  const std::string body = R"({"id":"c1","object":"chat.completion","choices":[]})";
  CannedUpstream upstream(
      "HTTP/1.1 200 OK\r\nX-Upstream-Hop: 1\r\nContent-Type: application/json\r\n"
      "Connection: keep-alive, X-Upstream-Hop\r\nX-Kept: 2\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body);
  TestGateway gateway(one_model(upstream.base_url(), kNoWarmConnections));
  HttpConnection client(gateway.port());
  for (int round = 0; round < 2; ++round) {
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", false));
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_FALSE(response.has_header("x-upstream-hop")) << round;
    EXPECT_EQ(response.header("x-kept"), "2") << round;
    EXPECT_EQ(response.header("content-type"), "application/json") << round;
    EXPECT_EQ(response.body, body) << round;
  }
}

// The answer's x-request-id is the gateway's, and its x-ratelimit-* fields
// describe the key's limits in the gateway: the upstream's own are renamed
// under "upstream-", where a client (and the provider's support, who ask for
// the request id) can still find them.
TEST(Proxy, TheUpstreamsRequestIdAndRateLimitsAreRenamed) {
  const std::string body = R"({"id":"c1","object":"chat.completion","choices":[]})";
  CannedUpstream upstream(
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-request-id: req-upstream-7\r\n"
      "X-RateLimit-Remaining-Requests: 4999\r\nx-ratelimit-limit-tokens: 90000\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string key = "sk-proxy-team-0123456789";
  TestGateway gateway(
      one_model(upstream.base_url(), kNoWarmConnections,
                "auth:\n  keys:\n    - name: team\n      key: " + key + "\n      rpm: 5\n"));
  Headers headers = bearer(key);
  headers.emplace_back("x-request-id", "req-client-3");
  auto response = http_request(gateway.port(), "POST", "/v1/chat/completions",
                               chat_body("chat", false), headers);
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(count_named(response.headers, "x-request-id"), 1u);
  EXPECT_EQ(response.header("x-request-id"), "req-client-3");
  EXPECT_EQ(response.header("upstream-x-request-id"), "req-upstream-7");
  EXPECT_EQ(count_named(response.headers, "x-ratelimit-remaining-requests"), 1u);
  EXPECT_EQ(response.header("x-ratelimit-remaining-requests"), "4");
  EXPECT_EQ(response.header("upstream-x-ratelimit-remaining-requests"), "4999");
  // The key has no token limit, so the gateway sends no token fields.
  EXPECT_FALSE(response.has_header("x-ratelimit-limit-tokens"));
  EXPECT_EQ(response.header("upstream-x-ratelimit-limit-tokens"), "90000");
}

TEST(Proxy, GeneratesRequestIdWhenAbsent) {
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url()));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(response.status, 200u);
  auto id = response.header("x-request-id");
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(upstream->recent_requests().at(0).header("x-request-id").value_or(""), id);
}

TEST(Proxy, PathPrefixOfBaseUrlIsKept) {
  auto upstream = start_mock();
  auto base = "http://127.0.0.1:" + std::to_string(upstream->port()) + "/openai/v1";
  TestGateway gateway(one_model(base));
  auto response =
      http_request(gateway.port(), "POST", "/v1/embeddings", R"({"model":"chat","input":"hi"})");
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(upstream->recent_requests().at(0).target, "/openai/v1/embeddings");
  EXPECT_FALSE(json::parse(response.body)["data"][0]["embedding"].empty());

  // A query (Azure's api-version, say) follows the path, on every attempt.
  response = http_request(gateway.port(), "POST", "/v1/chat/completions?api-version=2024-06-01",
                          chat_body("chat", false));
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(upstream->recent_requests().at(1).target,
            "/openai/v1/chat/completions?api-version=2024-06-01");
}

TEST(Proxy, EachRequestOfAKeptAliveConnectionStartsAfresh) {
  // A connection keeps the strings its requests write their lines into: none
  // of one request's lines may show in the next's.
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url()));
  HttpConnection client(gateway.port());
  std::vector<std::string> ids;
  for (int index = 0; index < 3; ++index) {
    Headers given;
    if (index == 1) given.emplace_back("x-request-id", "given-by-the-client");
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", false), given);
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_EQ(count_named(response.headers, "server-timing"), 1u) << index;
    EXPECT_EQ(count_named(response.headers, "x-request-id"), 1u) << index;
    ids.push_back(response.header("x-request-id"));

    auto received = upstream->recent_requests().back();
    Headers upstream_headers(received.headers.begin(), received.headers.end());
    EXPECT_EQ(count_named(upstream_headers, "x-request-id"), 1u) << index;
    EXPECT_EQ(count_named(upstream_headers, "traceparent"), 1u) << index;
    EXPECT_EQ(received.header("x-request-id"), ids.back()) << index;
  }
  EXPECT_EQ(ids[1], "given-by-the-client");
  EXPECT_NE(ids[0], ids[2]);
  EXPECT_TRUE(ids[2].starts_with("req_")) << ids[2];
}

TEST(Proxy, NonStreamingResponseKeepsContentLength) {
  auto upstream = start_mock();
  TestGateway gateway(one_model(upstream->base_url()));
  auto response =
      http_request(gateway.port(), "POST", "/v1/completions", R"({"model":"chat","prompt":"x"})");
  ASSERT_EQ(response.status, 200u);
  EXPECT_EQ(response.header("content-length"), std::to_string(response.body.size()));
  EXPECT_FALSE(response.has_header("transfer-encoding"));
  EXPECT_EQ(json::parse(response.body)["object"], "text_completion");
}

TEST(Proxy, DeadPooledConnectionIsReplacedOnce) {
  mock::MockServer::Options options;
  auto upstream = std::make_unique<mock::MockServer>(options);
  upstream->start();
  auto port = upstream->port();
  TestGateway gateway(one_model(upstream->base_url(), kNoWarmConnections));

  HttpConnection client(gateway.port());
  ASSERT_EQ(client.request("POST", "/v1/chat/completions", chat_body("chat", false)).status, 200u);
  ASSERT_TRUE(eventually([&] { return gateway.idle_upstream_connections() == 1; }, 1s));

  // The upstream restarts: the pooled connection is now dead.
  upstream->stop();
  upstream.reset();
  options.port = port;
  auto restarted = std::make_unique<mock::MockServer>(options);
  restarted->start();

  auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-attempts"), "1");
  EXPECT_EQ(restarted->stats().requests, 1u);
}

TEST(Proxy, HealthAndModels) {
  auto upstream = start_mock();
  TestGateway gateway(
      "models:\n  - name: chat\n    deployments:\n" + deployment_yaml("d1", upstream->base_url()) +
      "  - name: embed\n    deployments:\n" + deployment_yaml("d2", upstream->base_url()));
  auto health = http_request(gateway.port(), "GET", "/health");
  EXPECT_EQ(health.status, 200u);
  EXPECT_EQ(json::parse(health.body)["status"], "ok");

  auto models = http_request(gateway.port(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200u);
  auto list = json::parse(models.body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 2u);
  EXPECT_EQ(list["data"][0]["id"], "chat");
  EXPECT_EQ(list["data"][1]["id"], "embed");
  EXPECT_EQ(list["data"][0]["object"], "model");
}

// What the SDKs' models.retrieve asks: one model, by the name in the path,
// whose slash may come as it is or percent-encoded.
TEST(Proxy, OneModelByName) {
  auto upstream = start_mock();
  TestGateway gateway(
      "models:\n  - name: chat\n    deployments:\n" + deployment_yaml("d1", upstream->base_url()) +
      "  - name: org/model\n    deployments:\n" + deployment_yaml("d2", upstream->base_url()));
  for (const std::string path :
       {"/v1/models/chat", "/v1/models/org/model", "/v1/models/org%2Fmodel"}) {
    auto response = http_request(gateway.port(), "GET", path);
    ASSERT_EQ(response.status, 200u) << path << ": " << response.body;
    EXPECT_EQ(response.header("content-type"), "application/json");
    auto model = json::parse(response.body);
    EXPECT_EQ(model["id"], path == "/v1/models/chat" ? "chat" : "org/model") << path;
    EXPECT_EQ(model["object"], "model");
    EXPECT_EQ(model["owned_by"], "sluice");
    EXPECT_TRUE(model["created"].is_number());
  }
  auto missing = http_request(gateway.port(), "GET", "/v1/models/org");
  EXPECT_EQ(missing.status, 404u);
  EXPECT_EQ(json::parse(missing.body)["error"]["code"], "model_not_found");
  EXPECT_EQ(upstream->stats().requests, 0u) << "answered by the gateway, not the upstream";
}

}  // namespace
}  // namespace sluice::testing

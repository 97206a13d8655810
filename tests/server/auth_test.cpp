// The auth stage behind the gateway: keys, model allow-lists, limits and
// OpenAI's rate-limit headers.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "sluice/auth/key_store.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kTeamKey = "sk-team-a-0123456789";
constexpr const char* kOtherKey = "sk-team-b-9876543210";

std::string hex_sha256(std::string_view text) {
  auto digest = sha256(text);
  std::string hex;
  char buf[3];
  for (auto byte : digest) {
    std::snprintf(buf, sizeof buf, "%02x", byte);
    hex += buf;
  }
  return hex;
}

std::string config_with_keys(const std::string& base_url, const std::string& key_lines) {
  return "auth:\n  keys:\n" + key_lines + "models:\n  - name: chat-fast\n    deployments:\n" +
         deployment_yaml("fast", base_url) + "  - name: secret-model\n    deployments:\n" +
         deployment_yaml("secret", base_url);
}

class Auth : public ::testing::Test {
 protected:
  void SetUp() override { upstream_ = start_mock(); }
  HttpResponse chat(TestGateway& gateway, const Headers& headers,
                    const std::string& model = "chat-fast") {
    return http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body(model, false),
                        headers);
  }
  std::unique_ptr<mock::MockServer> upstream_;
};

TEST_F(Auth, MissingWrongOrMalformedKeyIs401) {
  TestGateway gateway(config_with_keys(
      upstream_->base_url(), std::string("    - name: team-a\n      key: ") + kTeamKey + "\n"));
  for (const auto& headers : std::vector<Headers>{
           {},
           bearer("sk-wrong-key-000000"),
           {{"Authorization", std::string("Basic ") + kTeamKey}},
           {{"Authorization", "Bearer"}},
       }) {
    auto response = chat(gateway, headers);
    EXPECT_EQ(response.status, 401u) << response.body;
    auto error = json::parse(response.body)["error"];
    EXPECT_EQ(error["code"], "invalid_api_key");
    EXPECT_EQ(response.body.find("sk-wrong"), std::string::npos);
  }
  EXPECT_EQ(http_request(gateway.port(), "GET", "/v1/models").status, 401u);
  EXPECT_EQ(upstream_->stats().requests, 0u);
  // The three places a key may come from.
  EXPECT_EQ(chat(gateway, bearer(kTeamKey)).status, 200u);
  EXPECT_EQ(chat(gateway, {{"api-key", kTeamKey}}).status, 200u);
  EXPECT_EQ(chat(gateway, {{"x-api-key", kTeamKey}}).status, 200u);
  // The client's key never travels upstream.
  for (const auto& seen : upstream_->recent_requests()) {
    for (const auto& [name, value] : seen.headers) {
      EXPECT_EQ(value.find(kTeamKey), std::string::npos) << name;
    }
  }
}

TEST_F(Auth, KeyStoredAsSha256Authenticates) {
  TestGateway gateway(
      config_with_keys(upstream_->base_url(),
                       "    - name: team-a\n      key_sha256: " + hex_sha256(kTeamKey) + "\n"));
  EXPECT_EQ(chat(gateway, bearer(kTeamKey)).status, 200u);
  EXPECT_EQ(chat(gateway, bearer(kOtherKey)).status, 401u);
}

TEST_F(Auth, ForbiddenModelIs404AndHiddenFromModelList) {
  TestGateway gateway(
      config_with_keys(upstream_->base_url(), std::string("    - name: team-a\n      key: ") +
                                                  kTeamKey + "\n      models: [\"chat-*\"]\n"));
  auto denied = chat(gateway, bearer(kTeamKey), "secret-model");
  EXPECT_EQ(denied.status, 404u);
  EXPECT_EQ(json::parse(denied.body)["error"]["code"], "model_not_found");
  EXPECT_EQ(chat(gateway, bearer(kTeamKey), "chat-fast").status, 200u);

  auto models = http_request(gateway.port(), "GET", "/v1/models", "", bearer(kTeamKey));
  ASSERT_EQ(models.status, 200u);
  auto data = json::parse(models.body)["data"];
  ASSERT_EQ(data.size(), 1u);
  EXPECT_EQ(data[0]["id"], "chat-fast");

  // Asked for by name, a model the key may not use does not exist either.
  auto hidden =
      http_request(gateway.port(), "GET", "/v1/models/secret-model", "", bearer(kTeamKey));
  EXPECT_EQ(hidden.status, 404u);
  EXPECT_EQ(json::parse(hidden.body)["error"]["code"], "model_not_found");
  auto shown = http_request(gateway.port(), "GET", "/v1/models/chat-fast", "", bearer(kTeamKey));
  ASSERT_EQ(shown.status, 200u) << shown.body;
  EXPECT_EQ(json::parse(shown.body)["id"], "chat-fast");
  EXPECT_EQ(http_request(gateway.port(), "GET", "/v1/models/chat-fast").status, 401u);
}

TEST_F(Auth, RpmLimitGives429AfterExactlyRpmRequestsWithHeaders) {
  TestGateway gateway(config_with_keys(
      upstream_->base_url(),
      std::string("    - name: team-a\n      key: ") + kTeamKey + "\n      rpm: 5\n"));
  for (int i = 0; i < 5; ++i) {
    auto response = chat(gateway, bearer(kTeamKey));
    ASSERT_EQ(response.status, 200u) << "request " << i;
    EXPECT_EQ(response.header("x-ratelimit-limit-requests"), "5");
    EXPECT_EQ(response.header("x-ratelimit-remaining-requests"), std::to_string(4 - i));
    EXPECT_FALSE(response.header("x-ratelimit-reset-requests").empty());
  }
  auto limited = chat(gateway, bearer(kTeamKey));
  EXPECT_EQ(limited.status, 429u);
  auto error = json::parse(limited.body)["error"];
  EXPECT_EQ(error["code"], "rate_limit_exceeded");
  EXPECT_NE(error["message"].get<std::string>().find("team-a"), std::string::npos);
  EXPECT_GE(std::stoi(limited.header("retry-after")), 1);
  EXPECT_EQ(limited.header("x-ratelimit-remaining-requests"), "0");
  EXPECT_EQ(upstream_->stats().requests, 5u);
  // Another key has its own budget.
}

TEST_F(Auth, TpmReservationIsSettledWithTheReportedUsage) {
  TestGateway gateway(config_with_keys(
      upstream_->base_url(),
      std::string("    - name: team-a\n      key: ") + kTeamKey + "\n      tpm: 2000\n"));
  // Each request reserves about 1,500 tokens up front (its max_tokens). Kept
  // at the estimate, the third would be refused; settled with the ~20 tokens
  // the mock reports, all of them pass.
  for (bool stream : {false, true}) {
    for (int i = 0; i < 4; ++i) {
      auto response =
          http_request(gateway.port(), "POST", "/v1/chat/completions",
                       chat_body("chat-fast", stream, "\"max_tokens\":1500"), bearer(kTeamKey));
      ASSERT_EQ(response.status, 200u) << (stream ? "stream " : "json ") << i << response.body;
      EXPECT_EQ(response.header("x-ratelimit-limit-tokens"), "2000");
    }
  }
  // The last response reaches the client a moment before its request is
  // settled, so a request sent straight after may still see it reserved.
  EXPECT_TRUE(eventually(
      [&] {
        auto remaining =
            http_request(gateway.port(), "POST", "/v1/chat/completions",
                         chat_body("chat-fast", false, "\"max_tokens\":1"), bearer(kTeamKey));
        return std::stoul(remaining.header("x-ratelimit-remaining-tokens")) > 1500u;
      },
      2s));
}

TEST_F(Auth, TpmLimitRefusesOnceTheBudgetIsSpent) {
  TestGateway gateway(config_with_keys(
      upstream_->base_url(),
      std::string("    - name: team-a\n      key: ") + kTeamKey + "\n      tpm: 30\n"));
  // The mock reports about 10 tokens per answer: a few answers spend the
  // 30-token budget, and the next request is refused.
  int allowed = 0;
  bool refused = false;
  for (int i = 0; i < 10; ++i) {
    auto response =
        http_request(gateway.port(), "POST", "/v1/chat/completions",
                     chat_body("chat-fast", false, "\"max_tokens\":1"), bearer(kTeamKey));
    if (response.status == 429u) {
      EXPECT_EQ(json::parse(response.body)["error"]["code"], "rate_limit_exceeded");
      EXPECT_EQ(response.header("x-ratelimit-limit-tokens"), "30");
      refused = true;
      break;
    }
    ASSERT_EQ(response.status, 200u);
    ++allowed;
  }
  EXPECT_TRUE(refused);
  EXPECT_GE(allowed, 1);
  EXPECT_LE(allowed, 5);
}

// A refused request spends nothing upstream, however many tokens it asks
// for: it must not cost the key its budget (once, a typo in the model name
// with a huge max_tokens locked the key out for a year).
TEST_F(Auth, RefusedRequestReservesNoTokens) {
  TestGateway gateway(
      std::string("auth:\n  keys:\n    - name: team-a\n      key: ") + kTeamKey +
      "\n      tpm: 100000\nmodels:\n  - name: chat-fast\n    deployments:\n" +
      deployment_yaml("fast", upstream_->base_url()) +
      "  - name: auto\n    rules:\n      - {when: {contains_any: [sql]}, model: chat-fast}\n");
  const std::string huge = "\"max_tokens\":1000000000000";
  auto typo = http_request(gateway.port(), "POST", "/v1/chat/completions",
                           chat_body("typo", false, huge), bearer(kTeamKey));
  EXPECT_EQ(typo.status, 404u) << typo.body;
  EXPECT_EQ(typo.header("x-ratelimit-remaining-tokens"), "100000");
  auto unmatched = http_request(gateway.port(), "POST", "/v1/chat/completions",
                                chat_body("auto", false, huge), bearer(kTeamKey));
  EXPECT_EQ(unmatched.status, 400u) << unmatched.body;
  EXPECT_EQ(json::parse(unmatched.body)["error"]["code"], "no_matching_rule");

  auto next = http_request(gateway.port(), "POST", "/v1/chat/completions",
                           chat_body("chat-fast", false), bearer(kTeamKey));
  EXPECT_EQ(next.status, 200u) << next.body;
  EXPECT_EQ(upstream_->stats().requests, 1u);
}

// Every attempt failed before its first byte: nothing was spent upstream,
// and the whole reservation is given back.
TEST_F(Auth, UpstreamFailureGivesTheReservationBack) {
  mock::Behaviour failing;
  failing.fail = "500";
  auto broken = start_mock(failing);
  TestGateway gateway(std::string("router:\n  retries: 0\nauth:\n  keys:\n    - name: team-a\n"
                                  "      key: ") +
                      kTeamKey + "\n      tpm: 1000\nmodels:\n  - name: chat-fast\n" +
                      "    deployments:\n" + deployment_yaml("fast", upstream_->base_url()) +
                      "  - name: chat-broken\n    deployments:\n" +
                      deployment_yaml("broken", broken->base_url()));
  // Reserves a minute's budget: kept, the key could send nothing more for
  // a minute.
  auto failed =
      http_request(gateway.port(), "POST", "/v1/chat/completions",
                   chat_body("chat-broken", false, "\"max_tokens\":1000"), bearer(kTeamKey));
  ASSERT_EQ(failed.status, 500u) << failed.body;
  EXPECT_EQ(broken->stats().requests, 1u);
  // The failure reaches the client a moment before the reservation is
  // settled; kept, it would let a request through only once it had been
  // paid off, with nothing left of the budget.
  HttpResponse next;
  EXPECT_TRUE(eventually(
      [&] {
        next = http_request(gateway.port(), "POST", "/v1/chat/completions",
                            chat_body("chat-fast", false, "\"max_tokens\":1"), bearer(kTeamKey));
        return next.status == 200u;
      },
      2s));
  EXPECT_GT(std::stoul(next.header("x-ratelimit-remaining-tokens")), 900u);
}

TEST_F(Auth, UsageChunkIsRequestedUpstreamAndHiddenFromTheClient) {
  TestGateway gateway(config_with_keys(
      upstream_->base_url(),
      std::string("    - name: team-a\n      key: ") + kTeamKey + "\n      tpm: 100000\n"));
  auto response = http_request(gateway.port(), "POST", "/v1/chat/completions",
                               chat_body("chat-fast", true), bearer(kTeamKey));
  ASSERT_EQ(response.status, 200u);
  auto sent = json::parse(upstream_->recent_requests().back().body);
  EXPECT_EQ(sent["stream_options"]["include_usage"], true);
  auto events = sse_data(response.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  for (const auto& event : events) {
    EXPECT_EQ(event.find("\"usage\":{"), std::string::npos) << event;
  }

  // A client that asks for usage itself gets it.
  auto asked =
      http_request(gateway.port(), "POST", "/v1/chat/completions",
                   chat_body("chat-fast", true, "\"stream_options\":{\"include_usage\":true}"),
                   bearer(kTeamKey));
  bool saw_usage = false;
  for (const auto& event : sse_data(asked.body)) {
    saw_usage = saw_usage || event.find("\"usage\":{") != std::string::npos;
  }
  EXPECT_TRUE(saw_usage);
}

TEST_F(Auth, MaxParallelCountsStreamsUntilTheyEnd) {
  mock::Behaviour slow;
  slow.interval = 100ms;
  slow.tokens = 5;
  upstream_->set_behaviour(slow);
  TestGateway gateway(config_with_keys(
      upstream_->base_url(),
      std::string("    - name: team-a\n      key: ") + kTeamKey + "\n      max_parallel: 2\n"));
  HttpConnection first(gateway.port()), second(gateway.port());
  first.send("POST", "/v1/chat/completions", chat_body("chat-fast", true), bearer(kTeamKey));
  second.send("POST", "/v1/chat/completions", chat_body("chat-fast", true), bearer(kTeamKey));
  ASSERT_EQ(first.read_head().status, 200u);
  ASSERT_EQ(second.read_head().status, 200u);
  auto third = chat(gateway, bearer(kTeamKey));
  EXPECT_EQ(third.status, 429u);
  EXPECT_NE(json::parse(third.body)["error"]["message"].get<std::string>().find("max_parallel"),
            std::string::npos);
  first.read_rest_of_body();
  EXPECT_EQ(chat(gateway, bearer(kTeamKey)).status, 200u);
  second.read_rest_of_body();
}

// The binary refuses a config without keys unless auth is explicitly off.
TEST(AuthStartup, RefusesToStartWithoutKeys) {
  const char* binary = std::getenv("SLUICE_BINARY");
  ASSERT_NE(binary, nullptr) << "SLUICE_BINARY is not set";
  TempFile config(
      "models:\n  - name: m\n    deployments:\n      - base_url: http://127.0.0.1:9/v1\n", ".yaml");
  std::string command = std::string(binary) + " --check-config " + config.path() + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  int status = pclose(pipe);
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(output.find("auth"), std::string::npos) << output;

  TempFile opted_out(
      "auth:\n  disabled: true\nmodels:\n  - name: m\n    deployments:\n"
      "      - base_url: http://127.0.0.1:9/v1\n",
      ".yaml");
  command = std::string(binary) + " --check-config " + opted_out.path() + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(command.c_str())), 0);
}

}  // namespace
}  // namespace sluice::testing

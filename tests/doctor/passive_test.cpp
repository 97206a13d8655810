// The passive mode: traffic driven through a gateway with router.diagnosis,
// then the gateway's /admin/diagnosis read and judged; each scenario is
// dominated by one cause, which the verdict names.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "mock/mock_server.hpp"
#include "sluice/doctor/passive.hpp"
#include "support/certificates.hpp"
#include "support/child_process.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::doctor {
namespace {

using namespace std::chrono_literals;
using testing::TempFile;

std::string passive_yaml(const std::string& base_url, const std::string& router,
                         const std::string& extra = "") {
  return "auth: {disabled: true}\nrouter: " + router +
         "\nmodels:\n  - name: chat\n    deployments:\n      - id: upstream\n        base_url: " +
         base_url + "\n        model: mock-model\n" + extra;
}

// A streamed chat completion whose prompt is about `tokens` tokens.
void ask(std::uint16_t port, unsigned tokens) {
  const std::string body = R"({"model":"chat","stream":true,"max_tokens":1,"messages":[)"
                           R"({"role":"user","content":")" +
                           std::string(std::size_t{tokens} * 4, 'w') + R"("}]})";
  const auto response = testing::http_request(port, "POST", "/v1/chat/completions", body,
                                              {{"Content-Type", "application/json"}});
  EXPECT_EQ(response.status, 200u) << response.body;
}

void burst_through(std::uint16_t port, unsigned count) {
  std::vector<std::thread> clients;
  for (unsigned i = 0; i < count; ++i) clients.emplace_back([port] { ask(port, 16); });
  for (auto& client : clients) client.join();
}

DeploymentReport read_one(testing::TestGateway& gateway) {
  std::string error;
  auto reports = read_gateway(
      "http://127.0.0.1:" + std::to_string(gateway.gateway().admin_port()) + "/", "", error);
  EXPECT_TRUE(reports.has_value()) << error;
  if (!reports || reports->size() != 1) {
    ADD_FAILURE() << "expected one deployment diagnosed";
    return {};
  }
  return reports->front();
}

TEST(DoctorPassive, QueueingBehindTheUpstreamsSlotsIsNamed) {
  mock::Behaviour behaviour;
  behaviour.ttft = 40ms;
  behaviour.slots = 2;
  auto mock = testing::start_mock(behaviour);
  testing::TestGateway gateway(passive_yaml(mock->base_url(), "{diagnosis: true}"));
  for (int i = 0; i < 4; ++i) ask(gateway.port(), 16);
  for (int i = 0; i < 3; ++i) burst_through(gateway.port(), 8);
  const auto report = read_one(gateway);
  ASSERT_TRUE(report.queueing.has_value());
  EXPECT_GE(report.queueing->levels.size(), 3u);
  EXPECT_TRUE(report.queueing->knee.has_value());
  EXPECT_EQ(report.verdict.dominant, Cause::queueing) << report.verdict.text;

  // The same through the binary, as an operator runs it.
  testing::ChildProcess doctor(
      testing::built_binary("SLUICE_BINARY", "src/sluice").value_or("sluice"),
      {"doctor", "--from",
       "http://127.0.0.1:" + std::to_string(gateway.gateway().admin_port()) + "/", "--json"});
  ASSERT_EQ(doctor.wait_exit(20s), 0) << doctor.standard_error();
  const auto json = nlohmann::json::parse(doctor.standard_output());
  EXPECT_EQ(json["deployments"][0]["verdict"]["cause"], "queueing") << json.dump(2);
  // Passive: nothing but the driven traffic reached the upstream.
  EXPECT_EQ(mock->stats().requests, 4u + 3 * 8);
}

TEST(DoctorPassive, LongPromptsAreNamedFromThePromptClasses) {
  mock::Behaviour behaviour;
  behaviour.ttft = 5ms;
  behaviour.ttft_per_prompt_token = 100us;
  auto mock = testing::start_mock(behaviour);
  testing::TestGateway gateway(
      passive_yaml(mock->base_url(), "{diagnosis: true, prompt_classes: true}"));
  for (int i = 0; i < 3; ++i) {
    ask(gateway.port(), 100);
    ask(gateway.port(), 5000);
  }
  const auto report = read_one(gateway);
  ASSERT_TRUE(report.prefill.has_value());
  ASSERT_TRUE(report.prefill->fit.valid);
  EXPECT_GT(report.prefill->fit.ms_per_1k_tokens(), 80);
  EXPECT_EQ(report.verdict.dominant, Cause::prefill) << report.verdict.text;
}

TEST(DoctorPassive, ASlowHandshakeIsNamedAsTheNetwork) {
  const auto certificate = testing::make_self_signed_certificate();
  mock::MockServer::Options options;
  options.behaviour.accept_delay = 150ms;
  options.behaviour.ttft = 5ms;
  options.tls_cert_pem = certificate.cert_pem;
  options.tls_key_pem = certificate.key_pem;
  mock::MockServer mock(options);
  mock.start();
  TempFile ca(certificate.cert_pem, ".pem");
  // No pooling: every request opens a connection, as after an idle spell.
  testing::TestGateway gateway(
      "upstream: {max_idle_per_origin: 0}\n" +
      passive_yaml("https://127.0.0.1:" + std::to_string(mock.port()) + "/v1", "{diagnosis: true}",
                   "        ca_file: " + ca.path() + "\n        warm_connections: 0\n"));
  for (int i = 0; i < 4; ++i) ask(gateway.port(), 16);
  const auto report = read_one(gateway);
  ASSERT_TRUE(report.network.has_value());
  EXPECT_NEAR(report.network->setup_ms, 150, 30);
  EXPECT_EQ(report.verdict.dominant, Cause::network) << report.verdict.text;
}

TEST(DoctorPassive, DiagnosisWindowsAreEmptyUnlessAskedFor) {
  auto mock = testing::start_mock();
  testing::TestGateway gateway(passive_yaml(mock->base_url(), "{window: 20}"));
  ask(gateway.port(), 16);
  const auto response =
      testing::http_request(gateway.gateway().admin_port(), "GET", "/admin/diagnosis");
  ASSERT_EQ(response.status, 200u);
  const auto json = nlohmann::json::parse(response.body);
  EXPECT_EQ(json["diagnosis"], false);
  EXPECT_EQ(json["deployments"][0]["ttfb"]["samples"], 1);
  EXPECT_FALSE(json["deployments"][0].contains("in_flight"));
  EXPECT_FALSE(json["deployments"][0].contains("connect"));
}

}  // namespace
}  // namespace sluice::doctor

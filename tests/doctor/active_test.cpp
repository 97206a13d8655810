// The active mode against sluice-mock: each cause the mock injects is
// recovered within 20% and named by the verdict; unreachable deployments are
// reported and fail the run.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "mock/mock_server.hpp"
#include "sluice/config/config.hpp"
#include "sluice/doctor/probe.hpp"
#include "sluice/doctor/report.hpp"
#include "support/certificates.hpp"
#include "support/child_process.hpp"
#include "support/gateway_fixture.hpp"

namespace sluice::doctor {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::TempFile;

std::string one_deployment_yaml(const std::string& base_url, const std::string& extra = "") {
  return "auth: {disabled: true}\nmodels:\n  - name: probe-model\n    deployments:\n"
         "      - id: probe\n        base_url: " +
         base_url + "\n        model: mock-model\n" + extra;
}

DeploymentReport diagnose_yaml(const std::string& yaml, const PlanLimits& limits) {
  auto config = config::load_string(yaml);
  std::string why;
  auto plan = make_plan(limits, why);
  EXPECT_TRUE(plan.has_value()) << why;
  const auto& model = config->models.front();
  const auto& deployment = model.deployments.front();
  auto measurement = measure(model, deployment, *plan, [](std::string_view, unsigned, unsigned) {});
  EXPECT_EQ(measurement.failure, "");
  EXPECT_EQ(measurement.requests_failed, 0u) << measurement.last_error;
  EXPECT_EQ(measurement.requests_sent, plan->requests());
  return diagnose(measurement, deployment.warm_connections);
}

TEST(DoctorActive, AnAcceptDelayIsRecoveredAsNetworkAndNamedTheCause) {
  // Over TLS the hold delays the handshake, as a distant network does.
  const auto certificate = testing::make_self_signed_certificate();
  mock::MockServer::Options options;
  options.behaviour.accept_delay = 120ms;
  options.behaviour.ttft = 10ms;
  options.tls_cert_pem = certificate.cert_pem;
  options.tls_key_pem = certificate.key_pem;
  mock::MockServer mock(options);
  mock.start();
  TempFile ca(certificate.cert_pem, ".pem");
  const auto report =
      diagnose_yaml(one_deployment_yaml("https://127.0.0.1:" + std::to_string(mock.port()) + "/v1",
                                        "        ca_file: " + ca.path() + "\n"),
                    PlanLimits{30, 1024, 4});
  ASSERT_TRUE(report.network.has_value());
  EXPECT_NEAR(report.network->setup_ms, 120, 24);
  EXPECT_NEAR(report.network->tls.median, 120, 24);
  EXPECT_LT(report.network->pooled_ttft.median, 40);
  EXPECT_EQ(report.verdict.dominant, Cause::network) << report.verdict.text;
  bool warm_suggested = false;
  for (const auto& suggestion : report.suggestions) {
    warm_suggested |= suggestion.line.starts_with("warm_connections: ");
  }
  EXPECT_TRUE(warm_suggested);
}

TEST(DoctorActive, APrefillCostPerTokenIsRecoveredByTheFit) {
  mock::Behaviour behaviour;
  behaviour.ttft = 5ms;
  behaviour.ttft_per_prompt_token = 100us;
  auto mock = testing::start_mock(behaviour);
  const auto report = diagnose_yaml(one_deployment_yaml(mock->base_url()), PlanLimits{30, 4096, 4});
  ASSERT_TRUE(report.prefill.has_value());
  ASSERT_TRUE(report.prefill->fit.valid);
  EXPECT_NEAR(report.prefill->fit.ms_per_1k_tokens(), 100, 20);
  EXPECT_GT(report.prefill->fit.r_squared, 0.9);
  EXPECT_EQ(report.verdict.dominant, Cause::prefill) << report.verdict.text;
}

TEST(DoctorActive, ASlotCountIsRecoveredFromTheBursts) {
  mock::Behaviour behaviour;
  behaviour.ttft = 40ms;
  behaviour.slots = 2;
  auto mock = testing::start_mock(behaviour);
  const auto report = diagnose_yaml(one_deployment_yaml(mock->base_url()), PlanLimits{40, 256, 8});
  ASSERT_TRUE(report.queueing.has_value());
  ASSERT_TRUE(report.queueing->knee.has_value()) << report.verdict.text;
  ASSERT_TRUE(report.queueing->capacity.has_value());
  EXPECT_NEAR(*report.queueing->capacity, 2, 0.4);
  EXPECT_EQ(report.verdict.dominant, Cause::queueing) << report.verdict.text;
  bool capped = false;
  for (const auto& suggestion : report.suggestions) capped |= suggestion.line == "max_parallel: 2";
  EXPECT_TRUE(capped);
}

// A loopback port nothing listens on.
unsigned short closed_port() {
  boost::asio::io_context context;
  boost::asio::ip::tcp::acceptor acceptor(
      context, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  const auto port = acceptor.local_endpoint().port();
  acceptor.close();
  return port;
}

std::string sluice_binary() {
  auto binary = testing::built_binary("SLUICE_BINARY", "src/sluice");
  return binary.value_or("sluice");
}

TEST(DoctorActive, UnreachableDeploymentsAreReportedAndTheRunFails) {
  mock::Behaviour refusing;
  refusing.fail = "401";
  auto mock = testing::start_mock(refusing);
  const std::string yaml =
      "auth: {disabled: true}\nmodels:\n  - name: m\n    deployments:\n"
      "      - id: refused\n        base_url: http://127.0.0.1:" +
      std::to_string(closed_port()) +
      "/v1\n"
      "      - id: no-such-host\n        base_url: http://no-such-host.invalid/v1\n"
      "      - id: unauthorised\n        base_url: " +
      mock->base_url() + "\n";
  TempFile config(yaml, ".yaml");
  ChildProcess doctor(sluice_binary(),
                      {"doctor", "--config", config.path(), "--yes", "--max-requests", "10"});
  EXPECT_EQ(doctor.wait_exit(30s), 1);
  const auto out = doctor.standard_output();
  EXPECT_NE(out.find("m / refused"), std::string::npos) << out;
  EXPECT_NE(out.find("FAILED: cannot connect: Connection refused"), std::string::npos) << out;
  EXPECT_NE(out.find("FAILED: DNS lookup of no-such-host.invalid failed"), std::string::npos)
      << out;
  EXPECT_NE(out.find("FAILED: HTTP 401"), std::string::npos) << out;
  // One request each: a deployment that fails its first is not tried again.
  EXPECT_EQ(mock->stats().requests, 1u);
}

TEST(DoctorActive, ATlsVerificationFailureIsNamed) {
  const auto certificate = testing::make_self_signed_certificate();
  mock::MockServer::Options options;
  options.tls_cert_pem = certificate.cert_pem;
  options.tls_key_pem = certificate.key_pem;
  mock::MockServer mock(options);
  mock.start();
  TempFile config(one_deployment_yaml("https://127.0.0.1:" + std::to_string(mock.port()) + "/v1"),
                  ".yaml");
  ChildProcess doctor(sluice_binary(), {"doctor", "--config", config.path(), "--yes", "--json"});
  EXPECT_EQ(doctor.wait_exit(30s), 1);
  const auto json = nlohmann::json::parse(doctor.standard_output());
  const std::string failure = json["deployments"][0]["failure"];
  EXPECT_NE(failure.find("TLS handshake failed"), std::string::npos) << failure;
  EXPECT_NE(failure.find("certificate verify failed"), std::string::npos) << failure;
}

TEST(DoctorActive, ZeroMaxRequestsIsRefusedWithAMessage) {
  TempFile config(one_deployment_yaml("http://127.0.0.1:9/v1"), ".yaml");
  ChildProcess doctor(sluice_binary(),
                      {"doctor", "--config", config.path(), "--max-requests", "0"});
  EXPECT_EQ(doctor.wait_exit(10s), 2);
  EXPECT_NE(doctor.standard_error().find("--max-requests 0 would send nothing"), std::string::npos)
      << doctor.standard_error();
}

TEST(DoctorActive, OutWritesTheReportWithWellFormedSvgPlots) {
  mock::Behaviour behaviour;
  behaviour.ttft = 2ms;
  behaviour.ttft_per_prompt_token = 20us;
  auto mock = testing::start_mock(behaviour);
  TempFile config(one_deployment_yaml(mock->base_url()), ".yaml");
  const auto dir = std::filesystem::temp_directory_path() /
                   ("sluice-doctor-" + std::to_string(::getpid()) + "-out");
  std::filesystem::remove_all(dir);
  ChildProcess doctor(
      sluice_binary(),
      {"doctor", "--config", config.path(), "--yes", "--max-requests", "20", "--max-prompt-tokens",
       "1024", "--max-concurrency", "4", "--out", dir.string(), "--plots", "svg"});
  ASSERT_EQ(doctor.wait_exit(30s), 0) << doctor.standard_error();
  const auto read = [](const std::filesystem::path& path) {
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  };
  const auto markdown = read(dir / "report.md");
  EXPECT_NE(markdown.find("**Verdict:**"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("](probe-prompt-length.svg)"), std::string::npos) << markdown;
  for (const char* name : {"probe-prompt-length.svg", "probe-concurrency.svg"}) {
    const auto svg = read(dir / name);
    ASSERT_FALSE(svg.empty()) << name;
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
    EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
    EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
    // Every element opened is closed: self-closing, or by its end tag.
    std::size_t opened = 0;
    std::size_t closed = 0;
    for (std::size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
      if (svg.compare(at, 2, "<?") == 0) continue;
      const auto end = svg.find('>', at);
      ASSERT_NE(end, std::string::npos);
      if (svg[at + 1] == '/') {
        ++closed;
      } else if (svg[end - 1] != '/') {
        ++opened;
      }
    }
    EXPECT_EQ(opened, closed) << name;
  }
  EXPECT_NE(read(dir / "probe-prompt-length.svg").find("<circle"), std::string::npos);
  EXPECT_NE(read(dir / "probe-prompt-length.svg").find("fit: "), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sluice::doctor

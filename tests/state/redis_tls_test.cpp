// rediss://: the shared state over TLS to a redis-server with a certificate
// made at test time, verified as an upstream's is; a certificate that does
// not verify is named at start, and the gateway runs on local state.
#include <gtest/gtest.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "support/certificates.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/redis_server.hpp"

namespace sluice::testing {
namespace {

using nlohmann::json;

constexpr const char* kTlsKey = "sk-tls-state-0123456789";

// A redis-server answering TLS with `certificate` on its TLS port (clients
// need no certificate of their own), and plain text on its other.
struct TlsRedis {
  explicit TlsRedis(const Certificate& certificate)
      : cert(certificate.cert_pem, ".pem"),
        key(certificate.key_pem, ".pem"),
        server({"--tls-port", RedisServer::kTlsPortArgument, "--tls-cert-file", cert.path(),
                "--tls-key-file", key.path(), "--tls-ca-cert-file", cert.path(),
                "--tls-auth-clients", "no"}) {}

  std::string url(const std::string& host) const {
    return "rediss://" + host + ":" + std::to_string(server.tls_port());
  }

  TempFile cert;
  TempFile key;
  RedisServer server;
};

std::string tls_state_config(const std::string& url, const std::string& ca_file,
                             const std::string& base_url) {
  std::string yaml =
      "server:\n  admin_listen: 127.0.0.1:0\n  threads: 2\n"
      "state:\n  backend: redis\n  redis:\n    url: " +
      url + "\n    timeout: 200ms\n";
  if (!ca_file.empty()) yaml += "    ca_file: " + ca_file + "\n";
  return yaml + "auth:\n  keys:\n    - name: tls-team\n      key: " + kTlsKey +
         "\n      rpm: 2\nmodels:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("d1", base_url);
}

HttpResponse tls_chat(TestGateway& gateway) {
  return http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false),
                      bearer(kTlsKey));
}

json tls_routes_state(TestGateway& gateway) {
  return json::parse(
      http_request(gateway.gateway().admin_port(), "GET", "/admin/routes").body)["state"];
}

// The errors logged from now on; the sink stays for the rest of the process.
std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> capture_tls_errors() {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  sink->set_level(spdlog::level::err);
  spdlog::default_logger()->sinks().push_back(sink);
  return sink;
}

bool logged(spdlog::sinks::ringbuffer_sink_mt& sink, const std::string& text) {
  for (const auto& line : sink.last_formatted()) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

class RedisTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed (scripts/setup)";
  }
};

TEST_F(RedisTls, SharesLimitsOverAVerifiedConnection) {
  auto upstream = start_mock();
  TlsRedis redis(make_self_signed_certificate());
  TestGateway first(
      tls_state_config(redis.url("localhost"), redis.cert.path(), upstream->base_url()));
  TestGateway second(
      tls_state_config(redis.url("127.0.0.1"), redis.cert.path(), upstream->base_url()));
  for (TestGateway* gateway : {&first, &second}) {
    ASSERT_TRUE(eventually([&] { return tls_routes_state(*gateway)["up"] == true; }))
        << tls_routes_state(*gateway).dump();
  }
  // rpm 2 across both: the third request is refused wherever it lands.
  EXPECT_EQ(tls_chat(first).status, 200u);
  EXPECT_EQ(tls_chat(second).status, 200u);
  EXPECT_EQ(tls_chat(first).status, 429u);
  EXPECT_EQ(tls_chat(second).status, 429u);
  auto keys = redis.server.command({"KEYS", "sluice:{key:tls-team}:*"});
  EXPECT_NE(keys.find("sluice:{key:tls-team}:rpm:2"), std::string::npos) << keys;
}

TEST_F(RedisTls, AnUntrustedCertificateIsNamedAndTheGatewayRunsOnLocalState) {
  auto upstream = start_mock();
  TlsRedis redis(make_self_signed_certificate());
  auto errors = capture_tls_errors();
  // No CA file: the system store does not know a certificate made just now.
  TestGateway gateway(tls_state_config(redis.url("localhost"), "", upstream->base_url()));
  EXPECT_TRUE(logged(*errors, "TLS certificate verification failed: self-signed certificate"));
  ASSERT_TRUE(eventually([&] { return tls_routes_state(gateway).contains("error"); }));
  auto state = tls_routes_state(gateway);
  EXPECT_EQ(state["up"], false);
  EXPECT_NE(state["error"].get<std::string>().find("self-signed certificate"), std::string::npos)
      << state.dump();
  // The local limits hold meanwhile.
  EXPECT_EQ(tls_chat(gateway).status, 200u);
  EXPECT_EQ(tls_chat(gateway).status, 200u);
  EXPECT_EQ(tls_chat(gateway).status, 429u);
  EXPECT_EQ(redis.server.command({"DBSIZE"}), ":0\r\n");
}

TEST_F(RedisTls, ACertificateForAnotherNameIsRefused) {
  auto upstream = start_mock();
  TlsRedis redis(make_self_signed_certificate("DNS:elsewhere.example"));
  auto errors = capture_tls_errors();
  TestGateway gateway(
      tls_state_config(redis.url("localhost"), redis.cert.path(), upstream->base_url()));
  EXPECT_TRUE(logged(*errors, "TLS certificate verification failed: hostname mismatch"));
  ASSERT_TRUE(eventually([&] { return tls_routes_state(gateway).contains("error"); }));
  EXPECT_EQ(tls_routes_state(gateway)["up"], false);
  EXPECT_EQ(tls_chat(gateway).status, 200u);
}

}  // namespace
}  // namespace sluice::testing

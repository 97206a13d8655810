// HTTPS upstreams: certificate verification on by default, SNI, and the
// explicit opt-out.
#include <gtest/gtest.h>

#include "support/certificates.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/leak_check.hpp"

namespace sluice::testing {
namespace {

class TlsUpstream : public ::testing::Test {
 protected:
  void SetUp() override {
    certificate_ = make_self_signed_certificate();
    mock::MockServer::Options options;
    options.tls_cert_pem = certificate_.cert_pem;
    options.tls_key_pem = certificate_.key_pem;
    upstream_ = std::make_unique<mock::MockServer>(options);
    upstream_->start();
    ca_file_ = std::make_unique<TempFile>(certificate_.cert_pem, ".pem");
  }

  std::string base_url(const std::string& host) const {
    return "https://" + host + ":" + std::to_string(upstream_->port()) + "/v1";
  }

  std::string config(const std::string& host, const std::string& extra) const {
    return "router:\n  retries: 0\nmodels:\n  - name: chat\n    deployments:\n" +
           deployment_yaml("tls", base_url(host), extra);
  }

  Certificate certificate_;
  std::unique_ptr<mock::MockServer> upstream_;
  std::unique_ptr<TempFile> ca_file_;
};

TEST_F(TlsUpstream, TrustedCertificateServesStreams) {
  TestGateway gateway(config("localhost", "        ca_file: " + ca_file_->path() + "\n"));
  // Each of the two worker threads opens a warm connection, handshake done.
  ASSERT_TRUE(eventually([&] { return gateway.idle_upstream_connections() == 2; }));
  HttpConnection client(gateway.port());
  for (int i = 0; i < 3; ++i) {
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", true));
    ASSERT_EQ(response.status, 200u) << response.body;
    EXPECT_EQ(sse_data(response.body).back(), "[DONE]");
  }
  // TLS connections are pooled like plain ones: every request used the warm
  // connection of its worker.
  EXPECT_EQ(upstream_->stats().connections_accepted, 2u);
}

TEST_F(TlsUpstream, IpAddressIsVerifiedAgainstSubjectAltName) {
  TestGateway gateway(config("127.0.0.1", "        ca_file: " + ca_file_->path() + "\n"));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 200u) << response.body;
}

TEST_F(TlsUpstream, UntrustedCertificateIs502) {
  TestGateway gateway(config("localhost", kNoWarmConnections));
  LeakCheck leaks(gateway);
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 502u) << response.body;
  EXPECT_NE(response.body.find("tls"), std::string::npos) << response.body;
  EXPECT_EQ(upstream_->stats().requests, 0u);
  // The refused handshake's socket is closed on both ends.
  EXPECT_TRUE(leaks.settled());
  EXPECT_TRUE(eventually([&] { return upstream_->stats().open_connections == 0; }));
}

TEST_F(TlsUpstream, WrongHostNameIs502) {
  // A trusted certificate that names another host.
  auto other = make_self_signed_certificate("DNS:other.example");
  TempFile other_ca(other.cert_pem, ".pem");
  mock::MockServer::Options options;
  options.tls_cert_pem = other.cert_pem;
  options.tls_key_pem = other.key_pem;
  mock::MockServer impostor(options);
  impostor.start();
  TestGateway gateway(
      "router:\n  retries: 0\nmodels:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("tls", "https://localhost:" + std::to_string(impostor.port()) + "/v1",
                      kNoWarmConnections + "        ca_file: " + other_ca.path() + "\n"));
  LeakCheck leaks(gateway);
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 502u) << response.body;
  EXPECT_EQ(impostor.stats().requests, 0u);
  EXPECT_TRUE(leaks.settled());
}

TEST_F(TlsUpstream, VerificationCanBeTurnedOff) {
  TestGateway gateway(config("localhost", "        tls_verify: false\n"));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 200u) << response.body;
}

}  // namespace
}  // namespace sluice::testing

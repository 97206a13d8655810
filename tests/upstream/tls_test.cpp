// HTTPS upstreams: certificate verification on by default, SNI, and the
// explicit opt-out; warm connections kept across sweeps.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

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

// A TLS 1.3 server sends session tickets once the handshake is done: records
// that wait unread on an idle connection and carry no data. The sweep for
// connections the upstream closed must not take them for a close, or every
// sweep closes the warm connections and opens them again.
TEST_F(TlsUpstream, WarmConnectionsOutliveSweepsThatFindSessionTickets) {
  TestGateway gateway("server:\n  listen: 127.0.0.1:0\n  threads: 2\n" +
                      config("localhost", "        warm_connections: 2\n        ca_file: " +
                                              ca_file_->path() + "\n"));
  ASSERT_TRUE(eventually([&] { return gateway.idle_upstream_connections() == 4; }));
  // The tickets follow the handshake.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int sweep = 0; sweep < 5; ++sweep) {
    gateway.on_each_worker([](server::Worker& worker) {
      worker.pool().close_expired(Clock::now());
      worker.keep_warm();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(upstream_->stats().connections_accepted, 4u);
  EXPECT_EQ(gateway.idle_upstream_connections(), 4);
}

TEST_F(TlsUpstream, AWarmConnectionTheUpstreamClosedIsFoundClosed) {
  TestGateway gateway(config("localhost", "        ca_file: " + ca_file_->path() + "\n"));
  ASSERT_TRUE(eventually([&] { return gateway.idle_upstream_connections() == 2; }));
  upstream_->stop();
  EXPECT_TRUE(eventually([&] {
    gateway.on_each_worker(
        [](server::Worker& worker) { worker.pool().close_expired(Clock::now()); });
    return gateway.idle_upstream_connections() == 0;
  }));
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

TEST_F(TlsUpstream, LargeHeadsSentTogetherArriveIntact) {
  // One worker: the requests' heads are all written by the same thread, and a
  // head larger than a TLS record needs several socket writes, with waits
  // between them in which the worker sends the other requests.
  TestGateway gateway("server:\n  listen: 127.0.0.1:0\n  threads: 1\n  max_header_bytes: 65536\n" +
                      config("localhost", "        ca_file: " + ca_file_->path() + "\n"));
  constexpr int kRequests = 8;
  constexpr std::size_t kPadBytes = 40 * 1024;
  auto pad_of = [](int index) { return std::string(kPadBytes, static_cast<char>('a' + index)); };
  std::vector<std::thread> clients;
  std::vector<unsigned> statuses(kRequests);
  for (int index = 0; index < kRequests; ++index) {
    clients.emplace_back([&, index] {
      statuses[index] =
          http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false),
                       {{"x-pad", pad_of(index)}, {"x-request-id", "pad-" + std::to_string(index)}})
              .status;
    });
  }
  for (auto& client : clients) client.join();
  for (int index = 0; index < kRequests; ++index) EXPECT_EQ(statuses[index], 200u) << index;

  auto received = upstream_->recent_requests();
  ASSERT_EQ(received.size(), static_cast<std::size_t>(kRequests));
  std::set<std::string> ids;
  for (const auto& request : received) {
    auto id = request.header("x-request-id").value_or("");
    ASSERT_TRUE(id.starts_with("pad-")) << id;
    const int index = std::stoi(id.substr(4));
    EXPECT_EQ(request.header("x-pad"), pad_of(index)) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), static_cast<std::size_t>(kRequests));
}

TEST_F(TlsUpstream, VerificationCanBeTurnedOff) {
  TestGateway gateway(config("localhost", "        tls_verify: false\n"));
  auto response =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(response.status, 200u) << response.body;
}

}  // namespace
}  // namespace sluice::testing

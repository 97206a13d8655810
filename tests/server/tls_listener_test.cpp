// TLS on the listeners (server.tls, server.admin_tls): HTTPS requests,
// streamed and not; a plain-HTTP client turned away; mutual TLS; a
// certificate rotated by a reload; half-open handshakes cut at
// header_timeout; the admin listener over TLS.
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <csignal>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "support/certificates.hpp"
#include "support/child_process.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/tls_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;

// A test CA, and the certificate and key files of a server certificate it
// signed, named `common_name`.
struct TlsFiles {
  explicit TlsFiles(const Certificate& ca, const std::string& common_name)
      : server(make_signed_certificate(ca, common_name, "DNS:localhost,IP:127.0.0.1")),
        cert(server.cert_pem, ".pem"),
        key(server.key_pem, ".pem") {}
  // Puts `next`'s certificate and key in place of these files' contents.
  void replace_with(const Certificate& next) {
    std::ofstream(cert.path()) << next.cert_pem;
    std::ofstream(key.path()) << next.key_pem;
  }
  Certificate server;
  TempFile cert;
  TempFile key;
};

std::string tls_yaml(const std::string& key, const TlsFiles& files,
                     const std::string& client_ca = "") {
  std::string yaml =
      "  " + key + ":\n    cert: " + files.cert.path() + "\n    key: " + files.key.path() + "\n";
  if (!client_ca.empty()) yaml += "    client_ca: " + client_ca + "\n";
  return yaml;
}

std::string tls_gateway_yaml(const std::string& base_url, const std::string& server_lines) {
  return "server:\n  listen: 127.0.0.1:0\n  threads: 2\n" + server_lines +
         "models:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("d1", base_url, kNoWarmConnections);
}

// Whether a request over a new TLS connection with `identity` is answered.
bool tls_request_served(std::uint16_t port, const TlsClientIdentity& identity) {
  try {
    TlsConnection client(port, identity, 5s);
    return client.request("POST", "/v1/chat/completions", chat_body("chat", false)).status == 200;
  } catch (const std::exception&) {
    return false;
  }
}

TEST(TlsListener, ServesHttpsRequestsStreamedAndNotOverHttp11) {
  auto upstream = start_mock();
  const auto ca = make_self_signed_certificate("DNS:test-ca", "test ca");
  TlsFiles files(ca, "gateway");
  TestGateway gateway(tls_gateway_yaml(upstream->base_url(), tls_yaml("tls", files)));
  EXPECT_EQ(gateway.gateway().listen_url().rfind("https://", 0), 0u)
      << gateway.gateway().listen_url();

  TlsConnection client(gateway.port(), {ca.cert_pem, {}});
  // Offered h2 and http/1.1: the gateway speaks HTTP/1.1 only.
  EXPECT_EQ(client.alpn(), "http/1.1");
  EXPECT_EQ(client.peer_common_name(), "gateway");
  auto plain = client.request("POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(plain.status, 200u) << plain.body;
  EXPECT_EQ(nlohmann::json::parse(plain.body)["object"], "chat.completion");
  // The same connection, kept alive, carries a stream to its end.
  auto streamed = client.request("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  EXPECT_EQ(streamed.header("content-type").rfind("text/event-stream", 0), 0u);
  auto events = sse_data(streamed.body);
  ASSERT_GT(events.size(), 2u) << streamed.body;
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(client.request("GET", "/health").status, 200u);
}

TEST(TlsListener, PlainHttpToTheTlsListenerIsClosedAndOthersAreServed) {
  auto upstream = start_mock();
  const auto ca = make_self_signed_certificate("DNS:test-ca", "test ca");
  TlsFiles files(ca, "gateway");
  TestGateway gateway(tls_gateway_yaml(upstream->base_url(), tls_yaml("tls", files)));
  {
    HttpConnection plain(gateway.port(), 5s);
    plain.send("GET", "/health");
    // No HTTP answer: the handshake fails and the connection is closed.
    const auto reply = plain.read_until_close();
    EXPECT_EQ(reply.find("HTTP/1.1"), std::string::npos) << reply;
  }
  EXPECT_TRUE(tls_request_served(gateway.port(), {ca.cert_pem, {}}));
}

TEST(TlsListener, MutualTlsServesOnlyClientsWithACertificateFromItsCa) {
  auto upstream = start_mock();
  const auto ca = make_self_signed_certificate("DNS:test-ca", "test ca");
  const auto client_ca = make_self_signed_certificate("DNS:client-ca", "client ca");
  const auto other_ca = make_self_signed_certificate("DNS:other-ca", "other ca");
  TempFile client_ca_file(client_ca.cert_pem, ".pem");
  TlsFiles files(ca, "gateway");
  TestGateway gateway(
      tls_gateway_yaml(upstream->base_url(), tls_yaml("tls", files, client_ca_file.path())));

  EXPECT_TRUE(tls_request_served(gateway.port(),
                                 {ca.cert_pem, make_signed_certificate(client_ca, "client")}));
  // No certificate, one from another CA, and the other CA's own (self-signed).
  EXPECT_FALSE(tls_request_served(gateway.port(), {ca.cert_pem, {}}));
  EXPECT_FALSE(tls_request_served(gateway.port(),
                                  {ca.cert_pem, make_signed_certificate(other_ca, "client")}));
  EXPECT_FALSE(tls_request_served(gateway.port(), {ca.cert_pem, other_ca}));
  // Refusals cost the gateway nothing: the right client is still served.
  EXPECT_TRUE(tls_request_served(gateway.port(),
                                 {ca.cert_pem, make_signed_certificate(client_ca, "another")}));
}

TEST(TlsListener, AReloadServesRotatedFilesToNewConnectionsAndOldOnesCarryOn) {
  auto upstream = start_mock();
  const auto ca = make_self_signed_certificate("DNS:test-ca", "test ca");
  TlsFiles files(ca, "cert-a");
  const auto yaml = tls_gateway_yaml(upstream->base_url(), tls_yaml("tls", files));
  TestGateway gateway(yaml);
  const TlsClientIdentity identity{ca.cert_pem, {}};
  TlsConnection old_connection(gateway.port(), identity);
  ASSERT_EQ(old_connection.peer_common_name(), "cert-a");
  ASSERT_EQ(old_connection.request("GET", "/health").status, 200u);

  files.replace_with(make_signed_certificate(ca, "cert-b", "DNS:localhost,IP:127.0.0.1"));
  gateway.gateway().apply(config::load_string(yaml));
  {
    TlsConnection fresh(gateway.port(), identity);
    EXPECT_EQ(fresh.peer_common_name(), "cert-b");
    EXPECT_EQ(fresh.request("GET", "/health").status, 200u);
  }
  auto kept = old_connection.request("POST", "/v1/chat/completions", chat_body("chat", true));
  EXPECT_EQ(kept.status, 200u) << kept.body;
  EXPECT_EQ(old_connection.peer_common_name(), "cert-a");

  // A key that no longer matches its certificate is refused, naming the
  // key's YAML path, and the last good pair goes on serving.
  const auto stray = make_signed_certificate(ca, "cert-c", "DNS:localhost");
  std::ofstream(files.key.path()) << stray.key_pem;
  try {
    gateway.gateway().apply(config::load_string(yaml));
    ADD_FAILURE() << "a mismatched key was accepted";
  } catch (const config::ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("server.tls.key"), std::string::npos) << error.what();
  }
  TlsConnection after(gateway.port(), identity);
  EXPECT_EQ(after.peer_common_name(), "cert-b");
  EXPECT_EQ(after.request("GET", "/health").status, 200u);
}

TEST(TlsListener, HalfOpenHandshakesAreCutAtHeaderTimeoutWhileClientsAreServed) {
  raise_descriptor_limit();
  auto upstream = start_mock();
  const auto ca = make_self_signed_certificate("DNS:test-ca", "test ca");
  TlsFiles files(ca, "gateway");
  constexpr auto kHeaderTimeout = 500ms;
  TestGateway gateway(
      tls_gateway_yaml(upstream->base_url(), "  header_timeout: 500ms\n" + tls_yaml("tls", files)));

  // Half send nothing after connecting; half the start of a ClientHello
  // (a record header announcing 512 bytes, then a few of them).
  constexpr int kFlood = 200;
  static const std::string kPartialHello("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11);
  boost::asio::io_context context;
  const boost::asio::ip::tcp::endpoint endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                                gateway.port());
  std::vector<std::unique_ptr<boost::asio::ip::tcp::socket>> sockets;
  const auto opened = std::chrono::steady_clock::now();
  for (int i = 0; i < kFlood; ++i) {
    auto socket = std::make_unique<boost::asio::ip::tcp::socket>(context);
    socket->connect(endpoint);
    if (i % 2 == 1) boost::asio::write(*socket, boost::asio::buffer(kPartialHello));
    sockets.push_back(std::move(socket));
  }
  std::vector<std::optional<std::chrono::steady_clock::duration>> closed_after(kFlood);
  std::vector<std::array<char, 256>> sinks(kFlood);
  for (int i = 0; i < kFlood; ++i) {
    boost::asio::async_read(*sockets[i], boost::asio::buffer(sinks[i]),
                            [&, i](error_code, std::size_t) {
                              closed_after[i] = std::chrono::steady_clock::now() - opened;
                            });
  }
  // A real client is served while the flood holds its connections.
  EXPECT_TRUE(tls_request_served(gateway.port(), {ca.cert_pem, {}}));

  constexpr auto kSlack = 1500ms;
  context.run_for(kHeaderTimeout + kSlack - (std::chrono::steady_clock::now() - opened));
  int cut = 0;
  std::chrono::steady_clock::duration latest{0};
  for (const auto& after : closed_after) {
    if (!after) continue;
    ++cut;
    latest = std::max(latest, *after);
  }
  EXPECT_EQ(cut, kFlood);
  EXPECT_GE(latest, kHeaderTimeout - 50ms);
  EXPECT_LE(latest, kHeaderTimeout + kSlack);
  EXPECT_TRUE(eventually([&] { return gateway.gateway().open_connections().load() == 0; }, 5s));
}

TEST(TlsListener, AdminListenerServesHealthOverTls) {
  auto upstream = start_mock();
  const auto ca = make_self_signed_certificate("DNS:test-ca", "test ca");
  TlsFiles files(ca, "admin");
  TestGateway gateway(tls_gateway_yaml(upstream->base_url(), tls_yaml("admin_tls", files)));
  ASSERT_NE(gateway.gateway().admin_port(), 0);
  TlsConnection admin(gateway.gateway().admin_port(), {ca.cert_pem, {}});
  EXPECT_EQ(admin.peer_common_name(), "admin");
  auto health = admin.request("GET", "/health");
  EXPECT_EQ(health.status, 200u);
  EXPECT_EQ(nlohmann::json::parse(health.body)["status"], "ok");
  EXPECT_EQ(admin.request("GET", "/metrics").status, 200u);
  // The client listener stays plain.
  EXPECT_EQ(http_request(gateway.port(), "GET", "/health").status, 200u);
}

// The admin port the binary logs at start.
std::optional<std::uint16_t> tls_test_admin_port(const ChildProcess& sluice) {
  constexpr std::string_view kAdminPort = "admin on port ";
  std::optional<std::uint16_t> port;
  eventually(
      [&] {
        const auto logs = sluice.standard_error();
        const auto at = logs.find(kAdminPort);
        if (at == std::string::npos) return false;
        port = static_cast<std::uint16_t>(std::stoul(logs.substr(at + kAdminPort.size())));
        return true;
      },
      10s);
  return port;
}

TEST(TlsListener, TheBinaryRotatesOnSighupAndKeepsTheOldPairWhenAReloadBreaksIt) {
  const auto binary = built_binary("SLUICE_BINARY", "src/sluice");
  if (!binary) GTEST_SKIP() << "sluice binary not found; set SLUICE_BINARY";
  auto upstream = start_mock();
  const auto ca = make_self_signed_certificate("DNS:test-ca", "test ca");
  TlsFiles files(ca, "cert-a");
  TempFile config("server:\n  listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0\n  threads: 1\n" +
                      tls_yaml("tls", files) +
                      "log:\n  access_log: off\nauth:\n  disabled: true\n"
                      "models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()),
                  ".yaml");

  // --check-config reads the files too.
  {
    const auto stray = make_signed_certificate(ca, "stray");
    TempFile stray_key(stray.key_pem, ".pem");
    TempFile broken("server:\n  tls:\n    cert: " + files.cert.path() +
                        "\n    key: " + stray_key.path() +
                        "\nauth:\n  disabled: true\nmodels:\n  - name: chat\n    deployments:\n" +
                        deployment_yaml("d1", upstream->base_url()),
                    ".yaml");
    ChildProcess check(*binary, {"--check-config", broken.path()});
    EXPECT_EQ(check.wait_exit(10s), 1);
    EXPECT_NE(check.standard_error().find("server.tls.key: the key in"), std::string::npos)
        << check.standard_error();
  }

  ChildProcess sluice(*binary, {"--config", config.path()});
  auto port = sluice.wait_for_listening_port("sluice listening on https://", 10s);
  ASSERT_TRUE(port) << sluice.standard_error();
  auto admin_port = tls_test_admin_port(sluice);
  ASSERT_TRUE(admin_port) << sluice.standard_error();
  const TlsClientIdentity identity{ca.cert_pem, {}};
  TlsConnection old_connection(*port, identity);
  ASSERT_EQ(old_connection.peer_common_name(), "cert-a");

  files.replace_with(make_signed_certificate(ca, "cert-b", "DNS:localhost,IP:127.0.0.1"));
  sluice.signal(SIGHUP);
  EXPECT_TRUE(eventually(
      [&] {
        try {
          return TlsConnection(*port, identity, 2s).peer_common_name() == "cert-b";
        } catch (const std::exception&) {
          return false;
        }
      },
      5s))
      << sluice.standard_error();
  EXPECT_EQ(old_connection.request("POST", "/v1/chat/completions", chat_body("chat", false)).status,
            200u);

  // A broken key: /admin/reload answers 422 naming it, and cert-b stays.
  std::ofstream(files.key.path()) << "not a key\n";
  auto reload = http_request(*admin_port, "POST", "/admin/reload");
  EXPECT_EQ(reload.status, 422u) << reload.body;
  EXPECT_NE(reload.body.find("server.tls.key"), std::string::npos) << reload.body;
  TlsConnection after(*port, identity);
  EXPECT_EQ(after.peer_common_name(), "cert-b");
  EXPECT_EQ(after.request("GET", "/health").status, 200u);
  sluice.signal(SIGTERM);
  EXPECT_EQ(sluice.wait_exit(10s), 0);
}

}  // namespace
}  // namespace sluice::testing

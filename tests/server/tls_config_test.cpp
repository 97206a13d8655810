// server.tls and server.admin_tls: read, and their files checked at load
// (present, PEM, the key matching the certificate), each error naming its
// YAML path.
#include <gtest/gtest.h>

#include "support/certificates.hpp"
#include "support/config_loading.hpp"
#include "support/gateway_fixture.hpp"

namespace sluice::testing {
namespace {

struct ListenerFiles {
  Certificate pair = make_self_signed_certificate();
  TempFile cert{pair.cert_pem, ".pem"};
  TempFile key{pair.key_pem, ".pem"};
};

std::string server_tls(const std::string& body) { return "server:\n" + body + config::kOneModel; }

TEST(ListenerTlsConfig, IsOffByDefault) {
  auto config = config::load_string(config::kOneModel, config::kNoEnv);
  EXPECT_FALSE(config->server.tls.enabled());
  EXPECT_FALSE(config->server.admin_tls.enabled());
}

TEST(ListenerTlsConfig, ReadsBothListenersFiles) {
  ListenerFiles files;
  const auto ca = make_self_signed_certificate("DNS:ca", "ca");
  TempFile client_ca(ca.cert_pem, ".pem");
  auto config = config::load_string(
      server_tls("  tls:\n    cert: " + files.cert.path() + "\n    key: " + files.key.path() +
                 "\n    client_ca: " + client_ca.path() + "\n  admin_tls:\n    cert: " +
                 files.cert.path() + "\n    key: " + files.key.path() + "\n"),
      config::kNoEnv);
  EXPECT_TRUE(config->server.tls.enabled());
  EXPECT_EQ(config->server.tls.cert, files.cert.path());
  EXPECT_EQ(config->server.tls.key, files.key.path());
  EXPECT_EQ(config->server.tls.client_ca, client_ca.path());
  EXPECT_TRUE(config->server.admin_tls.enabled());
  EXPECT_EQ(config->server.admin_tls.client_ca, "");
}

TEST(ListenerTlsConfig, NamesTheKeyThatIsMissingOrUnreadable) {
  ListenerFiles files;
  config::expect_error(server_tls("  tls:\n    cert: " + files.cert.path() + "\n"),
                       "server.tls.key", 3, "missing required key");
  config::expect_error(
      server_tls("  tls:\n    cert: /nonexistent/cert.pem\n    key: " + files.key.path() + "\n"),
      "server.tls.cert", 3, "does not exist");
  config::expect_error(server_tls("  admin_tls:\n    cert: " + files.cert.path() +
                                  "\n    key: /nonexistent/key.pem\n"),
                       "server.admin_tls.key", 4, "does not exist");
  config::expect_error(server_tls("  tls:\n    cert: " + files.cert.path() + "\n    key: " +
                                  files.key.path() + "\n    client_ca: /nonexistent/ca.pem\n"),
                       "server.tls.client_ca", 5, "does not exist");
  config::expect_error(server_tls("  tls:\n    cert: " + files.cert.path() +
                                  "\n    key: " + files.key.path() + "\n    ciphers: all\n"),
                       "server.tls.ciphers", 5, "unknown key");
}

TEST(ListenerTlsConfig, RefusesFilesThatAreNotWhatTheySay) {
  ListenerFiles files;
  TempFile garbage("not a certificate\n", ".pem");
  config::expect_error(
      server_tls("  tls:\n    cert: " + garbage.path() + "\n    key: " + files.key.path() + "\n"),
      "server.tls.cert", 3, "holds no PEM certificate");
  config::expect_error(
      server_tls("  tls:\n    cert: " + files.cert.path() + "\n    key: " + garbage.path() + "\n"),
      "server.tls.key", 4, "holds no unencrypted PEM private key");
  config::expect_error(server_tls("  tls:\n    cert: " + files.cert.path() + "\n    key: " +
                                  files.key.path() + "\n    client_ca: " + garbage.path() + "\n"),
                       "server.tls.client_ca", 5, "holds no PEM certificate");
}

TEST(ListenerTlsConfig, RefusesAKeyThatDoesNotMatchTheCertificate) {
  ListenerFiles files;
  ListenerFiles other;
  config::expect_error(server_tls("  tls:\n    cert: " + files.cert.path() +
                                  "\n    key: " + other.key.path() + "\n"),
                       "server.tls.key", 4, "does not match the certificate");
}

}  // namespace
}  // namespace sluice::testing

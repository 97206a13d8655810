// Where a deployment connects: the pool key separates what must not share
// connections (scheme, port, trust settings), the Host value drops a
// scheme's default port, and a snapshot holds one Origin per deployment.
#include "sluice/upstream/origin.hpp"

#include <gtest/gtest.h>

#include "sluice/config/config.hpp"

namespace sluice::testing {
namespace {

config::ConfigPtr deployments(const std::string& lines) {
  return config::load_string("auth:\n  disabled: true\nmodels:\n  - name: m\n    deployments:\n" +
                             lines);
}

TEST(Origin, KeyAndHostFollowTheBaseUrlAndTrustSettings) {
  auto config = deployments(
      "      - {id: plain, base_url: 'http://api.example.test/v1'}\n"
      "      - {id: port, base_url: 'http://api.example.test:8080/v1'}\n"
      "      - {id: tls, base_url: 'https://api.example.test/v1'}\n"
      "      - {id: tls_port, base_url: 'https://api.example.test:8443/v1', tls_verify: false}\n"
      "      - {id: v6, base_url: 'http://[::1]:9000/v1'}\n");
  const auto& list = config->models.front().deployments;
  ASSERT_EQ(list.size(), 5u);
  auto plain = upstream::Origin::from(list[0]);
  EXPECT_EQ(plain.key(), "http://api.example.test:80");
  EXPECT_EQ(plain.host_header(), "api.example.test");
  EXPECT_EQ(upstream::Origin::from(list[1]).host_header(), "api.example.test:8080");
  auto tls = upstream::Origin::from(list[2]);
  EXPECT_EQ(tls.key(), "https://api.example.test:443");
  EXPECT_EQ(tls.host_header(), "api.example.test");
  auto unverified = upstream::Origin::from(list[3]);
  EXPECT_EQ(unverified.key(), "https://api.example.test:8443#noverify");
  EXPECT_EQ(unverified.host_header(), "api.example.test:8443");
  EXPECT_EQ(upstream::Origin::from(list[4]).host_header(), "[::1]:9000");
}

}  // namespace
}  // namespace sluice::testing

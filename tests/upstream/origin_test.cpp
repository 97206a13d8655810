// Where a deployment connects: the pool key separates what must not share
// connections (scheme, port, trust settings), the Host value drops a
// scheme's default port, a snapshot holds one Origin per deployment, and an
// address for a host needs no lookup.
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

// A host that is an IP address is connected to without a lookup.
TEST(Origin, AnAddressForAHostIsItsEndpoint) {
  auto config = deployments(
      "      - {id: name, base_url: 'http://api.example.test:8080/v1'}\n"
      "      - {id: v4, base_url: 'https://127.0.0.1:8443/v1'}\n"
      "      - {id: v6, base_url: 'http://[::1]/v1'}\n");
  const auto& list = config->models.front().deployments;
  ASSERT_EQ(list.size(), 3u);
  EXPECT_FALSE(upstream::Origin::from(list[0]).address);
  auto v4 = upstream::Origin::from(list[1]).address;
  ASSERT_TRUE(v4);
  EXPECT_EQ(v4->address().to_string(), "127.0.0.1");
  EXPECT_EQ(v4->port(), 8443);
  auto v6 = upstream::Origin::from(list[2]).address;
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->address().to_string(), "::1");
  EXPECT_EQ(v6->port(), 80);
}

}  // namespace
}  // namespace sluice::testing

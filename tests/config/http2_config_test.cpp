// `upstream.http2` and a deployment's `http2`: auto unless set, the
// deployment's own over the upstream section's, and errors that name the
// YAML path.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

namespace sluice::config {
namespace {

using std::chrono::milliseconds;
using testing::HasSubstr;

TEST(Http2Config, AutoByDefault) {
  ConfigPtr config = load_string(kOneModel, kNoEnv);
  EXPECT_EQ(config->upstream.http2, Http2Mode::automatic);
  EXPECT_EQ(config->models[0].deployments[0].http2, Http2Mode::automatic);
  EXPECT_EQ(config->upstream.http2_ping_after, milliseconds(30000));
  EXPECT_EQ(config->upstream.http2_ping_timeout, milliseconds(5000));
}

TEST(Http2Config, DeploymentOverridesTheUpstreamSection) {
  ConfigPtr config = load_string(
      "upstream:\n"
      "  http2: off\n"
      "  http2_ping_after: 10s\n"
      "  http2_ping_timeout: 2s\n"
      "models:\n"
      "  - name: m\n"
      "    deployments:\n"
      "      - base_url: http://127.0.0.1:8000\n"
      "        http2: prior_knowledge\n"
      "      - base_url: http://127.0.0.1:8001\n",
      kNoEnv);
  const auto& deployments = config->models[0].deployments;
  EXPECT_EQ(deployments[0].http2, Http2Mode::prior_knowledge);
  EXPECT_EQ(deployments[1].http2, Http2Mode::off);
  EXPECT_EQ(config->upstream.http2_ping_after, milliseconds(10000));
  EXPECT_EQ(config->upstream.http2_ping_timeout, milliseconds(2000));
}

TEST(Http2Config, UnknownModesNameTheirPath) {
  EXPECT_THAT(load_error("upstream:\n  http2: h3\n" + kOneModel, kNoEnv),
              HasSubstr("upstream.http2: invalid value 'h3' (expected auto, off or "
                        "prior_knowledge)"));
  EXPECT_THAT(load_error("models:\n"
                         "  - name: m\n"
                         "    deployments:\n"
                         "      - base_url: http://127.0.0.1:8000\n"
                         "        http2: yes please\n",
                         kNoEnv),
              HasSubstr("models[0].deployments[0].http2: invalid value 'yes please'"));
  EXPECT_THAT(load_error("upstream:\n  http2_ping_timeout: 0s\n" + kOneModel, kNoEnv),
              HasSubstr("upstream.http2_ping_timeout"));
}

}  // namespace
}  // namespace sluice::config

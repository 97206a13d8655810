// router.adaptive, router.quality and `auto` deadlines.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

namespace sluice::config {
namespace {

using std::chrono::milliseconds;

const std::string kAutoDeployment =
    "models:\n"
    "  - name: m\n"
    "    deployments:\n"
    "      - base_url: http://127.0.0.1:8000\n"
    "        timeouts: {ttft: auto, idle: auto, connect: 1s}\n";

TEST(AdaptiveConfig, DefaultsWhenAbsent) {
  ConfigPtr config = load_string(kOneModel, kNoEnv);
  const auto& timeouts = config->models[0].deployments[0].timeouts;
  EXPECT_FALSE(timeouts.ttft_auto);
  EXPECT_FALSE(timeouts.idle_auto);
  EXPECT_FALSE(timeouts.adaptive());
  EXPECT_EQ(config->router.adaptive.ttft.multiplier, 2.0);
  EXPECT_EQ(config->router.adaptive.ttft.floor, milliseconds(500));
  EXPECT_EQ(config->router.adaptive.ttft.ceiling, milliseconds(60000));
  EXPECT_EQ(config->router.adaptive.idle.multiplier, 3.0);
  EXPECT_EQ(config->router.adaptive.idle.floor, milliseconds(1000));
  EXPECT_EQ(config->router.adaptive.idle.ceiling, milliseconds(120000));
  EXPECT_EQ(config->router.adaptive.min_samples, 20u);
  EXPECT_FALSE(config->router.quality.enabled);
}

TEST(AdaptiveConfig, AutoKeepsTheStaticDefaultsForTheStart) {
  ConfigPtr config = load_string(kAutoDeployment, kNoEnv);
  const auto& timeouts = config->models[0].deployments[0].timeouts;
  EXPECT_TRUE(timeouts.ttft_auto);
  EXPECT_TRUE(timeouts.idle_auto);
  EXPECT_EQ(timeouts.ttft, milliseconds(10000));
  EXPECT_EQ(timeouts.idle, milliseconds(30000));
  EXPECT_EQ(timeouts.connect, milliseconds(1000));
}

TEST(AdaptiveConfig, ReadsTheRouterSection) {
  ConfigPtr config = load_string(
      "router:\n"
      "  window: 50\n"
      "  adaptive:\n"
      "    ttft: {multiplier: 1.5, floor: 200ms, ceiling: 30s}\n"
      "    idle: {multiplier: 4, floor: 2s, ceiling: 90s}\n"
      "    min_samples: 30\n"
      "  quality: {min_tokens_per_second: 3.5}\n" +
          kAutoDeployment,
      kNoEnv);
  const auto& adaptive = config->router.adaptive;
  EXPECT_EQ(adaptive.ttft.multiplier, 1.5);
  EXPECT_EQ(adaptive.ttft.floor, milliseconds(200));
  EXPECT_EQ(adaptive.ttft.ceiling, milliseconds(30000));
  EXPECT_EQ(adaptive.idle.multiplier, 4.0);
  EXPECT_EQ(adaptive.idle.floor, milliseconds(2000));
  EXPECT_EQ(adaptive.idle.ceiling, milliseconds(90000));
  EXPECT_EQ(adaptive.min_samples, 30u);
  EXPECT_TRUE(config->router.quality.enabled);
  EXPECT_EQ(config->router.quality.min_tokens_per_second, 3.5);

  ConfigPtr off = load_string("router:\n  quality: {enabled: false}\n" + kOneModel, kNoEnv);
  EXPECT_FALSE(off->router.quality.enabled);
}

TEST(AdaptiveConfig, DiagnosisWindowsAreOffUnlessAskedFor) {
  EXPECT_FALSE(load_string(kOneModel, kNoEnv)->router.diagnosis);
  EXPECT_TRUE(load_string("router: {diagnosis: true}\n" + kOneModel, kNoEnv)->router.diagnosis);
  EXPECT_THROW(load_string("router: {diagnosis: sometimes}\n" + kOneModel, kNoEnv), ConfigError);
}

TEST(AdaptiveConfig, ErrorsNameTheirPath) {
  expect_error(
      "models:\n  - name: m\n    deployments:\n      - base_url: http://127.0.0.1:8000\n"
      "        timeouts: {ttft: automatic}\n",
      "models[0].deployments[0].timeouts.ttft", 5, "invalid duration 'automatic'");
  expect_error("router:\n  adaptive:\n    ttft: {multiplier: 0.5}\n" + kOneModel,
               "router.adaptive.ttft.multiplier", 3, "at least 1");
  expect_error("router:\n  adaptive:\n    idle: {floor: 5s, ceiling: 2s}\n" + kOneModel,
               "router.adaptive.idle.ceiling", 3, "must not be smaller than floor");
  expect_error("router:\n  adaptive:\n    min_samples: 50\n" + kOneModel,
               "router.adaptive.min_samples", 3, "router.window (20)");
  expect_error("router:\n  adaptive:\n    concurrenc: {}\n" + kOneModel,
               "router.adaptive.concurrenc", 3, "unknown key");
}

}  // namespace
}  // namespace sluice::config

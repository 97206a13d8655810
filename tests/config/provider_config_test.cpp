// A deployment's provider-specific keys: Azure OpenAI's api_version, which
// `provider: azure` needs and no other provider takes.
#include <gtest/gtest.h>

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

namespace sluice::config {
namespace {

const std::string kAzureDeployment =
    "models:\n"
    "  - name: chat\n"
    "    deployments:\n"
    "      - base_url: https://example.openai.azure.com\n"
    "        model: gpt-4o-prod\n"
    "        provider: azure\n";

TEST(ProviderConfig, AzureTakesItsApiVersion) {
  auto config = load_string(kAzureDeployment + "        api_version: 2024-10-21\n", kNoEnv);
  const auto& deployment = config->models[0].deployments[0];
  EXPECT_EQ(deployment.provider, "azure");
  EXPECT_EQ(deployment.api_version, "2024-10-21");
  EXPECT_EQ(deployment.upstream_model, "gpt-4o-prod");
}

TEST(ProviderConfig, APreviewApiVersionIsAccepted) {
  auto config = load_string(kAzureDeployment + "        api_version: 2025-01-01-preview\n", kNoEnv);
  EXPECT_EQ(config->models[0].deployments[0].api_version, "2025-01-01-preview");
}

TEST(ProviderConfig, OtherProvidersHaveNoApiVersion) {
  auto config = load_string(kOneModel, kNoEnv);
  EXPECT_EQ(config->models[0].deployments[0].api_version, "");
}

TEST(ProviderConfig, AzureWithoutApiVersionNamesTheMissingKey) {
  expect_error(kAzureDeployment, "models[0].deployments[0].api_version", 4,
               "missing required key (provider: azure needs");
}

TEST(ProviderConfig, ApiVersionIsRefusedOnOtherProviders) {
  expect_error(kOneModel + "        api_version: 2024-10-21\n",
               "models[0].deployments[0].api_version", 5,
               "only for provider: azure (this deployment's provider is 'openai')");
  expect_error(kOneModel + "        provider: openai\n        api_version: 2024-10-21\n",
               "models[0].deployments[0].api_version", 6, "only for provider: azure");
}

TEST(ProviderConfig, AnApiVersionThatWouldBreakTheRequestLineIsRefused) {
  expect_error(kAzureDeployment + "        api_version: \"2024-10-21&x=1\"\n",
               "models[0].deployments[0].api_version", 7, "invalid API version '2024-10-21&x=1'");
  expect_error(kAzureDeployment + "        api_version: \"2024 10\"\n",
               "models[0].deployments[0].api_version", 7, "invalid API version");
  expect_error(kAzureDeployment + "        api_version: \"\"\n",
               "models[0].deployments[0].api_version", 7, "must not be empty");
}

}  // namespace
}  // namespace sluice::config

// The config files shipped in the repository must keep loading as the schema
// evolves.

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

namespace sluice::config {
namespace {

using std::chrono::milliseconds;

TEST(ShippedConfigs, DemoLoadsWithoutAnyEnvironment) {
  ConfigPtr config = load_file((repository_root() / "config" / "demo.yaml").string(), fake_env({}));
  EXPECT_EQ(config->server.listen_host, "127.0.0.1");
  EXPECT_EQ(config->server.listen_port, 8080);
  EXPECT_EQ(config->server.threads, 2u);

  const Model* chat = config->find_model("demo-chat");
  ASSERT_NE(chat, nullptr);
  ASSERT_EQ(chat->deployments.size(), 2u);
  EXPECT_EQ(chat->deployments[0].id, "mock-a");
  EXPECT_EQ(chat->deployments[1].id, "mock-b");
  for (const Deployment& deployment : chat->deployments) {
    EXPECT_EQ(deployment.base_url.scheme, "http");
    EXPECT_EQ(deployment.base_url.host, "127.0.0.1");
    EXPECT_EQ(deployment.base_url.port, 8000);
    EXPECT_EQ(deployment.base_url.path_prefix, "/v1");
    EXPECT_EQ(deployment.upstream_model, "mock-model");
  }

  const Model* embed = config->find_model("demo-embed");
  ASSERT_NE(embed, nullptr);
  ASSERT_EQ(embed->deployments.size(), 1u);
  EXPECT_EQ(embed->deployments[0].base_url.port, 8000);
  EXPECT_EQ(embed->deployments[0].base_url.path_prefix, "/v1");
}

TEST(ShippedConfigs, ExampleLoadsWithItsVariablesSet) {
  auto example = repository_root() / "config" / "example.yaml";
  ConfigPtr config = load_file(example.string(), fake_env({{"OPENAI_API_KEY", "sk-test"},
                                                           {"OPENAI_ORG_ID", "org-test"},
                                                           {"AZURE_OPENAI_API_KEY", "az-test"},
                                                           {"SLUICE_CA_FILE", example.string()}}));
  EXPECT_GE(config->models.size(), 2u);
  EXPECT_GE(config->server.threads, 1u);

  bool saw_openai_key = false;
  bool saw_azure_key = false;
  bool saw_azure_provider = false;
  for (const Model& model : config->models) {
    for (const Deployment& deployment : model.deployments) {
      saw_openai_key |= deployment.api_key == "sk-test";
      saw_azure_key |= deployment.api_key == "az-test";
      saw_azure_provider |= deployment.provider == "azure" && !deployment.api_version.empty();
      EXPECT_TRUE(deployment.base_url.tls()) << deployment.id;
    }
  }
  EXPECT_TRUE(saw_openai_key);
  EXPECT_TRUE(saw_azure_key);
  EXPECT_TRUE(saw_azure_provider);
}

TEST(ShippedConfigs, ExampleNamesTheMissingVariable) {
  auto example = repository_root() / "config" / "example.yaml";
  try {
    load_file(example.string(), fake_env({}));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find(" is not set"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace sluice::config

#include <gtest/gtest.h>

#include <algorithm>

#include "sluice/config/config.hpp"
#include "sluice/protocol/adapters.hpp"

namespace sluice::protocol {
namespace {

config::Deployment deployment_with_provider(std::string provider) {
  config::Deployment deployment;
  deployment.id = "d";
  deployment.provider = std::move(provider);
  deployment.provider_at = "models[0].deployments[0].provider (line 7)";
  return deployment;
}

TEST(Adapters, OpenAiIsTheDefaultAndPassesEverythingThrough) {
  const config::Deployment deployment;
  EXPECT_EQ(deployment.provider, "openai");
  auto adapter = make_adapter(deployment);
  ASSERT_TRUE(adapter);
  EXPECT_TRUE(adapter->passes_through(Dialect::openai));
  EXPECT_EQ(adapter->translate_answer(Dialect::openai), nullptr);

  const std::string body = R"({"model":"m"})";
  upstream::Request request;
  request.body = {body};
  std::string storage;
  EXPECT_FALSE(adapter->adapt_request(request, storage));
  EXPECT_EQ(request.body[0].data(), body.data()) << "the request is not touched";
  EXPECT_TRUE(storage.empty());
}

TEST(Adapters, AnUnknownProviderNamesItsPlaceAndTheKnownOnes) {
  try {
    make_adapter(deployment_with_provider("anthropx"));
    FAIL() << "an adapter was made";
  } catch (const config::ConfigError& error) {
    EXPECT_STREQ(error.what(),
                 "models[0].deployments[0].provider: unknown provider 'anthropx' (known: "
                 "anthropic, azure, openai) (line 7)");
  }
}

TEST(Adapters, CheckingAConfigFindsTheUnknownProviderWithoutMakingAnything) {
  auto config = config::load_string(R"(
auth: {disabled: true}
models:
  - name: chat
    deployments:
      - {id: a, base_url: "http://127.0.0.1:1"}
      - {id: b, base_url: "http://127.0.0.1:1", provider: nope}
)");
  EXPECT_EQ(config->models[0].deployments[0].provider, "openai");
  try {
    check_providers(*config);
    FAIL() << "the config passed";
  } catch (const config::ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("models[0].deployments[1].provider"),
              std::string::npos)
        << error.what();
  }
}

std::unique_ptr<Adapter> make_test_adapter(const config::Deployment& /*deployment*/) {
  return make_adapter(deployment_with_provider("openai"));
}

TEST(Adapters, ARegisteredAdapterIsFoundByItsName) {
  register_adapter("registered-in-a-test", &make_test_adapter);
  auto names = provider_names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "registered-in-a-test"), names.end());
  EXPECT_TRUE(make_adapter(deployment_with_provider("registered-in-a-test")));
}

}  // namespace
}  // namespace sluice::protocol

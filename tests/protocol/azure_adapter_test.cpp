// Azure OpenAI's adapter: where a request goes and the header lines it
// carries, with nothing of the body or the answer changed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "sluice/config/config.hpp"
#include "sluice/protocol/adapters.hpp"
#include "sluice/protocol/azure_adapter.hpp"

namespace sluice::protocol {
namespace {

config::Deployment azure_deployment(std::string model = "gpt-4o-prod") {
  config::Deployment deployment;
  deployment.id = "azure-east";
  deployment.provider = "azure";
  deployment.base_url = {"https", "example.openai.azure.com", 443, ""};
  deployment.api_key = "azure-secret-key";
  deployment.upstream_model = std::move(model);
  deployment.api_version = "2024-10-21";
  return deployment;
}

// The request the attempts would hand the adapter: the deployment's path
// prefix, the endpoint, the client's query; the client's and the gateway's
// lines, and the ones the gateway built for OpenAI.
struct SentRequest {
  std::string body = R"({"model":"gpt-4o-prod","messages":[]})";
  upstream::Request request;
  std::string storage;

  SentRequest(const config::Deployment& deployment, std::string_view endpoint,
              std::string_view query = "") {
    request.target = {deployment.base_url.path_prefix, endpoint, query};
    request.fields = {"User-Agent: test\r\n", "X-Request-Id: r1\r\n",
                      "Authorization: Bearer azure-secret-key\r\n"};
    request.body = {body};
  }
  std::string target() const {
    std::string joined;
    for (auto piece : request.target) joined.append(piece);
    return joined;
  }
  std::string fields() const {
    std::string joined;
    for (auto piece : request.fields) joined.append(piece);
    return joined;
  }
};

TEST(AzureAdapter, IsTheAzureProvidersAdapter) {
  auto adapter = make_adapter(azure_deployment());
  ASSERT_TRUE(adapter);
  EXPECT_FALSE(adapter->passes_through(Dialect::openai)) << "its requests are rewritten";
  EXPECT_EQ(adapter->translate_answer(Dialect::openai), nullptr)
      << "its answers are spliced through";
}

TEST(AzureAdapter, SendsTheRequestToTheDeploymentWithTheApiVersion) {
  const auto deployment = azure_deployment();
  auto adapter = make_azure_adapter(deployment);
  SentRequest chat(deployment, "/chat/completions");
  EXPECT_FALSE(adapter->adapt_request(chat.request, chat.storage));
  EXPECT_EQ(chat.target(),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21");
  EXPECT_TRUE(chat.storage.empty()) << "a request without a query needs no copy";

  SentRequest embeddings(deployment, "/embeddings");
  EXPECT_FALSE(adapter->adapt_request(embeddings.request, embeddings.storage));
  EXPECT_EQ(embeddings.target(),
            "/openai/deployments/gpt-4o-prod/embeddings?api-version=2024-10-21");
}

TEST(AzureAdapter, KeepsTheBaseUrlsPath) {
  auto deployment = azure_deployment();
  deployment.base_url.path_prefix = "/eastus";
  auto adapter = make_azure_adapter(deployment);
  SentRequest chat(deployment, "/chat/completions");
  EXPECT_FALSE(adapter->adapt_request(chat.request, chat.storage));
  EXPECT_EQ(chat.target(),
            "/eastus/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21");
}

TEST(AzureAdapter, AppendsTheClientsQueryAfterTheApiVersion) {
  const auto deployment = azure_deployment();
  auto adapter = make_azure_adapter(deployment);
  SentRequest chat(deployment, "/chat/completions", "?trace=1&x=y");
  EXPECT_FALSE(adapter->adapt_request(chat.request, chat.storage));
  EXPECT_EQ(chat.target(),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21&trace=1&x=y");

  SentRequest bare_question_mark(deployment, "/chat/completions", "?");
  EXPECT_FALSE(adapter->adapt_request(bare_question_mark.request, bare_question_mark.storage));
  EXPECT_EQ(bare_question_mark.target(),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21");
}

TEST(AzureAdapter, EscapesTheDeploymentName) {
  const auto deployment = azure_deployment("my deploy/v2?x=1%");
  auto adapter = make_azure_adapter(deployment);
  SentRequest chat(deployment, "/chat/completions");
  EXPECT_FALSE(adapter->adapt_request(chat.request, chat.storage));
  EXPECT_EQ(chat.target(),
            "/openai/deployments/my%20deploy%2Fv2%3Fx%3D1%25/chat/completions"
            "?api-version=2024-10-21");

  const auto plain = azure_deployment("gpt-4.1_mini~eu");
  auto plain_adapter = make_azure_adapter(plain);
  SentRequest unchanged(plain, "/chat/completions");
  EXPECT_FALSE(plain_adapter->adapt_request(unchanged.request, unchanged.storage));
  EXPECT_EQ(unchanged.target(),
            "/openai/deployments/gpt-4.1_mini~eu/chat/completions?api-version=2024-10-21");
}

TEST(AzureAdapter, SendsTheKeyAsApiKeyAndNeverAsAuthorization) {
  auto deployment = azure_deployment();
  deployment.headers = {{"X-Team", "search"}};
  auto adapter = make_azure_adapter(deployment);
  SentRequest chat(deployment, "/chat/completions");
  EXPECT_FALSE(adapter->adapt_request(chat.request, chat.storage));
  EXPECT_EQ(chat.request.fields[2], "X-Team: search\r\napi-key: azure-secret-key\r\n");
  EXPECT_EQ(chat.fields().find("Authorization"), std::string::npos) << chat.fields();
  EXPECT_EQ(chat.request.fields[0], "User-Agent: test\r\n") << "the client's lines stay";
  EXPECT_EQ(chat.request.fields[1], "X-Request-Id: r1\r\n") << "the gateway's lines stay";
}

TEST(AzureAdapter, AConfiguredApiKeyHeaderOrNoKeySendsNoKeyOfItsOwn) {
  auto configured = azure_deployment();
  configured.headers = {{"Api-Key", "from-a-vault"}};
  // The request points into the adapter, which the snapshot keeps as long.
  auto configured_adapter = make_azure_adapter(configured);
  SentRequest chat(configured, "/chat/completions");
  EXPECT_FALSE(configured_adapter->adapt_request(chat.request, chat.storage));
  EXPECT_EQ(chat.request.fields[2], "Api-Key: from-a-vault\r\n");

  auto keyless = azure_deployment();
  keyless.api_key.clear();
  auto keyless_adapter = make_azure_adapter(keyless);
  SentRequest anonymous(keyless, "/chat/completions");
  EXPECT_FALSE(keyless_adapter->adapt_request(anonymous.request, anonymous.storage));
  EXPECT_EQ(anonymous.request.fields[2], "");
}

TEST(AzureAdapter, LeavesTheBodyAsItIs) {
  const auto deployment = azure_deployment();
  auto adapter = make_azure_adapter(deployment);
  SentRequest chat(deployment, "/chat/completions");
  EXPECT_FALSE(adapter->adapt_request(chat.request, chat.storage));
  EXPECT_EQ(chat.request.body[0].data(), chat.body.data());
  EXPECT_EQ(chat.request.body[0].size(), chat.body.size());
}

// A Messages client's request is translated to chat completions, and the
// client's query still follows the API version, in the same storage as the
// translated body.
TEST(AzureAdapter, TranslatesAMessagesClientsRequestAndKeepsItsQuery) {
  const auto deployment = azure_deployment();
  auto adapter = make_azure_adapter(deployment);
  EXPECT_NE(adapter->translate_answer(Dialect::anthropic), nullptr);
  SentRequest messages(deployment, "/messages", "?trace=on");
  messages.body =
      R"({"model":"gpt-4o-prod","max_tokens":5,"messages":[{"role":"user","content":"hi"}]})";
  messages.request.body = {messages.body};
  ASSERT_FALSE(adapter->adapt_request(messages.request, messages.storage));
  EXPECT_EQ(messages.target(),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21&trace=on");
  std::string body;
  for (auto piece : messages.request.body) body.append(piece);
  const auto translated = nlohmann::json::parse(body);
  EXPECT_EQ(translated["max_tokens"], 5);
  EXPECT_EQ(translated["messages"][0]["role"], "user");

  SentRequest count(deployment, "/messages/count_tokens");
  const auto refused = adapter->adapt_request(count.request, count.storage);
  ASSERT_TRUE(refused);
  EXPECT_NE(refused->message.find("azure"), std::string::npos) << refused->message;
}

}  // namespace
}  // namespace sluice::protocol

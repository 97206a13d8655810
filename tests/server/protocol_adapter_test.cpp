// The protocol seam, end to end: a deployment whose adapter rewrites the
// request and translates the answer, registered the way any adapter is.

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "sluice/protocol/adapters.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using nlohmann::json;
using namespace std::string_view_literals;

std::string upper(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return text;
}

// Turns every text the upstream writes to upper case, and marks what it
// sends; refuses embeddings, which its upstream would not understand.
class ShoutingTranslator final : public stream::AnswerTranslator {
 public:
  void event(std::string_view upstream_event, std::string& out) override {
    ++events_seen;
    constexpr auto kData = "data: "sv;
    if (!upstream_event.starts_with(kData)) return;
    const auto payload = upstream_event.substr(kData.size());
    if (payload == "[DONE]") return;  // sent by end_of_events
    auto chunk = json::parse(payload, nullptr, false);
    if (chunk.is_discarded()) return;
    for (auto& choice : chunk["choices"]) {
      if (choice.contains("delta") && choice["delta"].contains("content")) {
        choice["delta"]["content"] = upper(choice["delta"]["content"].get<std::string>());
      }
    }
    out.append(kData).append(chunk.dump()).append("\n\n");
  }
  void end_of_events(std::string& out) override { out.append("data: [DONE]\n\n"); }
  void body(std::string_view upstream_body, std::string& out) override {
    auto answer = json::parse(upstream_body, nullptr, false);
    if (!answer.is_discarded() && answer.contains("choices")) {
      for (auto& choice : answer["choices"]) {
        auto& content = choice["message"]["content"];
        if (content.is_string()) content = upper(content.get<std::string>());
      }
      out = answer.dump();
      return;
    }
    out.assign(upstream_body);
  }
  unsigned events_seen = 0;
};

class ShoutingAdapter final : public protocol::Adapter {
 public:
  bool passes_through(protocol::Dialect /*client*/) const override { return false; }
  std::optional<ApiError> adapt_request(upstream::Request& request,
                                        std::string& storage) const override {
    if (request.target[1] == "/embeddings") {
      return ApiError::invalid_request("This provider has no embeddings.", "model",
                                       "unsupported_endpoint");
    }
    std::string body;
    for (auto piece : request.body) body.append(piece);
    auto parsed = json::parse(body);
    parsed["adapted"] = true;
    storage = parsed.dump();
    request.body = {storage};
    request.fields[2] = "x-adapted: yes\r\n";  // instead of the deployment's own lines
    return std::nullopt;
  }
  std::unique_ptr<stream::AnswerTranslator> translate_answer(
      protocol::Dialect /*client*/) const override {
    return std::make_unique<ShoutingTranslator>();
  }
};

std::unique_ptr<protocol::Adapter> make_shouting_adapter(const config::Deployment&) {
  return std::make_unique<ShoutingAdapter>();
}

// Rewrites the request's header lines only: its upstream answers as the
// client's endpoint does.
class HeaderOnlyAdapter final : public protocol::Adapter {
 public:
  bool passes_through(protocol::Dialect /*client*/) const override { return false; }
  std::optional<ApiError> adapt_request(upstream::Request& request,
                                        std::string& /*storage*/) const override {
    request.fields[2] = "x-adapted: header-only\r\n";
    return std::nullopt;
  }
  std::unique_ptr<stream::AnswerTranslator> translate_answer(
      protocol::Dialect /*client*/) const override {
    return nullptr;
  }
};

std::unique_ptr<protocol::Adapter> make_header_only_adapter(const config::Deployment&) {
  return std::make_unique<HeaderOnlyAdapter>();
}

class ProtocolAdapter : public ::testing::Test {
 protected:
  void SetUp() override {
    protocol::register_adapter("test-shouting", &make_shouting_adapter);
    mock::Behaviour behaviour;
    behaviour.tokens = 3;
    upstream_ = start_mock(behaviour);
  }
  std::string yaml() const {
    return "models:\n  - name: chat\n    deployments:\n" +
           deployment_yaml("loud", upstream_->base_url(), "        provider: test-shouting\n");
  }
  std::unique_ptr<mock::MockServer> upstream_;
};

TEST_F(ProtocolAdapter, TheUpstreamGetsTheAdaptedRequest) {
  TestGateway gateway(yaml());
  auto answer =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(answer.status, 200u) << answer.body;
  auto sent = upstream_->recent_requests().back();
  EXPECT_EQ(sent.target, "/v1/chat/completions");
  auto body = json::parse(sent.body);
  EXPECT_EQ(body["adapted"], true);
  EXPECT_EQ(body["model"], "mock-model") << "the upstream's model name was spliced in first";
  EXPECT_EQ(sent.header("x-adapted"), "yes");
}

TEST_F(ProtocolAdapter, AJsonAnswerIsTranslatedWhole) {
  TestGateway gateway(yaml());
  auto answer =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  ASSERT_EQ(answer.status, 200u) << answer.body;
  auto body = json::parse(answer.body);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "TOK0 TOK1 TOK2 ");
  EXPECT_EQ(answer.header("content-length"), std::to_string(answer.body.size()));
  EXPECT_EQ(answer.header("x-sluice-deployment"), "loud");
}

TEST_F(ProtocolAdapter, AStreamIsTranslatedEventByEvent) {
  TestGateway gateway(yaml());
  auto answer =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(answer.status, 200u) << answer.body;
  EXPECT_EQ(answer.header("content-type").rfind("text/event-stream", 0), 0u);
  std::string text;
  unsigned done = 0;
  std::size_t start = 0;
  for (auto end = answer.body.find("\n\n"); end != std::string::npos;
       start = end + 2, end = answer.body.find("\n\n", start)) {
    auto event = std::string_view(answer.body).substr(start, end - start);
    ASSERT_TRUE(event.starts_with("data: ")) << event;
    auto payload = event.substr(6);
    if (payload == "[DONE]") {
      ++done;
      continue;
    }
    auto chunk = json::parse(payload);
    if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content")) {
      text += chunk["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(text, "TOK0 TOK1 TOK2 ");
  EXPECT_EQ(done, 1u) << "one end, sent by the translator: " << answer.body;
  EXPECT_EQ(start, answer.body.size()) << "nothing after the last event";
}

TEST_F(ProtocolAdapter, AnAdapterWithoutATranslatorLeavesTheAnswerAsItCame) {
  protocol::register_adapter("test-header-only", &make_header_only_adapter);
  TestGateway gateway(
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("quiet", upstream_->base_url(), "        provider: test-header-only\n"));
  auto streamed =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(streamed.status, 200u);
  EXPECT_EQ(upstream_->recent_requests().back().header("x-adapted"), "header-only");
  EXPECT_NE(streamed.body.find(R"("content":"tok0 ")"), std::string::npos) << streamed.body;
  EXPECT_NE(streamed.body.find("data: [DONE]"), std::string::npos);
}

TEST_F(ProtocolAdapter, ARequestTheProviderCannotCarryIsRefusedWithoutBlamingIt) {
  TestGateway gateway(
      "router:\n  cooldown: {fails: 1, within: 60s, for: 60s}\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("loud", upstream_->base_url(), "        provider: test-shouting\n"));
  auto refused =
      http_request(gateway.port(), "POST", "/v1/embeddings", R"({"model":"chat","input":"hello"})");
  EXPECT_EQ(refused.status, 400u) << refused.body;
  EXPECT_EQ(json::parse(refused.body)["error"]["code"], "unsupported_endpoint");
  EXPECT_EQ(upstream_->stats().requests, 0u);
  auto next =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(next.status, 200u) << "the deployment is not cooling down: " << next.body;
}

TEST_F(ProtocolAdapter, AStreamThatBreaksAfterItsFirstEventEndsInAnErrorEvent) {
  TestGateway gateway(yaml());
  auto answer = http_request(gateway.port(), "POST", "/v1/chat/completions",
                             chat_body("chat", true), {{"x-mock-fail", "reset-mid"}});
  ASSERT_EQ(answer.status, 200u);
  EXPECT_NE(answer.body.find(R"("code":"stream_interrupted")"), std::string::npos) << answer.body;
  EXPECT_EQ(answer.body.find("[DONE]"), std::string::npos) << "never a fake clean end";
}

TEST_F(ProtocolAdapter, AnUnknownProviderIsAConfigErrorNamingItsPlace) {
  try {
    TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                        deployment_yaml("x", upstream_->base_url(), "        provider: nope\n"));
    FAIL() << "the gateway started";
  } catch (const config::ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("models[0].deployments[0].provider: unknown provider 'nope'"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("openai"), std::string::npos) << message;
    EXPECT_NE(message.find("(line "), std::string::npos) << message;
  }
}

// --check-config builds no gateway, yet knows which providers exist.
TEST(ProtocolAdapterConfig, CheckConfigRefusesAnUnknownProvider) {
  const char* binary = std::getenv("SLUICE_BINARY");
  ASSERT_NE(binary, nullptr) << "SLUICE_BINARY is not set";
  auto check = [&](const std::string& provider, std::string& output) {
    TempFile config(
        "auth: {disabled: true}\nmodels:\n  - name: m\n    deployments:\n"
        "      - base_url: http://127.0.0.1:9/v1\n        provider: " +
            provider + "\n",
        ".yaml");
    const std::string command = std::string(binary) + " --check-config " + config.path() + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    if (!pipe) return -1;
    char buffer[512];
    while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
    return WEXITSTATUS(pclose(pipe));
  };
  std::string refused;
  EXPECT_EQ(check("nope", refused), 1) << refused;
  EXPECT_NE(refused.find("models[0].deployments[0].provider: unknown provider 'nope'"),
            std::string::npos)
      << refused;
  std::string accepted;
  EXPECT_EQ(check("openai", accepted), 0) << accepted;
}

}  // namespace
}  // namespace sluice::testing

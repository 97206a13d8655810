// The phases before the upstream, as plain functions: no socket, no gateway.

#include <gtest/gtest.h>

#include <string>

#include "sluice/config/config.hpp"
#include "sluice/server/authorize.hpp"
#include "sluice/server/forwarded_request.hpp"
#include "sluice/server/resolve.hpp"

namespace sluice::server::phases_test {
namespace {

namespace http = boost::beast::http;

Result<Route, Refusal> route(http::verb method, std::string_view target) {
  Route route;
  if (auto refusal = route_request({method, to_string(method), target}, route)) return *refusal;
  return route;
}

TEST(ResolvePhase, HealthAnswersGetAndHeadOnly) {
  auto health = route(http::verb::get, "/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health.value().kind, Route::Kind::health);
  EXPECT_TRUE(route(http::verb::head, "/health"));
  auto post = route(http::verb::post, "/health");
  ASSERT_FALSE(post);
  EXPECT_EQ(post.error().error.status, 405u);
  EXPECT_EQ(post.error().fields, "Allow: GET, HEAD\r\n");
}

TEST(ResolvePhase, ModelPathsListOrDescribeOneModel) {
  auto list = route(http::verb::get, "/v1/models");
  ASSERT_TRUE(list);
  EXPECT_EQ(list.value().kind, Route::Kind::model_list);
  auto one = route(http::verb::get, "/v1/models/team%2Fgpt");
  ASSERT_TRUE(one);
  EXPECT_EQ(one.value().kind, Route::Kind::one_model);
  EXPECT_EQ(one.value().model_id, "team/gpt");
  auto malformed = route(http::verb::get, "/v1/models/%zz");
  ASSERT_FALSE(malformed);
  EXPECT_EQ(malformed.error().error.code, "unknown_url");
  auto deleted = route(http::verb::delete_, "/v1/models/gpt");
  ASSERT_FALSE(deleted);
  EXPECT_EQ(deleted.error().error.status, 405u);
  // Only the exact segment is the models path.
  EXPECT_FALSE(route(http::verb::get, "/v1/modelsx"));
}

TEST(ResolvePhase, ProxiedPathsNameTheirEndpointAndKeepTheQuery) {
  auto chat = route(http::verb::post, "/v1/chat/completions?trace=1");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat.value().kind, Route::Kind::proxied);
  EXPECT_EQ(chat.value().endpoint, "/chat/completions");
  EXPECT_EQ(chat.value().path, "/v1/chat/completions");
  EXPECT_EQ(chat.value().query, "?trace=1");
  auto get = route(http::verb::get, "/v1/chat/completions");
  ASSERT_FALSE(get);
  EXPECT_EQ(get.error().fields, "Allow: POST\r\n");
  auto unknown = route(http::verb::post, "/v2/chat");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().error.status, 404u);
}

const config::ConfigPtr& test_config() {
  static const config::ConfigPtr config = config::load_string(R"(
auth: {disabled: true}
models:
  - name: chat
    default_for: [/v1/chat/completions]
    deployments:
      - {id: c1, base_url: "http://127.0.0.1:1", model: up-chat}
  - name: capped
    shaping: {caps: {max_tokens: 100}}
    deployments:
      - {id: p1, base_url: "http://127.0.0.1:1", model: up-capped}
  - name: routed
    rules:
      - {when: {contains_any: ["weather"]}, model: chat}
)");
  return config;
}

Result<Resolution, ApiError> resolve_json(std::string_view body, std::string& storage) {
  Resolution resolution;
  if (auto error = resolve_body(*test_config(), "/chat/completions", body, "application/json",
                                storage, resolution)) {
    return *error;
  }
  return resolution;
}

ForwardedRequest forward_of(const ForwardingInputs& inputs, ForwardingStorage& storage) {
  ForwardedRequest forwarded;
  forwarded_request(inputs, storage, forwarded);
  return forwarded;
}

TEST(ResolvePhase, ABodyWithoutAModelGoesToTheEndpointsDefault) {
  std::string storage;
  auto resolved = resolve_json(R"({"messages":[]})", storage);
  ASSERT_TRUE(resolved) << resolved.error().message;
  EXPECT_EQ(resolved.value().inspected.model, "chat");
  EXPECT_EQ(resolved.value().requested, test_config()->find_model("chat"));
  EXPECT_EQ(resolved.value().body(), storage);
  EXPECT_NE(storage.find(R"("model":"chat")"), std::string::npos);
  EXPECT_TRUE(resolved.value().goes_upstream());
}

TEST(ResolvePhase, AnUnknownModelIsResolvedButGoesNowhere) {
  std::string storage;
  auto resolved = resolve_json(R"({"model":"nope","messages":[]})", storage);
  ASSERT_TRUE(resolved);
  EXPECT_EQ(resolved.value().requested, nullptr);
  EXPECT_FALSE(resolved.value().goes_upstream());
  EXPECT_EQ(tokens_to_reserve(resolved.value()), 0u) << "nothing will be spent upstream";
}

TEST(ResolvePhase, ABodyThatIsNoJsonObjectIsRefused) {
  std::string storage;
  auto resolved = resolve_json(R"({"model":)", storage);
  ASSERT_FALSE(resolved);
  EXPECT_EQ(resolved.error().status, 400u);
}

TEST(ResolvePhase, ShapingRewritesTheBodyAndTheTokensReservedFollowIt) {
  std::string storage;
  auto asked = resolve_json(R"({"model":"capped","max_tokens":5000,"messages":[]})", storage);
  ASSERT_TRUE(asked);
  const auto& resolution = asked.value();
  ASSERT_TRUE(resolution.shaped);
  EXPECT_EQ(resolution.max_tokens, 100u);
  EXPECT_NE(resolution.body().find(R"("max_tokens":100)"), std::string::npos);
  const auto reserved = tokens_to_reserve(resolution);
  EXPECT_GE(reserved, 100u);
  EXPECT_LT(reserved, 5000u) << "the key is charged for what goes upstream";
}

TEST(ResolvePhase, RulesThatMatchNothingLeaveNoTarget) {
  std::string storage;
  auto plain = resolve_json(R"({"model":"routed","messages":[]})", storage);
  ASSERT_TRUE(plain);
  ASSERT_TRUE(plain.value().shaped);
  EXPECT_EQ(plain.value().shaped->target, nullptr);
  EXPECT_FALSE(plain.value().goes_upstream());
  EXPECT_EQ(tokens_to_reserve(plain.value()), 0u);

  auto matching = resolve_json(
      R"({"model":"routed","messages":[{"role":"user","content":"the weather?"}]})", storage);
  ASSERT_TRUE(matching);
  EXPECT_EQ(matching.value().shaped->target, test_config()->find_model("chat"));
  EXPECT_TRUE(matching.value().goes_upstream());
  EXPECT_GT(tokens_to_reserve(matching.value()), 0u);
}

// The forwarded body, joined as the attempts write it, with `model` for the
// upstream's name.
std::string joined(const ForwardedRequest& forwarded, std::string_view model) {
  std::string body;
  body.append(forwarded.body_prefix).append(model).append(forwarded.body_suffix);
  body.append(forwarded.body_addition).append(forwarded.body_closing);
  return body;
}

TEST(ForwardPhase, OnlyTheModelChangesInAPlainBody) {
  std::string storage;
  const std::string received = R"({"model":"chat","messages":[{"role":"user","content":"hi"}]})";
  auto resolved = resolve_json(received, storage);
  ASSERT_TRUE(resolved);
  ForwardingStorage forwarding;
  auto forwarded = forward_of(
      {resolved.value(), "/chat/completions", "", received, false, true, nullptr}, forwarding);
  EXPECT_EQ(joined(forwarded, R"("up-chat")"),
            R"({"model":"up-chat","messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(forwarded.body_prefix.data(), received.data()) << "the received body, not a copy";
  EXPECT_FALSE(forwarded.strip_usage_only_chunks);
}

TEST(ForwardPhase, AStreamAsksForUsageWhenTheGatewayNeedsItAndTheClientDidNot) {
  std::string storage;
  const std::string received = R"({"model":"chat","stream":true,"messages":[]})";
  auto resolved = resolve_json(received, storage);
  ASSERT_TRUE(resolved);
  ForwardingStorage forwarding;
  auto needed = forward_of(
      {resolved.value(), "/chat/completions", "", received, true, true, nullptr}, forwarding);
  EXPECT_EQ(joined(needed, R"("m")"),
            R"({"model":"m","stream":true,"messages":[],"stream_options":{"include_usage":true}})");
  EXPECT_TRUE(needed.strip_usage_only_chunks);

  auto not_needed = forward_of(
      {resolved.value(), "/chat/completions", "", received, true, false, nullptr}, forwarding);
  EXPECT_TRUE(not_needed.body_addition.empty());
  EXPECT_FALSE(not_needed.strip_usage_only_chunks);

  const std::string asked_already =
      R"({"model":"chat","stream":true,"stream_options":{"include_usage":false},"messages":[]})";
  auto own_options = resolve_json(asked_already, storage);
  ASSERT_TRUE(own_options);
  auto kept =
      forward_of({own_options.value(), "/chat/completions", "", asked_already, true, true, nullptr},
                 forwarding);
  EXPECT_TRUE(kept.body_addition.empty()) << "the client's own stream_options stand";
}

TEST(ForwardPhase, SluicesOwnCacheFieldNeverGoesUpstream) {
  std::string storage;
  const std::string received = R"({"model":"chat","cache":true,"messages":[]})";
  auto resolved = resolve_json(received, storage);
  ASSERT_TRUE(resolved);
  ForwardingStorage forwarding;
  auto forwarded = forward_of(
      {resolved.value(), "/chat/completions", "", received, false, false, nullptr}, forwarding);
  const auto body = joined(forwarded, R"("up")");
  EXPECT_EQ(body.find("cache"), std::string::npos) << body;
  EXPECT_NE(body.find(R"("model":"up")"), std::string::npos) << body;
}

}  // namespace
}  // namespace sluice::server::phases_test

// The admission decision as the pipeline sees it: which error, in what
// order, what it costs the key, and the headers that go with it.

#include "sluice/auth/stage.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace sluice::auth {
namespace {

using namespace std::chrono_literals;
using testing::HasSubstr;
using testing::Not;

const TimePoint kStageStart = TimePoint{} + 1000h;

config::EnvLookup no_env() {
  return [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
}

const std::string kModels =
    "models:\n"
    "  - name: gpt-4o-mini\n"
    "    deployments:\n"
    "      - base_url: http://127.0.0.1:8000\n"
    "  - name: gpt-4o\n"
    "    deployments:\n"
    "      - base_url: http://127.0.0.1:8000\n";

config::ConfigPtr load(const std::string& auth_section) {
  return config::load_string(auth_section + kModels, no_env());
}

// One key per limit, so each test reads on its own.
const std::string kKeys =
    "auth:\n"
    "  keys:\n"
    "    - name: open\n"
    "      key: sk-open-key\n"
    "    - name: mini-only\n"
    "      key: sk-mini-only\n"
    "      models: [\"*-mini\"]\n"
    "    - name: one-at-a-time\n"
    "      key: sk-one-at-a-time\n"
    "      max_parallel: 1\n"
    "    - name: two-per-minute\n"
    "      key: sk-two-per-minute\n"
    "      rpm: 2\n"
    "    - name: thousand-tokens\n"
    "      key: sk-thousand-tokens\n"
    "      rpm: 600\n"
    "      tpm: 1000\n";

AuthRequest request(std::string_view key, std::uint64_t tokens = 100,
                    std::string_view model = "gpt-4o-mini", TimePoint now = kStageStart) {
  return {key, model, tokens, now};
}

unsigned in_flight(const AuthStage& stage, std::string_view name) {
  return stage.limiters().find(name)->parallel.in_flight();
}

TEST(AuthStage, DisabledLetsEverythingThrough) {
  auto config = load("auth:\n  disabled: true\n");
  AuthStage stage(*config, nullptr);
  EXPECT_FALSE(stage.enabled());
  Admission admission = stage.admit(request(""));
  EXPECT_TRUE(admission.allowed());
  EXPECT_EQ(admission.key, nullptr);
  std::string headers;
  admission.append_headers(headers);
  EXPECT_EQ(headers, "");
  stage.complete(admission, 10, kStageStart);
}

TEST(AuthStage, NoAuthSectionMeansDisabled) {
  auto config = load("");
  AuthStage stage(*config, nullptr);
  EXPECT_FALSE(stage.enabled());
  EXPECT_TRUE(stage.admit(request("whatever")).allowed());
}

TEST(AuthStage, MissingKeyIs401) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  EXPECT_TRUE(stage.enabled());
  Admission admission = stage.admit(request(""));
  ASSERT_FALSE(admission.allowed());
  EXPECT_EQ(admission.error->status, 401u);
  EXPECT_EQ(admission.error->type, "invalid_request_error");
  EXPECT_EQ(admission.error->code, "invalid_api_key");
  EXPECT_THAT(admission.error->message, testing::StartsWith("You didn't provide an API key."));
  EXPECT_EQ(admission.key, nullptr);
  EXPECT_FALSE(admission.retry_after);
}

TEST(AuthStage, UnknownKeyIs401WithoutEchoingIt) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  Admission admission = stage.admit(request("sk-guess-1234"));
  ASSERT_FALSE(admission.allowed());
  EXPECT_EQ(admission.error->status, 401u);
  EXPECT_EQ(admission.error->code, "invalid_api_key");
  EXPECT_EQ(admission.error->message, "Incorrect API key provided.");
  EXPECT_THAT(admission.error->to_json(), Not(HasSubstr("sk-guess")));
  EXPECT_EQ(admission.key, nullptr);
}

TEST(AuthStage, ModelOutsideTheKeysListLooksLikeAModelThatDoesNotExist) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  Admission admission = stage.admit(request("sk-mini-only", 100, "gpt-4o"));
  ASSERT_FALSE(admission.allowed());
  ApiError expected = ApiError::model_not_found("gpt-4o");
  EXPECT_EQ(admission.error->status, 404u);
  EXPECT_EQ(admission.error->code, "model_not_found");
  EXPECT_EQ(admission.error->to_json(), expected.to_json());
  ASSERT_NE(admission.key, nullptr);
  EXPECT_EQ(admission.key->name, "mini-only");

  EXPECT_TRUE(stage.admit(request("sk-mini-only", 100, "gpt-4o-mini")).allowed());
  // Endpoints without a model skip the check.
  EXPECT_TRUE(stage.admit(request("sk-mini-only", 0, "")).allowed());
}

TEST(AuthStage, AllowedRequestNamesItsKey) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  Admission admission = stage.admit(request("sk-open-key"));
  ASSERT_TRUE(admission.allowed());
  ASSERT_NE(admission.key, nullptr);
  EXPECT_EQ(admission.key->name, "open");
  EXPECT_FALSE(admission.retry_after);
}

TEST(AuthStage, MaxParallelIs429UntilCompleteReleasesTheSlot) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  Admission first = stage.admit(request("sk-one-at-a-time"));
  ASSERT_TRUE(first.allowed());
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 1u);

  Admission second = stage.admit(request("sk-one-at-a-time"));
  ASSERT_FALSE(second.allowed());
  EXPECT_EQ(second.error->status, 429u);
  EXPECT_EQ(second.error->type, "requests");
  EXPECT_EQ(second.error->code, "rate_limit_exceeded");
  EXPECT_THAT(second.error->message, HasSubstr("max_parallel"));
  EXPECT_THAT(second.error->message, HasSubstr("'one-at-a-time'"));
  EXPECT_EQ(second.retry_after, 1s);
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 1u);

  stage.complete(first, 120, kStageStart + 1s);
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 0u);
  // Exactly once: a second complete() must not free a slot it no longer holds.
  stage.complete(first, 120, kStageStart + 1s);
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 0u);

  Admission third = stage.admit(request("sk-one-at-a-time"));
  EXPECT_TRUE(third.allowed());
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 1u);
}

TEST(AuthStage, RpmIs429AndGivesTheParallelSlotBack) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  Admission first = stage.admit(request("sk-two-per-minute"));
  Admission second = stage.admit(request("sk-two-per-minute"));
  ASSERT_TRUE(first.allowed());
  ASSERT_TRUE(second.allowed());

  Admission third = stage.admit(request("sk-two-per-minute"));
  ASSERT_FALSE(third.allowed());
  EXPECT_EQ(third.error->status, 429u);
  EXPECT_EQ(third.error->type, "requests");
  EXPECT_EQ(third.error->code, "rate_limit_exceeded");
  EXPECT_THAT(third.error->message, HasSubstr("rpm"));
  EXPECT_THAT(third.error->message, HasSubstr("'two-per-minute'"));
  EXPECT_THAT(third.error->message, HasSubstr("try again in 30s"));
  EXPECT_EQ(third.retry_after, 30s);
  EXPECT_EQ(third.headers.requests.limit, 2u);
  EXPECT_EQ(third.headers.requests.remaining, 0u);
  EXPECT_EQ(in_flight(stage, "two-per-minute"), 2u);

  EXPECT_TRUE(
      stage.admit(request("sk-two-per-minute", 100, "gpt-4o-mini", kStageStart + 30s)).allowed());
}

TEST(AuthStage, TpmIs429AndUndoesTheRpmAndParallelTakes) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  Admission big = stage.admit(request("sk-thousand-tokens", 1000));
  ASSERT_TRUE(big.allowed());
  EXPECT_EQ(big.headers.tokens.remaining, 0u);
  KeyLimits* limits = stage.limiters().find("thousand-tokens");
  EXPECT_EQ(limits->requests.remaining(kStageStart), 599u);

  Admission denied = stage.admit(request("sk-thousand-tokens", 10));
  ASSERT_FALSE(denied.allowed());
  EXPECT_EQ(denied.error->status, 429u);
  EXPECT_EQ(denied.error->type, "tokens");
  EXPECT_EQ(denied.error->code, "rate_limit_exceeded");
  EXPECT_THAT(denied.error->message, HasSubstr("tpm"));
  EXPECT_THAT(denied.error->message, HasSubstr("'thousand-tokens'"));
  EXPECT_EQ(denied.retry_after, 1s);
  EXPECT_EQ(limits->requests.remaining(kStageStart), 599u);
  EXPECT_EQ(in_flight(stage, "thousand-tokens"), 1u);
  EXPECT_EQ(denied.headers.requests.remaining, 599u);
  EXPECT_EQ(denied.headers.tokens.remaining, 0u);
}

TEST(AuthStage, CompleteSettlesTokensAgainstTheRealCount) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  KeyLimits* limits = stage.limiters().find("thousand-tokens");

  Admission admission = stage.admit(request("sk-thousand-tokens", 500));
  ASSERT_TRUE(admission.allowed());
  EXPECT_EQ(limits->tokens.remaining(kStageStart), 500u);
  stage.complete(admission, 100, kStageStart);
  EXPECT_EQ(limits->tokens.remaining(kStageStart), 900u);

  Admission unknown_usage = stage.admit(request("sk-thousand-tokens", 300));
  stage.complete(unknown_usage, std::nullopt, kStageStart);
  EXPECT_EQ(limits->tokens.remaining(kStageStart), 600u);
  EXPECT_EQ(in_flight(stage, "thousand-tokens"), 0u);
}

TEST(AuthStage, EstimateIsCappedAtAMinutesBudget) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  KeyLimits* limits = stage.limiters().find("thousand-tokens");
  // A client's max_tokens of a trillion reserves one minute's budget, not a
  // year's debt.
  Admission huge = stage.admit(request("sk-thousand-tokens", 1'000'000'000'000));
  ASSERT_TRUE(huge.allowed());
  EXPECT_EQ(huge.headers.tokens.remaining, 0u);
  EXPECT_LE(huge.headers.tokens.reset, 60s);
  EXPECT_TRUE(
      stage.admit(request("sk-thousand-tokens", 10, "gpt-4o-mini", kStageStart + 1s)).allowed());

  // Settled with what was spent, the capped reservation is given back whole
  // (the second request's 10 tokens were refilled in that second).
  stage.complete(huge, 0, kStageStart + 1s);
  EXPECT_EQ(limits->tokens.remaining(kStageStart + 1s), 1000u);
}

TEST(AuthStage, ZeroEstimateSkipsTheTokenCheck) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  ASSERT_TRUE(stage.admit(request("sk-thousand-tokens", 5000)).allowed());
  Admission listing = stage.admit(request("sk-thousand-tokens", 0, ""));
  EXPECT_TRUE(listing.allowed());
  EXPECT_EQ(listing.headers.tokens.limit, 1000u);
  EXPECT_EQ(listing.headers.tokens.remaining, 0u);
}

TEST(AuthStage, DroppedAdmissionReleasesItsSlot) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  {
    Admission forgotten = stage.admit(request("sk-one-at-a-time"));
    ASSERT_TRUE(forgotten.allowed());
    EXPECT_EQ(in_flight(stage, "one-at-a-time"), 1u);
  }
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 0u);
}

TEST(AuthStage, MovingAnAdmissionMovesItsTicket) {
  auto config = load(kKeys);
  AuthStage stage(*config, nullptr);
  Admission original = stage.admit(request("sk-one-at-a-time"));
  Admission moved = std::move(original);
  stage.complete(original, 1, kStageStart);  // NOLINT(bugprone-use-after-move): a no-op on purpose
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 1u);

  Admission other;
  other = std::move(moved);
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 1u);
  stage.complete(other, 1, kStageStart);
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 0u);

  // Assigning over a live ticket gives its slot back.
  Admission live = stage.admit(request("sk-one-at-a-time"));
  live = Admission{};
  EXPECT_EQ(in_flight(stage, "one-at-a-time"), 0u);
}

TEST(AuthStage, ReloadCarriesBudgetsOfUnchangedKeys) {
  auto config = load(kKeys);
  auto first = std::make_unique<AuthStage>(*config, nullptr);
  ASSERT_TRUE(first->admit(request("sk-two-per-minute")).allowed());
  ASSERT_TRUE(first->admit(request("sk-two-per-minute")).allowed());

  auto reloaded = load(kKeys);
  AuthStage second(*reloaded, first.get());
  first.reset();
  Admission denied = second.admit(request("sk-two-per-minute"));
  ASSERT_FALSE(denied.allowed());
  EXPECT_EQ(denied.error->status, 429u);
}

// ---------------------------------------------------------------------------
// Headers

TEST(RateHeaders, AllowedRequestRendersBothTrios) {
  auto config =
      load("auth:\n  keys:\n    - {name: k, key: sk-header-key, rpm: 600, tpm: 600000}\n");
  AuthStage stage(*config, nullptr);
  Admission admission = stage.admit(request("sk-header-key", 1000));
  ASSERT_TRUE(admission.allowed());
  std::string out;
  admission.append_headers(out);
  EXPECT_EQ(out,
            "x-ratelimit-limit-requests: 600\r\n"
            "x-ratelimit-remaining-requests: 599\r\n"
            "x-ratelimit-reset-requests: 100ms\r\n"
            "x-ratelimit-limit-tokens: 600000\r\n"
            "x-ratelimit-remaining-tokens: 599000\r\n"
            "x-ratelimit-reset-tokens: 100ms\r\n");
}

TEST(RateHeaders, OnlyConfiguredLimitsAppear) {
  auto config = load("auth:\n  keys:\n    - {name: k, key: sk-header-key, tpm: 60}\n");
  AuthStage stage(*config, nullptr);
  Admission admission = stage.admit(request("sk-header-key", 30));
  std::string out;
  admission.append_headers(out);
  EXPECT_EQ(out,
            "x-ratelimit-limit-tokens: 60\r\n"
            "x-ratelimit-remaining-tokens: 30\r\n"
            "x-ratelimit-reset-tokens: 30s\r\n");

  auto unlimited = load("auth:\n  keys:\n    - {name: k, key: sk-header-key}\n");
  AuthStage open(*unlimited, nullptr);
  std::string none;
  open.admit(request("sk-header-key")).append_headers(none);
  EXPECT_EQ(none, "");
}

TEST(RateHeaders, DeniedRequestAddsRetryAfter) {
  auto config = load("auth:\n  keys:\n    - {name: k, key: sk-header-key, rpm: 1}\n");
  AuthStage stage(*config, nullptr);
  ASSERT_TRUE(stage.admit(request("sk-header-key")).allowed());
  Admission denied = stage.admit(request("sk-header-key", 100, "gpt-4o", kStageStart + 20500ms));
  ASSERT_FALSE(denied.allowed());
  std::string out;
  denied.append_headers(out);
  EXPECT_EQ(out,
            "x-ratelimit-limit-requests: 1\r\n"
            "x-ratelimit-remaining-requests: 0\r\n"
            "x-ratelimit-reset-requests: 39.5s\r\n"
            "Retry-After: 40\r\n");
}

TEST(OpenAiDuration, Format) {
  auto render = [](Nanos duration) {
    std::string out;
    append_openai_duration(out, duration);
    return out;
  };
  EXPECT_EQ(render(0ns), "0s");
  EXPECT_EQ(render(-5s), "0s");
  EXPECT_EQ(render(1ns), "1ms");
  EXPECT_EQ(render(120ms), "120ms");
  EXPECT_EQ(render(999ms), "999ms");
  EXPECT_EQ(render(999ms + 1ns), "1s");
  EXPECT_EQ(render(1s), "1s");
  EXPECT_EQ(render(1500ms), "1.5s");
  EXPECT_EQ(render(1020ms), "1.02s");
  EXPECT_EQ(render(6min), "6m0s");
  EXPECT_EQ(render(90250ms), "1m30.25s");
  EXPECT_EQ(render(1h), "1h0m0s");
  EXPECT_EQ(render(2h + 3min + 4005ms), "2h3m4.005s");
}

TEST(EstimateTokens, QuarterOfThePromptPlusTheCompletionBudget) {
  EXPECT_EQ(estimate_tokens(400, std::nullopt), 100u + kDefaultCompletionTokens);
  EXPECT_EQ(estimate_tokens(400, 1000), 1100u);
  EXPECT_EQ(estimate_tokens(3, 0), 0u);
  EXPECT_EQ(estimate_tokens(400, std::numeric_limits<std::uint64_t>::max()),
            std::numeric_limits<std::uint64_t>::max());
}

}  // namespace
}  // namespace sluice::auth

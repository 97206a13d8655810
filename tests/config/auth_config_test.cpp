// The auth section: client keys, their limits, and the rule that a gateway
// never runs open unless the file says so.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "sluice/auth/key_store.hpp"
#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

namespace sluice::config {
namespace {

using testing::EndsWith;
using testing::HasSubstr;
using testing::Not;
using testing::StartsWith;

// printf %s team-b-secret-key | sha256sum
const std::string kTeamBDigestHex =
    "ee612764d423b3100701813d8aac3dbdbe1e78e1a47270b83df6d8cacc23d47c";

std::string require_error(const Config& config) {
  try {
    require_auth_or_explicit_opt_out(config);
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected require_auth_or_explicit_opt_out to refuse";
  return {};
}

// ---------------------------------------------------------------------------
// Successful loads

TEST(AuthConfig, NoSectionLoadsWithAuthenticationOff) {
  ConfigPtr config = load_string(kOneModel, kNoEnv);
  EXPECT_FALSE(config->auth.enabled());
  EXPECT_FALSE(config->auth.disabled);
  EXPECT_TRUE(config->auth.keys.empty());
  EXPECT_EQ(config->auth.line, 0);
}

TEST(AuthConfig, NullSectionCountsAsAbsent) {
  ConfigPtr config = load_string("auth:\n" + kOneModel, kNoEnv);
  EXPECT_FALSE(config->auth.enabled());
  EXPECT_EQ(config->auth.line, 0);
}

TEST(AuthConfig, ExplicitOptOut) {
  ConfigPtr config = load_string("auth:\n  disabled: true\n" + kOneModel, kNoEnv);
  EXPECT_TRUE(config->auth.disabled);
  EXPECT_FALSE(config->auth.enabled());
  EXPECT_EQ(config->auth.line, 1);
  EXPECT_NO_THROW(require_auth_or_explicit_opt_out(*config));
}

TEST(AuthConfig, DisabledWithKeysKeepsKeysButStaysOff) {
  ConfigPtr config = load_string(
      "auth:\n  disabled: true\n  keys:\n    - {name: a, key: aaaaaaaa}\n" + kOneModel, kNoEnv);
  EXPECT_FALSE(config->auth.enabled());
  EXPECT_EQ(config->auth.keys.size(), 1u);
}

TEST(AuthConfig, KeyDefaults) {
  ConfigPtr config = load_string(
      "auth:\n"
      "  keys:\n"
      "    - name: team-a\n"
      "      key: ${TEAM_A_KEY}\n" +
          kOneModel,
      fake_env({{"TEAM_A_KEY", "sk-team-a-0123"}}));
  const Auth& auth = config->auth;
  EXPECT_TRUE(auth.enabled());
  EXPECT_FALSE(auth.disabled);
  ASSERT_EQ(auth.keys.size(), 1u);
  const ApiKey& key = auth.keys[0];
  EXPECT_EQ(key.name, "team-a");
  EXPECT_EQ(key.key_sha256, sha256("sk-team-a-0123"));
  EXPECT_TRUE(key.models.empty());
  EXPECT_EQ(key.limits, ApiKeyLimits{});
  EXPECT_NO_THROW(require_auth_or_explicit_opt_out(*config));
}

TEST(AuthConfig, FullKeys) {
  ConfigPtr config = load_string(
      "auth:\n"
      "  disabled: false\n"
      "  keys:\n"
      "    - name: team-a\n"
      "      key: os.environ/TEAM_A_KEY\n"
      "      models: [\"gpt-4o-mini\", \"chat-*\"]\n"
      "      rpm: 600\n"
      "      tpm: 200000\n"
      "      max_parallel: 16\n"
      "    - name: team-b\n"
      "      key_sha256: " +
          kTeamBDigestHex +
          "\n"
          "      tpm: 18446744073709551615\n" +
          kOneModel,
      fake_env({{"TEAM_A_KEY", "sk-team-a-0123"}}));
  const Auth& auth = config->auth;
  EXPECT_EQ(auth.line, 1);
  ASSERT_EQ(auth.keys.size(), 2u);
  EXPECT_EQ(auth.keys[0].models, (std::vector<std::string>{"gpt-4o-mini", "chat-*"}));
  EXPECT_EQ(auth.keys[0].limits.rpm, 600u);
  EXPECT_EQ(auth.keys[0].limits.tpm, 200000u);
  EXPECT_EQ(auth.keys[0].limits.max_parallel, 16u);
  EXPECT_EQ(auth.keys[1].name, "team-b");
  EXPECT_EQ(auth.keys[1].key_sha256, sha256("team-b-secret-key"));
  EXPECT_EQ(auth.keys[1].limits.tpm, 18446744073709551615u);
}

TEST(AuthConfig, DigestHexIsCaseInsensitive) {
  std::string upper = kTeamBDigestHex;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ConfigPtr config = load_string(
      "auth:\n  keys:\n    - {name: b, key_sha256: " + upper + "}\n" + kOneModel, kNoEnv);
  EXPECT_EQ(config->auth.keys[0].key_sha256, sha256("team-b-secret-key"));
}

// ---------------------------------------------------------------------------
// Refusing to run open

TEST(AuthConfig, RequireRefusesAConfigWithoutAuthSection) {
  ConfigPtr config = load_string(kOneModel, kNoEnv);
  std::string message = require_error(*config);
  EXPECT_THAT(message, StartsWith("(root): "));
  EXPECT_THAT(message, EndsWith("(line 1)"));
  EXPECT_THAT(message, HasSubstr("refuses to start without authentication"));
  EXPECT_THAT(message, HasSubstr("auth.keys"));
  EXPECT_THAT(message, HasSubstr("auth.disabled: true"));
}

TEST(AuthConfig, RequirePointsAtAnAuthSectionWithoutKeys) {
  // Load rejects this already; a Config put together in code goes through
  // the same check.
  Config config;
  config.auth.line = 7;
  std::string message = require_error(config);
  EXPECT_THAT(message, StartsWith("auth: "));
  EXPECT_THAT(message, EndsWith("(line 7)"));
}

TEST(AuthConfig, RequireAcceptsKeys) {
  Config config;
  config.auth.keys.push_back(ApiKey{"a", sha256("aaaaaaaa"), {}, {}});
  EXPECT_NO_THROW(require_auth_or_explicit_opt_out(config));
}

TEST(AuthConfig, SectionWithoutKeysIsRejectedAtLoad) {
  expect_error("auth:\n  disabled: false\n" + kOneModel, "auth", 1,
               "refuses to start without authentication");
  expect_error("server:\n  threads: 1\nauth:\n  keys: []\n" + kOneModel, "auth", 3,
               "auth.disabled: true");
  expect_error("auth: {}\n" + kOneModel, "auth", 1, "add keys under auth.keys");
}

// ---------------------------------------------------------------------------
// Errors

TEST(AuthConfigErrors, SectionShape) {
  expect_error("auth: on\n" + kOneModel, "auth", 1, "expected a mapping, got a scalar");
  expect_error("auth:\n  enabled: true\n" + kOneModel, "auth.enabled", 2,
               "unknown key 'enabled' (allowed: disabled, keys)");
  expect_error("auth:\n  disabled: yes\n" + kOneModel, "auth.disabled", 2,
               "expected true or false, got 'yes'");
  expect_error("auth:\n  keys: {name: a}\n" + kOneModel, "auth.keys", 2,
               "expected a sequence, got a mapping");
  expect_error("auth:\n  keys:\n    - just-a-key\n" + kOneModel, "auth.keys[0]", 3,
               "expected a mapping, got a scalar");
}

TEST(AuthConfigErrors, UnknownKeyInEntry) {
  expect_error("auth:\n  keys:\n    - name: a\n      key: aaaaaaaa\n      rpd: 5\n" + kOneModel,
               "auth.keys[0].rpd", 5, "unknown key 'rpd'");
}

TEST(AuthConfigErrors, Names) {
  expect_error("auth:\n  keys:\n    - key: aaaaaaaa\n" + kOneModel, "auth.keys[0].name", 3,
               "missing required key");
  expect_error("auth:\n  keys:\n    - name: \"\"\n      key: aaaaaaaa\n" + kOneModel,
               "auth.keys[0].name", 3, "must not be empty");
  expect_error(
      "auth:\n"
      "  keys:\n"
      "    - name: team\n"
      "      key: aaaaaaaa\n"
      "    - name: team\n"
      "      key: bbbbbbbb\n" +
          kOneModel,
      "auth.keys[1].name", 5, "duplicate key name 'team' (already used by auth.keys[0])");
}

TEST(AuthConfigErrors, ExactlyOneOfKeyAndDigest) {
  expect_error("auth:\n  keys:\n    - name: a\n      rpm: 5\n" + kOneModel, "auth.keys[0].key", 3,
               "give either key (the secret, usually \"${VAR}\") or key_sha256");
  expect_error("auth:\n  keys:\n    - name: a\n      key: aaaaaaaa\n      key_sha256: " +
                   kTeamBDigestHex + "\n" + kOneModel,
               "auth.keys[0].key_sha256", 5, "give either key or key_sha256, not both");
}

TEST(AuthConfigErrors, PlaintextKeys) {
  expect_error("auth:\n  keys:\n    - name: a\n      key: \"\"\n" + kOneModel, "auth.keys[0].key",
               4, "must not be empty");
  expect_error("auth:\n  keys:\n    - name: a\n      key: ${EMPTY}\n" + kOneModel,
               "auth.keys[0].key", 4, "must not be empty", fake_env({{"EMPTY", ""}}));
  expect_error("auth:\n  keys:\n    - name: a\n      key: ${UNSET}\n" + kOneModel,
               "auth.keys[0].key", 4, "environment variable UNSET is not set");
  expect_error("auth:\n  keys:\n    - name: a\n      key: sk-1234\n" + kOneModel,
               "auth.keys[0].key", 4, "too short: keys need at least 8 characters, got 7");
  expect_error("auth:\n  keys:\n    - name: a\n      key: \"sk-1234\\t5678\"\n" + kOneModel,
               "auth.keys[0].key", 4, "must not contain control characters");
  expect_error("auth:\n  keys:\n    - name: a\n      key: \" sk-12345678\"\n" + kOneModel,
               "auth.keys[0].key", 4, "start or end with a space");
}

TEST(AuthConfigErrors, DigestKeys) {
  expect_error("auth:\n  keys:\n    - name: a\n      key_sha256: abc123\n" + kOneModel,
               "auth.keys[0].key_sha256", 4,
               "expected the SHA-256 as 64 hex digits, got 6 characters");
  std::string bad = kTeamBDigestHex;
  bad[10] = 'g';
  expect_error("auth:\n  keys:\n    - name: a\n      key_sha256: " + bad + "\n" + kOneModel,
               "auth.keys[0].key_sha256", 4, "found 'g' at position 11");
}

TEST(AuthConfigErrors, DuplicateSecretsInEitherForm) {
  expect_error(
      "auth:\n"
      "  keys:\n"
      "    - name: a\n"
      "      key: ${SHARED}\n"
      "    - name: b\n"
      "      key: ${SHARED}\n" +
          kOneModel,
      "auth.keys[1].key", 6, "the same key is already given by auth.keys[0]",
      fake_env({{"SHARED", "sk-shared-secret"}}));
  expect_error(
      "auth:\n"
      "  keys:\n"
      "    - name: a\n"
      "      key: team-b-secret-key\n"
      "    - name: b\n"
      "      key_sha256: " +
          kTeamBDigestHex + "\n" + kOneModel,
      "auth.keys[1].key_sha256", 6, "the same key is already given by auth.keys[0]");
}

TEST(AuthConfigErrors, MessagesNeverContainTheSecret) {
  std::string short_key = load_error("auth:\n  keys:\n    - {name: a, key: s3cr3t}\n" + kOneModel);
  EXPECT_THAT(short_key, Not(HasSubstr("s3cr3t")));
  std::string duplicate = load_error(
      "auth:\n  keys:\n    - {name: a, key: sk-hunter-22}\n    - {name: b, key: sk-hunter-22}\n" +
      kOneModel);
  EXPECT_THAT(duplicate, Not(HasSubstr("sk-hunter-22")));
  std::string control =
      load_error("auth:\n  keys:\n    - {name: a, key: \"sk-hunter\\n22\"}\n" + kOneModel);
  EXPECT_THAT(control, Not(HasSubstr("hunter")));
}

TEST(AuthConfigErrors, Models) {
  expect_error("auth:\n  keys:\n    - {name: a, key: aaaaaaaa, models: []}\n" + kOneModel,
               "auth.keys[0].models", 3, "must list at least one model name or pattern");
  expect_error("auth:\n  keys:\n    - {name: a, key: aaaaaaaa, models: gpt-4o}\n" + kOneModel,
               "auth.keys[0].models", 3, "expected a sequence, got a scalar");
  expect_error(
      "auth:\n  keys:\n    - name: a\n      key: aaaaaaaa\n      models:\n        - m\n        - "
      "\"\"\n" +
          kOneModel,
      "auth.keys[0].models[1]", 7, "must not be empty");
  expect_error(
      "auth:\n  keys:\n    - name: a\n      key: aaaaaaaa\n      models: [chat-*, chat-*]\n" +
          kOneModel,
      "auth.keys[0].models[1]", 5, "'chat-*' is listed twice");
}

TEST(AuthConfigErrors, Limits) {
  expect_error("auth:\n  keys:\n    - name: a\n      key: aaaaaaaa\n      rpm: -1\n" + kOneModel,
               "auth.keys[0].rpm", 5, "must not be negative");
  expect_error("auth:\n  keys:\n    - name: a\n      key: aaaaaaaa\n      tpm: lots\n" + kOneModel,
               "auth.keys[0].tpm", 5, "expected a whole number, got 'lots'");
  expect_error(
      "auth:\n  keys:\n    - name: a\n      key: aaaaaaaa\n      max_parallel: 5000000000\n" +
          kOneModel,
      "auth.keys[0].max_parallel", 5, "out of range");
}

// ---------------------------------------------------------------------------
// Shipped files

TEST(AuthConfig, DemoOptsOutExplicitly) {
  ConfigPtr config = load_file((repository_root() / "config" / "demo.yaml").string(), fake_env({}));
  EXPECT_TRUE(config->auth.disabled);
  EXPECT_NO_THROW(require_auth_or_explicit_opt_out(*config));
}

TEST(AuthConfig, ExampleHasKeys) {
  auto example = repository_root() / "config" / "example.yaml";
  ConfigPtr config = load_file(example.string(), fake_env({{"OPENAI_API_KEY", "sk-test"},
                                                           {"OPENAI_ORG_ID", "org-test"},
                                                           {"AZURE_OPENAI_API_KEY", "az-test"},
                                                           {"SLUICE_CA_FILE", example.string()}}));
  EXPECT_TRUE(config->auth.enabled());
  ASSERT_GE(config->auth.keys.size(), 1u);
  EXPECT_EQ(config->auth.keys[0].name, "team-a");
  EXPECT_GT(config->auth.keys[0].limits.rpm, 0u);
  EXPECT_NO_THROW(require_auth_or_explicit_opt_out(*config));
}

}  // namespace
}  // namespace sluice::config

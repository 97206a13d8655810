// Authenticating presented keys, pulling them out of request headers, and
// matching model globs.

#include "sluice/auth/key_store.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace sluice::auth {
namespace {

config::EnvLookup fake_env(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

// printf %s team-b-secret-key | sha256sum
constexpr const char* kTeamBDigestHex =
    "ee612764d423b3100701813d8aac3dbdbe1e78e1a47270b83df6d8cacc23d47c";

// team-a (and its models) unless `with_team_a` is false, then team-b.
config::ConfigPtr key_config(bool with_team_a) {
  const std::string team_a = with_team_a ? "    - name: team-a\n"
                                           "      key: ${TEAM_A_KEY}\n"
                                           "      models: [gpt-4o-mini, \"chat-*\"]\n"
                                         : "";
  return config::load_string(
      "auth:\n"
      "  keys:\n" +
          team_a +
          "    - name: team-b\n"
          "      key_sha256: " +
          kTeamBDigestHex +
          "\n"
          "models:\n"
          "  - name: m\n"
          "    deployments:\n"
          "      - base_url: http://127.0.0.1:8000\n",
      fake_env({{"TEAM_A_KEY", "sk-team-a-0123"}}));
}

config::ConfigPtr two_key_config() { return key_config(true); }

TEST(Sha256, MatchesKnownDigests) {
  // FIPS 180-2 test vector, and the digest the example above relies on.
  Sha256 abc = sha256("abc");
  const unsigned char expected[] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                                    0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                                    0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                                    0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
  EXPECT_TRUE(std::equal(abc.begin(), abc.end(), std::begin(expected)));
  EXPECT_EQ(sha256("team-b-secret-key")[0], 0xee);
}

TEST(KeyStore, PlaintextAndDigestKeysAuthenticate) {
  auto config = two_key_config();
  KeyStore store(config->auth);
  ASSERT_EQ(store.keys().size(), 2u);

  const KeyPolicy* a = store.authenticate("sk-team-a-0123");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "team-a");
  EXPECT_EQ(a->models, (std::vector<std::string>{"gpt-4o-mini", "chat-*"}));

  const KeyPolicy* b = store.authenticate("team-b-secret-key");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->name, "team-b");
  EXPECT_TRUE(b->models.empty());
}

TEST(KeyStore, WrongKeysDoNot) {
  auto config = two_key_config();
  KeyStore store(config->auth);
  EXPECT_EQ(store.authenticate(""), nullptr);
  EXPECT_EQ(store.authenticate("sk-team-a-012"), nullptr);    // a prefix
  EXPECT_EQ(store.authenticate("sk-team-a-01234"), nullptr);  // an extension
  EXPECT_EQ(store.authenticate("SK-TEAM-A-0123"), nullptr);   // keys are case-sensitive
  EXPECT_EQ(store.authenticate(kTeamBDigestHex), nullptr);    // the digest is not the key
  EXPECT_EQ(store.authenticate(std::string_view("sk-team-a-0123\0", 15)), nullptr);
}

TEST(KeyStore, EmptyStoreAuthenticatesNobody) {
  KeyStore store;
  EXPECT_EQ(store.authenticate("anything-at-all"), nullptr);
}

TEST(KeyStore, ManyKeysEachFindTheirOwn) {
  config::Auth auth;
  for (int index = 0; index < 50; ++index) {
    auth.keys.push_back(
        {"key-" + std::to_string(index), sha256("secret-number-" + std::to_string(index)), {}, {}});
  }
  KeyStore store(auth);
  for (int index = 0; index < 50; ++index) {
    const KeyPolicy* key = store.authenticate("secret-number-" + std::to_string(index));
    ASSERT_NE(key, nullptr) << index;
    EXPECT_EQ(key->name, "key-" + std::to_string(index));
  }
  EXPECT_EQ(store.authenticate("secret-number-50"), nullptr);
}

// ---------------------------------------------------------------------------
// Extraction from headers

struct Headers {
  std::map<std::string, std::string> values;  // lower-case names
  std::string_view operator()(std::string_view name) const {
    auto it = values.find(std::string(name));
    return it == values.end() ? std::string_view() : std::string_view(it->second);
  }
};

std::optional<std::string_view> extract(const Headers& headers) {
  return extract_presented_key(headers);
}

// A connection's memo answers as the store does, whatever the order of the
// secrets it sees, and never from a store other than the one it remembers.
TEST(KeyMemo, AnswersAsTheStoreDoes) {
  auto config = two_key_config();
  KeyStore store(config->auth);
  KeyMemo memo;
  // A prefix of the remembered secret, and a secret it is a prefix of.
  const std::vector<std::string> secrets = {
      "sk-team-a-0123", "sk-team-a-0123",      "sk-team-a-012",
      "sk-team-a-0123", "sk-team-a-01234",     "team-b-secret-key",
      "sk-team-a-0124", "sk-team-a-0124",      "",
      "sk-team-a-0123", std::string(600, 'k'), std::string(600, 'k'),
      "sk-team-a-0123"};
  for (const auto& secret : secrets) {
    EXPECT_EQ(memo.authenticate(store, secret), store.authenticate(secret)) << secret;
  }
  ASSERT_NE(memo.authenticate(store, "team-b-secret-key"), nullptr);
  EXPECT_EQ(memo.authenticate(store, "team-b-secret-key")->name, "team-b");
}

TEST(KeyMemo, AReloadedStoreIsAskedAgain) {
  auto config = two_key_config();
  KeyMemo memo;
  {
    KeyStore before(config->auth);
    ASSERT_NE(memo.authenticate(before, "sk-team-a-0123"), nullptr);
  }
  // team-a is gone from the new config; the new store may even sit where
  // the old one was.
  auto without_a = key_config(false);
  KeyStore after(without_a->auth);
  EXPECT_EQ(memo.authenticate(after, "sk-team-a-0123"), nullptr);
  const KeyPolicy* b = memo.authenticate(after, "team-b-secret-key");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b, &after.keys()[0]);
  memo.forget();
  EXPECT_EQ(memo.authenticate(after, "team-b-secret-key"), b);
}

TEST(ExtractPresentedKey, BearerAuthorization) {
  EXPECT_EQ(extract({{{"authorization", "Bearer sk-1"}}}), "sk-1");
  EXPECT_EQ(extract({{{"authorization", "bearer sk-1"}}}), "sk-1");
  EXPECT_EQ(extract({{{"authorization", "BEARER sk-1"}}}), "sk-1");
  EXPECT_EQ(extract({{{"authorization", "  Bearer    sk-1  "}}}), "sk-1");
  EXPECT_EQ(extract({{{"authorization", "Bearer\tsk-1\t"}}}), "sk-1");
}

TEST(ExtractPresentedKey, AzureAndAnthropicStyleHeaders) {
  EXPECT_EQ(extract({{{"api-key", "az-1"}}}), "az-1");
  EXPECT_EQ(extract({{{"x-api-key", " x-1 "}}}), "x-1");
}

TEST(ExtractPresentedKey, Precedence) {
  EXPECT_EQ(
      extract({{{"authorization", "Bearer sk-1"}, {"api-key", "az-1"}, {"x-api-key", "x-1"}}}),
      "sk-1");
  EXPECT_EQ(extract({{{"api-key", "az-1"}, {"x-api-key", "x-1"}}}), "az-1");
}

TEST(ExtractPresentedKey, MalformedAuthorizationCountsAsMissing) {
  EXPECT_EQ(extract({{{"authorization", "Basic dXNlcjpwYXNz"}}}), std::nullopt);
  EXPECT_EQ(extract({{{"authorization", "Bearer"}}}), std::nullopt);
  EXPECT_EQ(extract({{{"authorization", "Bearer    "}}}), std::nullopt);
  EXPECT_EQ(extract({{{"authorization", "Bearersk-1"}}}), std::nullopt);
  EXPECT_EQ(extract({{{"authorization", "sk-1"}}}), std::nullopt);
  EXPECT_EQ(extract({{{"authorization", ""}}}), std::nullopt);
  // ... so the next header still counts.
  EXPECT_EQ(extract({{{"authorization", "Basic dXNlcjpwYXNz"}, {"x-api-key", "x-1"}}}), "x-1");
}

TEST(ExtractPresentedKey, NothingPresented) {
  EXPECT_EQ(extract({}), std::nullopt);
  EXPECT_EQ(extract({{{"api-key", "   "}}}), std::nullopt);
}

TEST(ExtractPresentedKey, WorksWithAPlainLambda) {
  auto key = extract_presented_key([](std::string_view name) -> std::string_view {
    return name == "x-api-key" ? "from-lambda" : "";
  });
  EXPECT_EQ(key, "from-lambda");
}

// ---------------------------------------------------------------------------
// Globs

TEST(GlobMatch, Literals) {
  EXPECT_TRUE(glob_match("gpt-4o", "gpt-4o"));
  EXPECT_FALSE(glob_match("gpt-4o", "gpt-4o-mini"));
  EXPECT_FALSE(glob_match("gpt-4o-mini", "gpt-4o"));
  EXPECT_FALSE(glob_match("GPT-4o", "gpt-4o"));
  EXPECT_TRUE(glob_match("", ""));
  EXPECT_FALSE(glob_match("", "a"));
}

TEST(GlobMatch, Stars) {
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("*", "anything"));
  EXPECT_TRUE(glob_match("chat-*", "chat-"));
  EXPECT_TRUE(glob_match("chat-*", "chat-large"));
  EXPECT_FALSE(glob_match("chat-*", "chat"));
  EXPECT_TRUE(glob_match("*-mini", "gpt-4o-mini"));
  EXPECT_FALSE(glob_match("*-mini", "gpt-4o-mini-2024"));
  EXPECT_TRUE(glob_match("gpt*mini*", "gpt-4o-mini-2024"));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(glob_match("**a", "bba"));
  // Backtracking past a partial match of the literal after the star.
  EXPECT_TRUE(glob_match("*aab", "aaab"));
}

TEST(GlobMatch, QuestionMarks) {
  EXPECT_TRUE(glob_match("gpt-?o", "gpt-4o"));
  EXPECT_FALSE(glob_match("gpt-?o", "gpt-o"));
  EXPECT_FALSE(glob_match("gpt-?o", "gpt-45o"));
  EXPECT_TRUE(glob_match("?*", "x"));
  EXPECT_FALSE(glob_match("?*", ""));
}

TEST(AllowsModel, EmptyListAllowsAll) {
  KeyPolicy open{"open", {}, {}, {}};
  EXPECT_TRUE(allows_model(open, "anything"));

  KeyPolicy restricted{"restricted", {}, {"gpt-4o-mini", "chat-*"}, {}};
  EXPECT_TRUE(allows_model(restricted, "gpt-4o-mini"));
  EXPECT_TRUE(allows_model(restricted, "chat-fast"));
  EXPECT_FALSE(allows_model(restricted, "gpt-4o"));
}

}  // namespace
}  // namespace sluice::auth

// The `state` section: where limits, cooldowns and the exact cache live.
// Error tests check the YAML path and line an operator has to fix.

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice::config {
namespace {

using std::chrono::milliseconds;
using testing::HasSubstr;

TEST(StateConfig, LocalByDefault) {
  ConfigPtr config = load_string(kOneModel, kNoEnv);
  EXPECT_EQ(config->state.backend, State::Backend::local);
  EXPECT_FALSE(config->state.shared());
  EXPECT_EQ(config->state.on_unavailable, State::OnUnavailable::local);
  EXPECT_EQ(config->state.redis.key_prefix, "sluice:");
  EXPECT_EQ(config->state.redis.timeout, milliseconds(50));
}

TEST(StateConfig, EveryKeyParsed) {
  ConfigPtr config = load_string(
      "state:\n"
      "  backend: redis\n"
      "  redis:\n"
      "    url: redis://10.0.0.7:6380/2\n"
      "    password: ${REDIS_PASSWORD}\n"
      "    username: gateway\n"
      "    key_prefix: \"prod:\"\n"
      "    timeout: 20ms\n"
      "  on_unavailable: deny\n" +
          kOneModel,
      fake_env({{"REDIS_PASSWORD", "s3cret"}}));
  const State& state = config->state;
  EXPECT_TRUE(state.shared());
  EXPECT_EQ(state.on_unavailable, State::OnUnavailable::deny);
  EXPECT_EQ(state.redis.transport, RedisState::Transport::tcp);
  EXPECT_EQ(state.redis.host, "10.0.0.7");
  EXPECT_EQ(state.redis.port, 6380);
  EXPECT_EQ(state.redis.database, 2u);
  EXPECT_EQ(state.redis.username, "gateway");
  EXPECT_EQ(state.redis.password, "s3cret");
  EXPECT_EQ(state.redis.key_prefix, "prod:");
  EXPECT_EQ(state.redis.timeout, milliseconds(20));
  EXPECT_EQ(state.redis.url, "redis://10.0.0.7:6380/2");
}

TEST(StateConfig, CredentialsInTheUrlAreDecodedAndKeptOutOfItsPrintedForm) {
  RedisState redis;
  std::string why;
  ASSERT_TRUE(parse_redis_url("rediss://user:p%40ss@cache.internal", redis, why)) << why;
  EXPECT_EQ(redis.transport, RedisState::Transport::tls);
  EXPECT_EQ(redis.host, "cache.internal");
  EXPECT_EQ(redis.port, 6379);
  EXPECT_EQ(redis.username, "user");
  EXPECT_EQ(redis.password, "p@ss");
  EXPECT_EQ(redis.url, "rediss://cache.internal:6379");

  ASSERT_TRUE(parse_redis_url("redis://onlypassword@[::1]:7000", redis, why)) << why;
  EXPECT_EQ(redis.username, "");
  EXPECT_EQ(redis.password, "onlypassword");
  EXPECT_EQ(redis.host, "::1");
  EXPECT_EQ(redis.port, 7000);
}

TEST(StateConfig, UnixSocketWithDatabase) {
  RedisState redis;
  std::string why;
  ASSERT_TRUE(parse_redis_url("unix:///run/redis/redis.sock?db=3", redis, why)) << why;
  EXPECT_EQ(redis.transport, RedisState::Transport::unix_socket);
  EXPECT_EQ(redis.socket_path, "/run/redis/redis.sock");
  EXPECT_EQ(redis.database, 3u);
}

TEST(StateConfig, BadUrlsAreRefusedWithTheReason) {
  RedisState redis;
  std::string why;
  EXPECT_FALSE(parse_redis_url("http://127.0.0.1:6379", redis, why));
  EXPECT_THAT(why, HasSubstr("unsupported scheme 'http'"));
  EXPECT_FALSE(parse_redis_url("127.0.0.1:6379", redis, why));
  EXPECT_THAT(why, HasSubstr("missing scheme"));
  EXPECT_FALSE(parse_redis_url("redis://127.0.0.1:0", redis, why));
  EXPECT_THAT(why, HasSubstr("invalid port"));
  EXPECT_FALSE(parse_redis_url("redis://127.0.0.1/x", redis, why));
  EXPECT_THAT(why, HasSubstr("invalid database number"));
  EXPECT_FALSE(parse_redis_url("unix://relative.sock", redis, why));
  EXPECT_THAT(why, HasSubstr("absolute socket path"));
  EXPECT_FALSE(parse_redis_url("redis://u:%zz@host", redis, why));
  EXPECT_THAT(why, HasSubstr("percent-encoding"));
}

TEST(StateConfig, ErrorsNameTheirYamlPath) {
  expect_error("state:\n  backend: redis\n  redis:\n    url: http://x\n" + kOneModel,
               "state.redis.url", 4, "unsupported scheme");
  expect_error("state:\n  backend: memcached\n" + kOneModel, "state.backend", 2,
               "allowed: local, redis");
  expect_error("state:\n  backend: redis\n" + kOneModel, "state.redis.url", 2,
               "missing required key");
  expect_error("state:\n  on_unavailable: wait\n" + kOneModel, "state.on_unavailable", 2,
               "allowed: local, deny");
  expect_error(
      "state:\n  backend: redis\n  redis:\n    url: redis://h\n    timeout: 0ms\n" + kOneModel,
      "state.redis.timeout", 5, "greater than zero");
  expect_error("state:\n  redis:\n    url: redis://a:b@h\n    password: c\n" + kOneModel,
               "state.redis.password", 4, "give it once");
  expect_error("state:\n  redis:\n    url: redis://h\n    key_prefix: \"{x}\"\n" + kOneModel,
               "state.redis.key_prefix", 4, "braces");
  expect_error("state:\n  redis:\n    url: redis://h\n    port: 1\n" + kOneModel,
               "state.redis.port", 4, "unknown key");
  expect_error("state:\n  lease_ttl: 500ms\n" + kOneModel, "state.lease_ttl", 2, "at least 1s");
  expect_error("state:\n  redis:\n    url: redis://h\n    ca_file: /etc/passwd\n" + kOneModel,
               "state.redis.ca_file", 4, "rediss://");
  expect_error("state:\n  redis:\n    url: rediss://h\n    ca_file: /no/such.pem\n" + kOneModel,
               "state.redis.ca_file", 4, "does not exist");
}

TEST(StateConfig, LeaseTtlAndCaFile) {
  EXPECT_EQ(load_string(kOneModel, kNoEnv)->state.lease_ttl, milliseconds(10000));
  ConfigPtr config = load_string(
      "state:\n  lease_ttl: 2s\n  redis:\n    url: rediss://redis.internal\n"
      "    ca_file: /etc/passwd\n" +
          kOneModel,
      kNoEnv);
  EXPECT_EQ(config->state.lease_ttl, milliseconds(2000));
  EXPECT_EQ(config->state.redis.transport, RedisState::Transport::tls);
  EXPECT_EQ(config->state.redis.ca_file, "/etc/passwd");
}

TEST(StateConfig, TheBackendIsTakenAtStart) {
  ConfigPtr running = load_string(kOneModel, kNoEnv);
  ConfigPtr loaded =
      load_string("state:\n  backend: redis\n  redis:\n    url: redis://h\n" + kOneModel, kNoEnv);
  EXPECT_THAT(start_only_changes(*running, *loaded), testing::Contains("state"));
}

}  // namespace
}  // namespace sluice::config

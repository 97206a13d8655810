// The per-worker Redis connection on its own: pipelining, scripts by SHA-1
// with the NOSCRIPT fallback, and the timeout that bounds every wait.
#include <gtest/gtest.h>

#include <hiredis/hiredis.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <functional>
#include <thread>
#include <vector>

#include "sluice/state/redis_client.hpp"
#include "support/redis_server.hpp"

namespace sluice::testing {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;

config::RedisState settings_for(const RedisServer& redis) {
  config::RedisState settings;
  std::string why;
  EXPECT_TRUE(config::parse_redis_url(redis.url(), settings, why)) << why;
  settings.timeout = 50ms;
  return settings;
}

// Runs `body` on a fresh context once the client is up; bounded.
void with_client(const config::RedisState& settings,
                 std::function<net::awaitable<void>(state::RedisClient&)> body) {
  net::io_context context;
  state::BackendStatus status(1, settings.url);
  state::RedisClient client(context, settings, status, 7);
  client.start();
  bool finished = false;
  net::co_spawn(
      context,
      [&]() -> net::awaitable<void> {
        net::steady_timer wait(context);
        for (int i = 0; i < 200 && !client.up(); ++i) {
          wait.expires_after(10ms);
          co_await wait.async_wait(net::use_awaitable);
        }
        EXPECT_TRUE(client.up());
        co_await body(client);
        finished = true;
        client.stop();
      },
      net::detached);
  context.run_for(10s);
  EXPECT_TRUE(finished);
}

// hiredis's own formatter, as the oracle for the gateway's.
std::string formatted_by_hiredis(const std::vector<std::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const auto& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  char* formatted = nullptr;
  const int length = redisFormatCommandArgv(&formatted, static_cast<int>(args.size()),
                                            argv.data(), lengths.data());
  std::string command(formatted, static_cast<std::size_t>(length));
  redisFreeCommand(formatted);
  return command;
}

TEST(RedisClient, CommandsAreFormattedAsHiredisFormatsThem) {
  const std::string binary("a\0b\r\n", 5);
  const std::string long_argument(70000, 'x');
  const std::vector<std::vector<std::string_view>> commands{
      {"PING"},
      {"SET", "key", ""},
      {"EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "3", "sluice:{key:a}:rpm:60",
       "sluice:{key:a}:tpm:0", "sluice:{key:a}:par:0", "1000000000", "60000000000", "0", "0",
       "0", "", "10000"},
      {"SET", binary, long_argument},
  };
  for (const auto& command : commands) {
    std::string ours = "already queued";
    state::append_command(ours, command);
    EXPECT_EQ(ours, "already queued" + formatted_by_hiredis(command)) << command[0];
  }
  std::vector<std::string_view> many(40, "v");
  std::string ours;
  state::append_command(ours, many);
  EXPECT_EQ(ours, formatted_by_hiredis(many));
}

TEST(RedisClient, ScriptDigestIsRedisOwn) {
  EXPECT_EQ(state::Script("return 1").sha1, "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
  EXPECT_EQ(state::tagged_key("p:", "key:a", ":rpm"), "p:{key:a}:rpm");
}

TEST(RedisClient, PipelinedCommandsGetTheirOwnReplies) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  with_client(settings_for(redis), [](state::RedisClient& client) -> net::awaitable<void> {
    // Sent one after another without waiting: replies come back in order.
    for (int i = 0; i < 100; ++i) {
      auto value = std::to_string(i);
      std::string key = "k" + value;
      std::array<std::string_view, 3> set{"SET", key, value};
      client.send(set);
    }
    for (int i = 0; i < 100; i += 33) {
      std::string key = "k" + std::to_string(i);
      std::array<std::string_view, 2> get{"GET", key};
      auto reply = co_await client.command(get);
      EXPECT_TRUE(reply && reply->type == state::Reply::Type::string);
      if (reply) {
        EXPECT_EQ(reply->text, std::to_string(i));
      }
    }
  });
}

TEST(RedisClient, UnknownScriptIsSentInFullOnce) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  with_client(settings_for(redis), [](state::RedisClient& client) -> net::awaitable<void> {
    state::Script script("return {KEYS[1], ARGV[1]}");
    std::array<std::string_view, 1> keys{"a"};
    std::array<std::string_view, 1> args{"b"};
    for (int i = 0; i < 2; ++i) {
      auto reply = co_await client.eval(script, keys, args);
      EXPECT_TRUE(reply && reply->type == state::Reply::Type::array);
      if (reply && reply->elements.size() == 2) {
        EXPECT_EQ(reply->elements[0].text, "a");
        EXPECT_EQ(reply->elements[1].text, "b");
      }
    }
  });
}

TEST(RedisClient, AStalledServerCostsAtMostTheTimeout) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  with_client(settings_for(redis), [&](state::RedisClient& client) -> net::awaitable<void> {
    redis.pause();
    std::array<std::string_view, 1> ping{"PING"};
    auto sent = std::chrono::steady_clock::now();
    auto reply = co_await client.command(ping);
    auto waited = std::chrono::steady_clock::now() - sent;
    EXPECT_FALSE(reply.has_value());
    EXPECT_GE(waited, 45ms);
    EXPECT_LT(waited, 200ms);
    // The connection is dropped: the next command does not wait at all.
    sent = std::chrono::steady_clock::now();
    reply = co_await client.command(ping);
    EXPECT_FALSE(reply.has_value());
    EXPECT_LT(std::chrono::steady_clock::now() - sent, 5ms);
    redis.resume();
  });
}

}  // namespace
}  // namespace sluice::testing

// Name resolution keeps its deadline even when the lookup never answers
// (getaddrinfo blocked on an unreachable name server cannot be cancelled), a
// late answer after the deadline is harmless, and answers are cached.
#include "sluice/upstream/dns_cache.hpp"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <optional>

#include "support/scripted_dns.hpp"

namespace sluice::testing {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using upstream::Endpoints;

const net::ip::tcp::endpoint kAnswer(net::ip::make_address("127.0.0.1"), 443);

struct Resolved {
  Result<Endpoints, error_code> result{error_code{}};
  std::chrono::steady_clock::duration took{};
};

// Runs one resolve to its end on `context`, then lets pending work (a late
// answer) run. Tests declare the context before the cache: lookups the cache
// still holds own timers of that context.
Resolved resolve(net::io_context& context, upstream::DnsCache& dns,
                 std::chrono::milliseconds budget, std::chrono::milliseconds linger = 0ms,
                 const std::string& host = "api.example.test") {
  context.restart();
  Resolved resolved;
  net::co_spawn(
      context,
      [&]() -> net::awaitable<void> {
        auto started = Clock::now();
        resolved.result = co_await dns.resolve(host, 443, started + budget);
        resolved.took = Clock::now() - started;
        if (linger > 0ms) {
          net::steady_timer wait(co_await net::this_coro::executor, linger);
          co_await wait.async_wait(net::use_awaitable);
        }
      },
      net::detached);
  context.run_for(5s);
  return resolved;
}

TEST(DnsCache, ALookupThatNeverAnswersEndsAtTheDeadline) {
  net::io_context context;
  ScriptedDns dns(std::nullopt, {kAnswer});
  auto resolved = resolve(context, dns, 150ms);
  ASSERT_FALSE(resolved.result);
  EXPECT_EQ(resolved.result.error(), net::error::timed_out);
  EXPECT_GE(resolved.took, 150ms);
  EXPECT_LT(resolved.took, 1s);
}

TEST(DnsCache, ALateAnswerIsDroppedAndTheNextRequestLooksUpAgain) {
  net::io_context context;
  ScriptedDns dns(300ms, {kAnswer});
  auto resolved = resolve(context, dns, 100ms, /*linger=*/400ms);
  ASSERT_FALSE(resolved.result);
  EXPECT_EQ(resolved.result.error(), net::error::timed_out);
  EXPECT_LT(resolved.took, 290ms) << "waited for the lookup, not the deadline";
  EXPECT_EQ(dns.late_answers, 1);

  auto again = resolve(context, dns, 1s);
  ASSERT_TRUE(again.result);
  EXPECT_EQ(again.result.value(), Endpoints{kAnswer});
  EXPECT_EQ(dns.lookups, 2);
}

TEST(DnsCache, AnswersAreCachedAndLiteralsNeverLookedUp) {
  net::io_context context;
  ScriptedDns dns(10ms, {kAnswer});
  ASSERT_TRUE(resolve(context, dns, 1s).result);
  auto cached = resolve(context, dns, 1s);
  ASSERT_TRUE(cached.result);
  EXPECT_EQ(cached.result.value(), Endpoints{kAnswer});
  EXPECT_EQ(dns.lookups, 1);

  context.restart();
  std::optional<Result<Endpoints, error_code>> literal;
  net::co_spawn(
      context,
      [&]() -> net::awaitable<void> {
        literal = co_await dns.resolve("::1", 8080, Clock::now() + 1s);
      },
      net::detached);
  context.run_for(1s);
  ASSERT_TRUE(literal && *literal);
  EXPECT_EQ(literal->value().front().port(), 8080);
  EXPECT_EQ(dns.lookups, 1);
}

TEST(DnsCache, TheSystemLookupResolvesLocalhost) {
  net::io_context context;
  upstream::DnsCache dns(std::chrono::seconds(1));
  auto resolved = resolve(context, dns, 2s, 0ms, "localhost");
  ASSERT_TRUE(resolved.result) << resolved.result.error().message();
  for (const auto& endpoint : resolved.result.value()) {
    EXPECT_TRUE(endpoint.address().is_loopback()) << endpoint;
    EXPECT_EQ(endpoint.port(), 443);
  }
}

}  // namespace
}  // namespace sluice::testing

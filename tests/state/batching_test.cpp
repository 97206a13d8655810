// A worker's calls to Redis for one budget: requests that come while a call
// is in flight go together in the next one, one script for all, and each
// gets the answer a call of its own at that instant would have given.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "sluice/common/gcra.hpp"
#include "sluice/server/shared_state.hpp"
#include "support/redis_server.hpp"

namespace sluice::testing {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;

// How many scripts Redis has run (by digest, or sent in full the first time
// a connection sends one without waiting) since its statistics were reset.
long long scripts_run(const RedisServer& redis) {
  const std::string stats = redis.command({"INFO", "commandstats"});
  const std::regex calls(R"(cmdstat_eval(sha)?:calls=([0-9]+))");
  long long total = 0;
  for (auto it = std::sregex_iterator(stats.begin(), stats.end(), calls);
       it != std::sregex_iterator(); ++it) {
    total += std::stoll((*it)[2]);
  }
  return total;
}

server::SharedBudget budget_of(const std::string& tag, std::uint64_t rpm, unsigned max_parallel) {
  const GcraRate rate(rpm);
  const std::string prefix = "batching:{" + tag + "}:";
  return {prefix + "rpm",
          prefix + "tpm",
          prefix + "par",
          std::to_string(rate.interval_ns),
          std::to_string(rate.window_ns),
          std::to_string(max_parallel),
          "30000"};
}

// Settlements that go at once unless a call of their budget is in flight.
constexpr std::chrono::nanoseconds kNoSettlementWait{0};

// Runs `body` on a fresh worker's loop once its connection is up; bounded.
void with_worker(const RedisServer& redis,
                 std::function<net::awaitable<void>(server::WorkerState&, net::io_context&)> body,
                 std::chrono::steady_clock::duration settlement_wait = server::kSettlementWait) {
  config::State settings;
  settings.backend = config::State::Backend::redis;
  std::string why;
  ASSERT_TRUE(config::parse_redis_url(redis.url(), settings.redis, why)) << why;
  settings.redis.timeout = 1s;
  net::io_context context;
  state::BackendStatus status(1, settings.redis.url);
  server::WorkerState worker(context, settings, status, 11, settlement_wait);
  worker.start();
  bool finished = false;
  net::co_spawn(
      context,
      [&]() -> net::awaitable<void> {
        net::steady_timer wait(context);
        for (int i = 0; i < 200 && !worker.redis().up(); ++i) {
          wait.expires_after(10ms);
          co_await wait.async_wait(net::use_awaitable);
        }
        EXPECT_TRUE(worker.redis().up());
        co_await body(worker, context);
        finished = true;
        worker.stop();
      },
      net::detached);
  context.run_for(20s);
  EXPECT_TRUE(finished);
}

// Waits on the loop until `condition` holds, at most about two seconds.
net::awaitable<bool> until(net::io_context& context, const std::function<bool()>& condition) {
  net::steady_timer wait(context);
  for (int i = 0; i < 200 && !condition(); ++i) {
    wait.expires_after(10ms);
    co_await wait.async_wait(net::use_awaitable);
  }
  co_return condition();
}

// Admits `count` requests of `budget` one call at a time, and holds their
// permits.
net::awaitable<std::vector<std::unique_ptr<server::SharedLease>>> held_leases(
    server::WorkerState& worker, const server::SharedBudget& budget, int count) {
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  std::vector<std::unique_ptr<server::SharedLease>> leases;
  for (int i = 0; i < count; ++i) {
    auto answer = co_await worker.admit(budget, no_snapshot, false, "0");
    EXPECT_TRUE(answer && answer->refused == 0 && answer->permit);
    if (answer) leases.push_back(std::move(answer->permit));
  }
  co_return leases;
}

TEST(SharedBatches, AdmitsThatComeDuringACallGoTogetherWithTheAnswersOfSeparateCalls) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto warm = budget_of("warm", 3, 0);
  const auto together = budget_of("together", 3, 4);
  const auto apart = budget_of("apart", 3, 4);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(
      redis, [&](server::WorkerState& worker, net::io_context& context) -> net::awaitable<void> {
        // The script is loaded, and counted from here.
        co_await worker.admit(warm, no_snapshot, false, "0");
        redis.command({"CONFIG", "RESETSTAT"});

        // Eight requests of one budget at once: rpm 3 lets three in (within
        // max_parallel 4), the rest are refused by rpm.
        std::vector<std::optional<server::AdmitAnswer>> batched(8);
        int answered = 0;
        for (std::size_t i = 0; i < batched.size(); ++i) {
          net::co_spawn(
              context,
              [&, i]() -> net::awaitable<void> {
                batched[i] = co_await worker.admit(together, no_snapshot, false, "0");
                ++answered;
              },
              net::detached);
        }
        EXPECT_TRUE(co_await until(context, [&] { return answered == 8; }));
        // The first may go alone; the others come while its call is in flight
        // and go together in the next.
        const long long batched_calls = scripts_run(redis);
        EXPECT_EQ(batched_calls, 2);

        std::vector<std::optional<server::AdmitAnswer>> separate;
        for (int i = 0; i < 8; ++i) {
          separate.push_back(co_await worker.admit(apart, no_snapshot, false, "0"));
        }
        EXPECT_EQ(scripts_run(redis) - batched_calls, 8);

        const long long interval = std::stoll(together.interval_ns);
        for (std::size_t i = 0; i < 8; ++i) {
          if (!batched[i] || !separate[i]) {
            ADD_FAILURE() << "no answer for request " << i;
            continue;
          }
          EXPECT_EQ(batched[i]->refused, i < 3 ? 0 : 2) << i;
          EXPECT_EQ(batched[i]->refused, separate[i]->refused) << i;
          // Each request owes the intervals of those admitted before it, less
          // the moments between the calls.
          const long long admitted_before = std::min<long long>(static_cast<long long>(i), 3);
          EXPECT_LE(batched[i]->rpm_owed_ns, admitted_before * interval) << i;
          EXPECT_GT(batched[i]->rpm_owed_ns, admitted_before * interval - 1'000'000'000) << i;
        }
        // The three admitted hold their permits, counted as one entry of the
        // worker's in Redis.
        EXPECT_EQ(permits_in(redis, together.parallel_key), 3);
        EXPECT_EQ(worker.permits_held(together.parallel_key), 3);
        EXPECT_EQ(redis.command({"HLEN", together.parallel_key}), ":1\r\n");
      });
}

TEST(SharedBatches, SettlementsThatComeDuringACallGoTogetherMovingTheTatInTurn) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto budget = budget_of("settled", 60, 10);
  const auto warm = budget_of("warm", 60, 10);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(
      redis,
      [&](server::WorkerState& worker, net::io_context& context) -> net::awaitable<void> {
        auto leases = co_await held_leases(worker, budget, 4);
        EXPECT_EQ(permits_in(redis, budget.parallel_key), 4);
        // The script is loaded, and counted from here.
        worker.settle(warm, no_snapshot, 0, nullptr);
        worker.settle(warm, no_snapshot, 1, nullptr);
        EXPECT_TRUE(co_await until(context, [&] {
          return redis.command({"GET", warm.tpm_key}) != "$-1\r\n";
        }));
        redis.command({"CONFIG", "RESETSTAT"});
        // The first goes at once; the other three while it is in flight, in
        // one call and in turn: from 1 s owed, a refund of 5 s stops at
        // nothing owed, then 10 s and 3 s are added: 13 s. Summed first,
        // they would make 9 s.
        worker.settle(budget, no_snapshot, 1'000'000'000, leases[0].get());
        worker.settle(budget, no_snapshot, -5'000'000'000, leases[1].get());
        worker.settle(budget, no_snapshot, 10'000'000'000, leases[2].get());
        worker.settle(budget, no_snapshot, 3'000'000'000, leases[3].get());
        for (const auto& lease : leases) EXPECT_FALSE(lease->held());
        EXPECT_TRUE(co_await until(context, [&] {
          return redis.command({"EXISTS", budget.parallel_key}) == ":0\r\n";
        }));
        EXPECT_EQ(scripts_run(redis), 2) << redis.command({"INFO", "commandstats"});
        // The TAT is stored as seconds and nine digits of nanoseconds.
        const std::string stored = redis.command({"GET", budget.tpm_key});
        const std::string now = redis.command({"TIME"});
        std::smatch tat;
        std::smatch clock;
        EXPECT_TRUE(std::regex_search(stored, tat, std::regex(R"(\r\n([0-9]+)([0-9]{9})\r\n)")))
            << stored;
        EXPECT_TRUE(std::regex_search(now, clock, std::regex(R"(\r\n([0-9]+)\r\n)"))) << now;
        if (!tat.empty() && !clock.empty()) {
          const long long ahead_s = std::stoll(tat[1]) - std::stoll(clock[1]);
          EXPECT_GE(ahead_s, 12);
          EXPECT_LE(ahead_s, 13);
        }
      },
      kNoSettlementWait);
}

TEST(SharedBatches, SettlementsWaitingForAnAdmissionCallRideWithTheNextOne) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto budget = budget_of("riding", 60, 10);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(
      redis,
      [&](server::WorkerState& worker, net::io_context& context) -> net::awaitable<void> {
        auto leases = co_await held_leases(worker, budget, 3);
        redis.command({"CONFIG", "RESETSTAT"});
        // An admission goes at once; two settlements and a second admission
        // come while it is in flight. The settlements wait for it and go in
        // the second admission's call, ahead of it: two scripts, not three.
        int answered = 0;
        std::optional<server::AdmitAnswer> first;
        std::optional<server::AdmitAnswer> second;
        net::co_spawn(
            context,
            [&]() -> net::awaitable<void> {
              first = co_await worker.admit(budget, no_snapshot, true, "0");
              ++answered;
            },
            net::detached);
        worker.settle(budget, no_snapshot, 4'000'000'000, leases[0].get());
        worker.settle(budget, no_snapshot, 0, leases[1].get());
        net::co_spawn(
            context,
            [&]() -> net::awaitable<void> {
              second = co_await worker.admit(budget, no_snapshot, true, "0");
              ++answered;
            },
            net::detached);
        EXPECT_TRUE(co_await until(context, [&] { return answered == 2; }));
        EXPECT_EQ(scripts_run(redis), 2) << redis.command({"INFO", "commandstats"});
        if (!first || !second) {
          ADD_FAILURE() << "an admission had no answer";
          co_return;
        }
        EXPECT_EQ(first->refused, 0);
        EXPECT_EQ(second->refused, 0);
        // The first was judged before the refund was owed, the second after.
        EXPECT_EQ(first->tpm_owed_ns, 0);
        EXPECT_GT(second->tpm_owed_ns, 3'000'000'000);
        EXPECT_LE(second->tpm_owed_ns, 4'000'000'000);
        // Two permits given back, two taken: the third held, and the
        // two new ones.
        EXPECT_EQ(permits_in(redis, budget.parallel_key), 3);
        EXPECT_EQ(worker.permits_held(budget.parallel_key), 3);

        // With no admission in flight, a settlement goes on its own at once.
        redis.command({"CONFIG", "RESETSTAT"});
        worker.settle(budget, no_snapshot, 0, leases[2].get());
        EXPECT_TRUE(
            co_await until(context, [&] { return permits_in(redis, budget.parallel_key) == 2; }));
        EXPECT_EQ(scripts_run(redis), 1);
      },
      kNoSettlementWait);
}

// This worker's entry in a permit hash.
std::string holder_of(const server::WorkerState& worker) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(worker.instance()));
  return text;
}

TEST(SharedPermits, APermitNobodyTakesIsGivenBack) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto budget = budget_of("dropped", 600, 2);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(redis,
              [&](server::WorkerState& worker, net::io_context& context) -> net::awaitable<void> {
                {
                  auto answer = co_await worker.admit(budget, no_snapshot, false, "0");
                  EXPECT_TRUE(answer && answer->refused == 0 && answer->permit);
                  EXPECT_EQ(permits_in(redis, budget.parallel_key), 1);
                }
                // The answer is dropped with its permit: the count goes back to none.
                EXPECT_EQ(worker.permits_held(budget.parallel_key), 0);
                EXPECT_TRUE(co_await until(context, [&] {
                  return redis.command({"EXISTS", budget.parallel_key}) == ":0\r\n";
                }));
              });
}

TEST(SharedPermits, EachCallWritesTheWorkersCountAsItStands) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto budget = budget_of("counted", 600, 10);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(
      redis, [&](server::WorkerState& worker, net::io_context& context) -> net::awaitable<void> {
        auto leases = co_await held_leases(worker, budget, 2);
        const std::string holder = holder_of(worker);
        const std::string entry = redis.command({"HGET", budget.parallel_key, holder});
        EXPECT_NE(entry.find("\r\n2 "), std::string::npos) << entry;
        // An entry Redis got wrong (a reply lost while a permit was given
        // back) is put right by the worker's next call, not added to.
        redis.command({"HSET", budget.parallel_key, holder, "9 99999999999999"});
        worker.settle(budget, no_snapshot, 0, leases[0].get());
        EXPECT_FALSE(leases[0]->held());
        EXPECT_TRUE(
            co_await until(context, [&] { return permits_in(redis, budget.parallel_key) == 1; }));
        EXPECT_EQ(worker.permits_held(budget.parallel_key), 1);
      });
}

TEST(SharedPermits, AnExpiredEntryNoLongerCountsAndIsRemoved) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto budget = budget_of("expired", 600, 3);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(redis, [&](server::WorkerState& worker, net::io_context&) -> net::awaitable<void> {
    // Another holder, alive until far ahead, has two of the three permits;
    // a dead one's entry (its expiry long past) claims three more.
    redis.command({"HSET", budget.parallel_key, "alive", "2 99999999999999", "dead", "3 1"});
    auto admitted = co_await worker.admit(budget, no_snapshot, false, "0");
    auto refused = co_await worker.admit(budget, no_snapshot, false, "0");
    EXPECT_TRUE(admitted && admitted->refused == 0);
    EXPECT_TRUE(refused && refused->refused == 1 && !refused->permit);
    EXPECT_EQ(redis.command({"HEXISTS", budget.parallel_key, "dead"}), ":0\r\n");
    EXPECT_EQ(permits_in(redis, budget.parallel_key), 3);
  });
}

// Waits on the loop for `duration`.
net::awaitable<void> pause(net::io_context& context, std::chrono::steady_clock::duration duration) {
  net::steady_timer wait(context, duration);
  co_await wait.async_wait(net::use_awaitable);
}

TEST(SharedSettlements, WhileABudgetIsAdmittingTheyWaitForItsNextAdmissionCall) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto budget = budget_of("admitting", 600, 10);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(
      redis,
      [&](server::WorkerState& worker, net::io_context& context) -> net::awaitable<void> {
        auto leases = co_await held_leases(worker, budget, 1);
        redis.command({"CONFIG", "RESETSTAT"});
        // One permit of ten in use: giving it back may wait, as may a refund.
        worker.settle(budget, no_snapshot, 2'000'000'000, leases[0].get());
        co_await pause(context, 50ms);
        EXPECT_EQ(scripts_run(redis), 0);
        EXPECT_EQ(permits_in(redis, budget.parallel_key), 1);
        auto next = co_await worker.admit(budget, no_snapshot, true, "0");
        // One call for both, the settlement ahead of the admission.
        EXPECT_EQ(scripts_run(redis), 1) << redis.command({"INFO", "commandstats"});
        EXPECT_TRUE(next && next->refused == 0);
        if (next) {
          EXPECT_GT(next->tpm_owed_ns, 1'000'000'000);
        }
        EXPECT_EQ(permits_in(redis, budget.parallel_key), 1);
      },
      10s);
}

TEST(SharedSettlements, ThoseNoAdmissionCallTakesGoAfterTheWait) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto budget = budget_of("waited", 600, 10);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(
      redis,
      [&](server::WorkerState& worker, net::io_context& context) -> net::awaitable<void> {
        auto leases = co_await held_leases(worker, budget, 2);
        worker.settle(budget, no_snapshot, 0, leases[0].get());
        const auto given_back = std::chrono::steady_clock::now();
        co_await pause(context, 100ms);
        EXPECT_EQ(permits_in(redis, budget.parallel_key), 2);
        EXPECT_TRUE(
            co_await until(context, [&] { return permits_in(redis, budget.parallel_key) == 1; }));
        EXPECT_GE(std::chrono::steady_clock::now() - given_back, 1s);
      },
      1s);
}

TEST(SharedSettlements, APermitGivenBackNearTheLimitOrWhenQuietGoesAtOnce) {
  if (!redis_server_binary()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  const auto narrow = budget_of("narrow", 600, 3);
  const auto quiet = budget_of("quiet", 600, 10);
  const std::shared_ptr<const server::Snapshot> no_snapshot;
  with_worker(
      redis,
      [&](server::WorkerState& worker, net::io_context& context) -> net::awaitable<void> {
        // Two of three in use: more than half, so the permit goes at once
        // though the budget is admitting.
        // Waiting would take the second of settlement_wait.
        auto narrow_leases = co_await held_leases(worker, narrow, 2);
        auto given_back = std::chrono::steady_clock::now();
        worker.settle(narrow, no_snapshot, 0, narrow_leases[0].get());
        EXPECT_TRUE(
            co_await until(context, [&] { return permits_in(redis, narrow.parallel_key) == 1; }));
        EXPECT_LT(std::chrono::steady_clock::now() - given_back, 500ms);
        // A budget whose last admission call is older than the wait is
        // quiet: its permit goes at once too.
        auto quiet_leases = co_await held_leases(worker, quiet, 1);
        co_await pause(context, 1100ms);
        given_back = std::chrono::steady_clock::now();
        worker.settle(quiet, no_snapshot, 0, quiet_leases[0].get());
        EXPECT_TRUE(co_await until(context, [&] {
          return redis.command({"EXISTS", quiet.parallel_key}) == ":0\r\n";
        }));
        EXPECT_LT(std::chrono::steady_clock::now() - given_back, 500ms);
      },
      1s);
}

}  // namespace
}  // namespace sluice::testing

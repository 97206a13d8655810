// A bounded soak: thousands of streams through the gateway to three mock
// deployments, in waves of many concurrent connections, while clients leave
// at random points and upstreams fail before and after their first byte.
// Afterwards no descriptor or pool slot may be left, every stream that ran to
// its end must be intact, and every stream an upstream cut must say so.
//
// Which streams leave early or are cut on purpose comes from a seeded RNG
// (SLUICE_SOAK_SEED overrides the seed), so a failing run can be replayed;
// the flaky deployments' own failures follow the mock's seeded sequence in
// the order requests reach it.
#include <gtest/gtest.h>

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/leak_check.hpp"

namespace sluice::testing {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr unsigned kTokens = 20;
constexpr std::size_t kEventsPerStream = kTokens + 2;  // tokens, finish chunk, [DONE]
constexpr std::size_t kWaves = 3;
constexpr std::size_t kStreamsPerWave = 2000;
constexpr unsigned kClientThreads = 2;
// Each concurrent stream holds four descriptors in this process: the
// client's socket, the gateway's two and the mock's.
constexpr std::size_t kDescriptorsPerStream = 4;

enum class Plan { whole, leave, cut };

struct StreamPlan {
  Plan plan = Plan::whole;
  int leave_after_events = 0;  // -1: right after sending the request
  std::string cut_mode;        // the failure the upstream is told to play
};

struct StreamResult {
  bool finished = false;  // the response was read to its end
  bool left = false;      // the client closed early, as planned
  std::string error;
  unsigned status = 0;
  std::string deployment;
  std::string body;
};

std::uint64_t soak_seed() {
  const char* given = std::getenv("SLUICE_SOAK_SEED");
  return given ? std::strtoull(given, nullptr, 0) : 0x50a4'2024ULL;
}

std::string request_for(std::uint16_t port, const StreamPlan& plan) {
  const std::string body = chat_body("chat", true);
  std::string request =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n";
  if (plan.plan == Plan::cut) {
    // Mock headers travel upstream untouched, so one request can script
    // its own failure on whichever deployment serves it.
    request += "x-mock-fail: " + plan.cut_mode + "\r\nx-mock-fail-rate: 1\r\n";
    if (plan.cut_mode == "stall-mid") request += "x-mock-stall-ms: 10000\r\n";
  }
  return request + "\r\n" + body;
}

std::size_t count_events(std::string_view body) {
  std::size_t events = 0;
  for (auto at = body.find("\n\n"); at != std::string_view::npos; at = body.find("\n\n", at + 2)) {
    ++events;
  }
  return events;
}

net::awaitable<void> run_stream(std::uint16_t port, StreamPlan plan, StreamResult& result) {
  auto executor = co_await net::this_coro::executor;
  beast::tcp_stream stream(executor);
  stream.expires_after(30s);  // a stream that hangs fails the test, never the run
  const std::string request = request_for(port, plan);
  auto [connect_ec] = co_await stream.async_connect(
      net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), port),
      net::as_tuple(net::use_awaitable));
  if (connect_ec) {
    result.error = "connect: " + connect_ec.message();
    co_return;
  }
  auto [write_ec, written] =
      co_await net::async_write(stream, net::buffer(request), net::as_tuple(net::use_awaitable));
  if (write_ec) {
    result.error = "send: " + write_ec.message();
    co_return;
  }
  if (plan.plan == Plan::leave && plan.leave_after_events < 0) {
    result.left = true;
    co_return;  // closes the socket before the response head
  }

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  auto [head_ec, head_bytes] =
      co_await http::async_read_header(stream, buffer, parser, net::as_tuple(net::use_awaitable));
  if (head_ec) {
    result.error = "read head: " + head_ec.message();
    co_return;
  }
  result.status = parser.get().result_int();
  auto deployment = parser.get()["x-sluice-deployment"];
  result.deployment.assign(deployment.data(), deployment.size());

  std::array<char, 8192> piece;
  std::size_t events = 0;
  while (!parser.is_done()) {
    if (plan.plan == Plan::leave && events >= static_cast<std::size_t>(plan.leave_after_events)) {
      result.left = true;
      co_return;
    }
    parser.get().body().data = piece.data();
    parser.get().body().size = piece.size();
    auto [read_ec, read_bytes] =
        co_await http::async_read_some(stream, buffer, parser, net::as_tuple(net::use_awaitable));
    if (read_ec == http::error::need_buffer) read_ec = {};
    if (read_ec) {
      result.error = "read body: " + read_ec.message();
      co_return;
    }
    const std::size_t produced = piece.size() - parser.get().body().size;
    // An event's "\n\n" may straddle two reads: rescan the last byte.
    const std::size_t rescan_from = result.body.empty() ? 0 : result.body.size() - 1;
    result.body.append(piece.data(), produced);
    events = count_events(std::string_view(result.body).substr(rescan_from)) + events;
  }
  result.finished = true;
}

// Runs one wave: every stream at once, spread over the client threads.
void run_wave(std::uint16_t port, const std::vector<StreamPlan>& plans,
              std::vector<StreamResult>& results, std::size_t first) {
  std::vector<std::unique_ptr<net::io_context>> contexts;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kClientThreads; ++t) {
    contexts.push_back(std::make_unique<net::io_context>(1));
  }
  for (std::size_t i = first; i < results.size() && i < first + plans.size(); ++i) {
    auto& context = *contexts[i % kClientThreads];
    net::co_spawn(context, run_stream(port, plans[i - first], results[i]), net::detached);
  }
  for (auto& context : contexts) threads.emplace_back([&context] { context->run(); });
  for (auto& thread : threads) thread.join();
}

std::string expected_text() {
  std::string text;
  for (unsigned i = 0; i < kTokens; ++i) text += "tok" + std::to_string(i) + " ";
  return text;
}

// Every event, the text token by token, and [DONE] last.
bool intact(const std::vector<std::string>& events) {
  if (events.size() != kEventsPerStream || events.back() != "[DONE]") return false;
  std::string text;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto chunk = json::parse(events[i], nullptr, false);
    if (!chunk.is_object()) return false;
    const auto& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  return text == expected_text();
}

// Ended by the gateway's error event, and nothing that looks like success.
bool ended_by_error_event(const std::vector<std::string>& events) {
  if (events.empty()) return false;
  for (const auto& event : events) {
    if (event == "[DONE]") return false;
  }
  auto last = json::parse(events.back(), nullptr, false);
  return last.is_object() && last.contains("error") && last["error"]["code"].is_string();
}

TEST(Soak, ThousandsOfStreamsWithFaultsLeaveNothingBehind) {
  const std::size_t descriptor_limit = raise_descriptor_limit();
  const auto seed = soak_seed();
  std::mt19937_64 rng(seed);

  mock::Behaviour steady;
  steady.tokens = kTokens;
  steady.interval = 2ms;
  mock::Behaviour cuts_some = steady;  // resets a tenth of its streams halfway
  cuts_some.fail = "reset-mid";
  cuts_some.fail_rate = 0.1;
  mock::Behaviour refuses_some = steady;  // resets a fifth before the first byte
  refuses_some.fail = "reset";
  refuses_some.fail_rate = 0.2;
  auto steady_upstream = start_mock(steady);
  auto cutting_upstream = start_mock(cuts_some);
  auto refusing_upstream = start_mock(refuses_some);
  // Cooldown would take the flaky deployments out after a few failures and
  // the soak would stop exercising them.
  const std::string timeouts =
      kNoWarmConnections + "        timeouts: {connect: 2s, ttft: 5s, idle: 2s}\n";
  TestGateway gateway(
      "server:\n  listen: 127.0.0.1:0\n  threads: 2\n"
      "router:\n  retries: 2\n  backoff: {base: 1ms, max: 5ms}\n"
      "  cooldown: {fails: 1000000, within: 1s, for: 1ms}\n"
      "models:\n  - name: chat\n    strategy: round_robin\n    deployments:\n" +
      deployment_yaml("steady", steady_upstream->base_url(), timeouts) +
      deployment_yaml("cuts_some", cutting_upstream->base_url(), timeouts) +
      deployment_yaml("refuses_some", refusing_upstream->base_url(), timeouts));
  LeakCheck leaks(gateway);
  const std::size_t baseline = open_descriptors();
  ASSERT_GT(descriptor_limit, baseline + 256) << "descriptor limit " << descriptor_limit;
  const std::size_t per_wave =
      std::min(kStreamsPerWave, (descriptor_limit - baseline - 256) / kDescriptorsPerStream);
  ASSERT_GE(per_wave, 100u) << "descriptor limit " << descriptor_limit << " is too low to soak";

  std::vector<StreamPlan> plans(kWaves * per_wave);
  std::uniform_real_distribution<double> roll(0.0, 1.0);
  std::uniform_int_distribution<int> leave_point(-1, static_cast<int>(kEventsPerStream) - 2);
  const std::array<std::string, 3> cut_modes = {"reset-mid", "truncate", "stall-mid"};
  for (auto& plan : plans) {
    auto dice = roll(rng);
    if (dice < 0.15) {
      plan.plan = Plan::leave;
      plan.leave_after_events = leave_point(rng);
    } else if (dice < 0.20) {
      plan.plan = Plan::cut;
      plan.cut_mode = cut_modes[rng() % cut_modes.size()];
    }
  }

  std::vector<StreamResult> results(plans.size());
  const auto started = Clock::now();
  for (std::size_t wave = 0; wave < kWaves; ++wave) {
    std::vector<StreamPlan> wave_plans(plans.begin() + wave * per_wave,
                                       plans.begin() + (wave + 1) * per_wave);
    run_wave(gateway.port(), wave_plans, results, wave * per_wave);
  }
  const auto elapsed = Clock::now() - started;

  std::map<std::string, std::size_t> tally;
  std::vector<std::string> violations;
  auto violation = [&](std::size_t i, const std::string& what) {
    if (violations.size() < 20) {
      violations.push_back(
          "stream " + std::to_string(i) + " (" + results[i].deployment + "): " + what +
          "; body tail: " +
          results[i].body.substr(results[i].body.size() > 300 ? results[i].body.size() - 300 : 0));
    }
  };
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const auto& plan = plans[i];
    const auto& result = results[i];
    if (!result.error.empty()) {
      violation(i, result.error);
      continue;
    }
    if (plan.plan == Plan::leave) {
      ++tally["left early"];
      if (result.status != 0 && result.status != 200)
        violation(i, "status " + std::to_string(result.status));
      continue;
    }
    if (result.status != 200) {
      violation(i, "status " + std::to_string(result.status));
      continue;
    }
    if (!result.finished) {
      violation(i, "did not finish");
      continue;
    }
    auto events = sse_data(result.body);
    if (plan.plan == Plan::cut) {
      if (ended_by_error_event(events)) {
        ++tally["cut on purpose, error event"];
      } else {
        violation(i, plan.cut_mode + " did not end with an error event");
      }
    } else if (intact(events)) {
      ++tally["whole"];
    } else if (result.deployment == "cuts_some" && ended_by_error_event(events)) {
      ++tally["cut by the flaky deployment, error event"];
    } else {
      violation(i, "not intact");
    }
  }

  std::string summary =
      "seed " + std::to_string(seed) + ", " + std::to_string(plans.size()) + " streams in " +
      std::to_string(kWaves) + " waves of " + std::to_string(per_wave) + ", " +
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count()) +
      " ms:";
  for (const auto& [what, count] : tally) summary += " " + what + " " + std::to_string(count) + ";";
  std::cout << summary << "\n";
  for (const auto& line : violations) ADD_FAILURE() << line;
  EXPECT_TRUE(violations.empty()) << summary;
  // Every path was taken.
  EXPECT_GT(tally["whole"], plans.size() / 2) << summary;
  EXPECT_GT(tally["left early"], 0u) << summary;
  EXPECT_GT(tally["cut on purpose, error event"], 0u) << summary;
  EXPECT_GT(tally["cut by the flaky deployment, error event"], 0u) << summary;

  EXPECT_TRUE(leaks.settled(15s));
  // The same gauge as operators see it.
  auto metrics = http_request(gateway.gateway().admin_port(), "GET", "/metrics");
  EXPECT_NE(metrics.body.find("\nsluice_upstream_connections{state=\"active\"} 0\n"),
            std::string::npos);
  for (auto* upstream : {steady_upstream.get(), cutting_upstream.get(), refusing_upstream.get()}) {
    EXPECT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }, 5s));
  }
}

}  // namespace
}  // namespace sluice::testing

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "load_runner.hpp"
#include "mock/mock_server.hpp"
#include "options.hpp"

namespace sluice::bench {
namespace {

using namespace std::chrono_literals;
using mock::Behaviour;
using mock::MockServer;

std::unique_ptr<MockServer> start_mock(const Behaviour& behaviour) {
  MockServer::Options options;
  options.behaviour = behaviour;
  auto server = std::make_unique<MockServer>(std::move(options));
  server->start();
  return server;
}

HttpUrl chat_url(const MockServer& mock) {
  std::string why;
  auto url = parse_http_url(mock.base_url() + "/chat/completions", why);
  EXPECT_TRUE(url) << why;
  return url.value_or(HttpUrl{});
}

RunResult run(const MockServer& mock, LoadOptions options) {
  options.model = "bench-model";
  validate(options);
  const HttpUrl url = chat_url(mock);
  return run_load(url, options, build_request(url, options));
}

LoadOptions two_streams() {
  LoadOptions options;
  options.stream = true;
  options.concurrency = 1;
  options.requests = 2;
  options.warmup = 0s;
  options.timeout = 10s;
  return options;
}

TEST(LoadRunner, StampedEventsGiveADelayEachAndAStretchPerGap) {
  Behaviour behaviour;
  behaviour.tokens = 3;
  behaviour.interval = 10ms;
  auto mock = start_mock(behaviour);

  LoadOptions options = two_streams();
  options.headers.push_back("x-mock-stamp: 1");
  const RunResult stamped = run(*mock, options);
  EXPECT_EQ(stamped.ok, 2u);
  EXPECT_EQ(stamped.error_count(), 0u);
  // Per stream: 3 tokens and the finish chunk are stamped, [DONE] is not.
  EXPECT_EQ(stamped.gap.count(), 8u);
  EXPECT_EQ(stamped.delay.count(), 8u);
  EXPECT_EQ(stamped.stretch.count(), 6u);
  // The mock's write to the arrival here: more than nothing, far less than
  // the 10 ms between events.
  EXPECT_GT(stamped.delay.min(), 0u);
  EXPECT_LT(stamped.delay.percentile(0.5), 10'000'000u);

  const RunResult plain = run(*mock, two_streams());
  EXPECT_EQ(plain.ok, 2u);
  EXPECT_EQ(plain.gap.count(), 8u);
  EXPECT_EQ(plain.delay.count(), 0u);
  EXPECT_EQ(plain.stretch.count(), 0u);
}

// How many connections the mock has accepted 150 ms into a closed-loop run
// of 4 connections, and the run's result.
std::pair<std::uint64_t, RunResult> accepted_early(Clock::duration ramp) {
  Behaviour behaviour;
  behaviour.ttft = 50ms;  // keeps the closed loop from spinning
  auto mock = start_mock(behaviour);
  LoadOptions options;
  options.concurrency = 4;
  options.ramp = ramp;
  options.warmup = 0s;
  options.duration = ramp > Clock::duration::zero() ? 2500ms : 500ms;
  RunResult result;
  std::thread load([&] { result = run(*mock, options); });
  std::this_thread::sleep_for(150ms);
  const std::uint64_t early = mock->stats().connections_accepted;
  load.join();
  EXPECT_EQ(mock->stats().connections_accepted, 4u);
  return {early, std::move(result)};
}

TEST(LoadRunner, RampStartsClosedLoopConnectionsEvenlyOverItsDuration) {
  // Connections start 0, 0.5, 1 and 1.5 s in: at 150 ms only the first.
  auto [ramped_early, ramped] = accepted_early(2s);
  EXPECT_LE(ramped_early, 2u);
  EXPECT_GT(ramped.ok, 0u);
  EXPECT_EQ(ramped.error_count(), 0u);

  auto [together_early, together] = accepted_early(Clock::duration::zero());
  EXPECT_EQ(together_early, 4u);
  EXPECT_GT(together.ok, 0u);
}

// Answers come back at once, yet a ramped connection sends one request per
// ramp, in its own slot: left to the closed loop, two connections would send
// thousands in the same second.
TEST(LoadRunner, RampedConnectionsKeepToTheirSlots) {
  auto mock = start_mock(Behaviour{});
  LoadOptions options;
  options.concurrency = 2;
  options.ramp = 100ms;
  options.warmup = 0s;
  options.duration = 1s;
  const RunResult slotted = run(*mock, options);
  EXPECT_EQ(slotted.error_count(), 0u);
  // Slots at 0, 100 ... 900 ms and 50, 150 ... 950 ms: 20 requests.
  EXPECT_GE(slotted.ok, 10u);
  EXPECT_LE(slotted.ok, 22u);
}

// Error answers come back at once; a connection told to back off after one
// sends far fewer in the same time.
TEST(LoadRunner, PauseAfterErrorSpacesAClosedLoopsRetries) {
  Behaviour behaviour;
  behaviour.fail = "503";
  behaviour.fail_rate = 1.0;
  auto mock = start_mock(behaviour);
  LoadOptions options;
  options.concurrency = 1;
  options.warmup = 0s;
  options.duration = 500ms;
  const RunResult hammering = run(*mock, options);
  options.pause_after_error = 100ms;
  const RunResult backing_off = run(*mock, options);
  EXPECT_EQ(hammering.ok, 0u);
  EXPECT_GT(hammering.error_count(), 20u);
  EXPECT_GE(backing_off.error_count(), 3u);
  EXPECT_LE(backing_off.error_count(), 6u);
}

TEST(LoadRunner, PauseAfterErrorIsForTheClosedLoopOnly) {
  LoadOptions options;
  options.model = "m";
  options.rate = 100;
  options.pause_after_error = 1s;
  EXPECT_THROW(validate(options), UsageError);
}

TEST(LoadRunner, RampIsForTheClosedLoopOnly) {
  LoadOptions options;
  options.model = "m";
  options.rate = 100;
  options.ramp = 1s;
  EXPECT_THROW(validate(options), UsageError);
}

}  // namespace
}  // namespace sluice::bench

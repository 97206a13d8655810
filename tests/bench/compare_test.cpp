#include "compare.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "mock/mock_server.hpp"
#include "process_pause.hpp"

namespace sluice::bench {
namespace {

using namespace std::chrono_literals;
using mock::Behaviour;
using mock::MockServer;

std::unique_ptr<MockServer> start_mock(std::chrono::milliseconds ttft) {
  MockServer::Options options;
  options.behaviour.ttft = ttft;
  options.behaviour.tokens = 2;
  auto server = std::make_unique<MockServer>(std::move(options));
  server->start();
  return server;
}

struct CompareRun {
  std::string table;
  nlohmann::json document;
};

// Runs `sluice-bench compare` in-process and returns what it printed and the
// JSON it wrote.
CompareRun run_compare_with(std::vector<std::string> arguments, const std::string& name) {
  const std::string json_path = testing::TempDir() + "/compare_" + name + ".json";
  arguments.insert(arguments.begin(), {"sluice-bench", "compare"});
  arguments.insert(arguments.end(), {"--json", json_path});
  std::vector<char*> argv;
  for (auto& argument : arguments) argv.push_back(argument.data());

  std::ostringstream printed;
  auto* previous = std::cout.rdbuf(printed.rdbuf());
  const int status = run_compare(static_cast<int>(argv.size()), argv.data(), 2);
  std::cout.rdbuf(previous);
  EXPECT_EQ(status, 0);

  CompareRun run;
  run.table = printed.str();
  std::ifstream file(json_path);
  run.document = nlohmann::json::parse(file);
  return run;
}

std::vector<std::string> three_targets(const MockServer& direct, const MockServer& slow,
                                       const MockServer& slower, const std::string& rounds) {
  return {"--target",    "direct=" + direct.base_url() + "/chat/completions",
          "--target",    "slow=" + slow.base_url() + "/chat/completions",
          "--target",    "slower=" + slower.base_url() + "/chat/completions",
          "--reference", "slow",
          "--rounds",    rounds,
          "--model",     "bench-model",
          "--stream",    "--concurrency",
          "1",           "--requests",
          "6",           "--warmup",
          "0s",          "--timeout",
          "10s"};
}

const nlohmann::json& target_named(const nlohmann::json& document, const std::string& name) {
  for (const auto& target : document["targets"]) {
    if (target["name"] == name) return target;
  }
  ADD_FAILURE() << "no target " << name;
  return document;
}

TEST(Compare, PoolsEveryRoundsSamplesForTheTails) {
  auto direct = start_mock(0ms);
  auto slow = start_mock(5ms);
  auto slower = start_mock(10ms);
  const CompareRun run = run_compare_with(three_targets(*direct, *slow, *slower, "3"), "pooled");

  EXPECT_NE(run.table.find("| TTFT p99, rounds pooled (µs) |"), std::string::npos) << run.table;
  // Unstamped streams have no event delays, so no row pools them.
  EXPECT_EQ(run.table.find("event delay p99, rounds pooled"), std::string::npos) << run.table;

  const auto& document = run.document;
  for (const std::string name : {"direct", "slow", "slower"}) {
    const auto& target = target_named(document, name);
    // The pooled P99 lies among the rounds' own: were it above every
    // round's, each round would have fewer than 1% of its samples above it,
    // and so would the pool; likewise below.
    double lowest = INFINITY;
    double highest = 0;
    ASSERT_EQ(target["rounds"].size(), 3u);
    for (const auto& round : target["rounds"]) {
      const double p99 = round["ttft_us"]["p99"].get<double>();
      lowest = std::min(lowest, p99);
      highest = std::max(highest, p99);
    }
    const double pooled = document["pooled"][name]["ttft_p99_us"].get<double>();
    EXPECT_GE(pooled, lowest) << name;
    EXPECT_LE(pooled, highest) << name;
    EXPECT_EQ(target["all_rounds"]["ttft_us"]["p99"].get<double>(), pooled) << name;
  }

  const double direct_p99 = document["pooled"]["direct"]["ttft_p99_us"].get<double>();
  const double slow_added = document["pooled_added"]["slow"]["ttft_p99_us"].get<double>();
  const double slower_added = document["pooled_added"]["slower"]["ttft_p99_us"].get<double>();
  EXPECT_DOUBLE_EQ(slow_added,
                   document["pooled"]["slow"]["ttft_p99_us"].get<double>() - direct_p99);
  // The mocks wait 5 and 10 ms before the first event, so no sample comes
  // sooner. (The added figures depend on direct's tail too, which one stall
  // of a loaded machine can put at milliseconds.)
  EXPECT_GE(document["pooled"]["slow"]["ttft_p99_us"].get<double>(), 5'000);
  EXPECT_GE(document["pooled"]["slower"]["ttft_p99_us"].get<double>(), 10'000);
  ASSERT_EQ(document["ratios_of_added"].size(), 1u);
  const auto& ratio = document["ratios_of_added"][0];
  EXPECT_EQ(ratio["numerator"], "slower");
  EXPECT_EQ(ratio["denominator"], "slow");
  // A ratio of added costs exists only when both are above zero: a stall
  // that puts direct's pooled tail above slow's leaves it out.
  const auto& values = ratio.at("values");
  if (slow_added > 0 && slower_added > 0) {
    EXPECT_DOUBLE_EQ(values.at("pooled_ttft_p99_us").get<double>(), slower_added / slow_added);
  } else {
    EXPECT_FALSE(values.contains("pooled_ttft_p99_us")) << values.dump();
  }
}

// A target's processes are charged with their CPU time and with how often
// their threads slept. Here the test's own process is charged for "slow":
// its load generator's thread has nothing to do while each request waits
// out the mock's 2 ms, so it sleeps at least once per request.
TEST(Compare, CountsTheSleepsOfATargetsProcesses) {
  auto direct = start_mock(0ms);
  auto slow = start_mock(2ms);
  auto slower = start_mock(4ms);
  auto arguments = three_targets(*direct, *slow, *slower, "1");
  arguments.insert(arguments.end(), {"--cpu-pid", "slow=" + std::to_string(getpid())});
  const CompareRun run = run_compare_with(arguments, "sleeps");

  EXPECT_NE(run.table.find("| sleeps/req |"), std::string::npos) << run.table;
  const auto& charged = target_named(run.document, "slow")["rounds"][0];
  ASSERT_TRUE(charged.contains("sleeps_per_request")) << charged.dump();
  EXPECT_GE(charged["sleeps_per_request"].get<double>(), 1.0);
  EXPECT_TRUE(charged.contains("cpu_us_per_request")) << charged.dump();
  // No process is charged for the others.
  const auto& uncharged = target_named(run.document, "slower")["rounds"][0];
  EXPECT_FALSE(uncharged.contains("sleeps_per_request")) << uncharged.dump();
}

// A child process that keeps one core busy until it is destroyed (or for
// at most 20 s): making system calls that do nothing, so that most of its
// time is the kernel's, or adding in user space.
class BusyChild {
 public:
  enum class Where { kernel, user };
  explicit BusyChild(Where where) : pid_(fork()) {
    if (pid_ != 0) return;
    const auto until = std::chrono::steady_clock::now() + 20s;
    volatile unsigned long sum = 0;
    while (std::chrono::steady_clock::now() < until) {
      for (unsigned i = 0; i < 1000; ++i) {
        if (where == Where::kernel) {
          syscall(SYS_getppid);
        } else {
          sum = sum + i * i;
        }
      }
    }
    _exit(0);
  }
  BusyChild(const BusyChild&) = delete;
  BusyChild& operator=(const BusyChild&) = delete;
  ~BusyChild() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// The kernel's part of a target's CPU time is told apart from the user
// part: "slow" is charged with a process that only makes system calls,
// "slower" with one that only computes.
TEST(Compare, ChargesTheKernelsPartOfTheCpuTimeApart) {
  auto direct = start_mock(0ms);
  auto slow = start_mock(2ms);
  auto slower = start_mock(4ms);
  BusyChild calling(BusyChild::Where::kernel);
  BusyChild computing(BusyChild::Where::user);
  ASSERT_GT(calling.pid(), 0);
  ASSERT_GT(computing.pid(), 0);
  const std::vector<std::string> arguments = {
      "--target",   "direct=" + direct->base_url() + "/chat/completions",
      "--target",   "slow=" + slow->base_url() + "/chat/completions",
      "--target",   "slower=" + slower->base_url() + "/chat/completions",
      "--cpu-pid",  "slow=" + std::to_string(calling.pid()),
      "--cpu-pid",  "slower=" + std::to_string(computing.pid()),
      "--rounds",   "1",
      "--model",    "bench-model",
      "--duration", "500ms",
      "--warmup",   "0s",
      "--timeout",  "10s"};
  const CompareRun run = run_compare_with(arguments, "kernel");

  EXPECT_NE(run.table.find("| kernel µs/req |"), std::string::npos) << run.table;
  const auto& calls = target_named(run.document, "slow")["rounds"][0];
  const auto& sums = target_named(run.document, "slower")["rounds"][0];
  ASSERT_TRUE(calls.contains("kernel_us_per_request")) << calls.dump();
  ASSERT_TRUE(sums.contains("kernel_us_per_request")) << sums.dump();
  const double calls_cpu = calls["cpu_us_per_request"].get<double>();
  const double sums_cpu = sums["cpu_us_per_request"].get<double>();
  ASSERT_GT(calls_cpu, 0.0) << calls.dump();
  ASSERT_GT(sums_cpu, 0.0) << sums.dump();
  // Most of a system call's time is the kernel's; what is left is entering
  // and leaving it, which the clock ticks partly find in user mode.
  EXPECT_GE(calls["kernel_us_per_request"].get<double>(), calls_cpu / 3) << calls.dump();
  EXPECT_LE(sums["kernel_us_per_request"].get<double>(), sums_cpu / 10) << sums.dump();
  EXPECT_FALSE(target_named(run.document, "direct")["rounds"][0].contains("kernel_us_per_request"));
}

TEST(Compare, OneRoundPrintsNoPooledRows) {
  auto direct = start_mock(0ms);
  auto slow = start_mock(2ms);
  auto slower = start_mock(4ms);
  const CompareRun run = run_compare_with(three_targets(*direct, *slow, *slower, "1"), "one");

  EXPECT_NE(run.table.find("| TTFT p99 (µs) |"), std::string::npos) << run.table;
  EXPECT_EQ(run.table.find("rounds pooled"), std::string::npos) << run.table;
  // The JSON still carries the pooled figures, equal to the one round's.
  for (const std::string name : {"direct", "slow", "slower"}) {
    const auto& target = target_named(run.document, name);
    EXPECT_EQ(run.document["pooled"][name]["ttft_p99_us"].get<double>(),
              target["rounds"][0]["ttft_us"]["p99"].get<double>())
        << name;
  }
}

// A target whose listener never accepts, with a queue of one: every connect
// after the first is dropped by the kernel, and the table says how many
// were, so that a tail of one-second retransmissions is not taken for the
// path's own latency. Other tests' drops on the machine only add to it.
TEST(Compare, CountsTheConnectsDroppedOnAFullListenQueue) {
  auto direct = start_mock(0ms);
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor never_accepting(io);
  never_accepting.open(boost::asio::ip::tcp::v4());
  never_accepting.bind({boost::asio::ip::make_address("127.0.0.1"), 0});
  never_accepting.listen(0);
  const std::string full_url =
      "http://127.0.0.1:" + std::to_string(never_accepting.local_endpoint().port()) +
      "/v1/chat/completions";
  const std::vector<std::string> arguments = {
      "--target",      "direct=" + direct->base_url() + "/chat/completions",
      "--target",      "full=" + full_url,
      "--rounds",      "1",
      "--model",       "bench-model",
      "--concurrency", "4",
      "--duration",    "300ms",
      "--warmup",      "0s",
      "--timeout",     "500ms"};
  const CompareRun run = run_compare_with(arguments, "drops");

  EXPECT_NE(run.table.find("| connects dropped, listen queue full (all rounds) |"),
            std::string::npos)
      << run.table;
  const auto& full = target_named(run.document, "full")["rounds"][0];
  ASSERT_TRUE(full.contains("listen_drops")) << full.dump();
  // Three of the four connections found the queue full.
  EXPECT_GE(full["listen_drops"].get<std::uint64_t>(), 3u) << full.dump();
}

// With --stall-probe, a stall in a request's wait for its first byte sets
// the request apart: here the whole process, load generator and upstream
// alike, is stopped for 30 ms while the first target's streams wait for
// theirs (40 ms each).
TEST(Compare, SetsApartTheRequestsACpuStallTouched) {
  auto direct = start_mock(40ms);
  auto other = start_mock(40ms);
  const std::vector<std::string> arguments = {
      "--target",      "direct=" + direct->base_url() + "/chat/completions",
      "--target",      "other=" + other->base_url() + "/chat/completions",
      "--rounds",      "1",
      "--model",       "bench-model",
      "--concurrency", "2",
      "--requests",    "6",
      "--warmup",      "0s",
      "--timeout",     "10s",
      "--header",      "x-mock-stamp: 1",
      "--stream",      "--stall-probe"};
  const pid_t child = pause_this_process(20ms, 30ms);
  ASSERT_GE(child, 0);
  const CompareRun run = run_compare_with(arguments, "stalls");
  waitpid(child, nullptr, 0);

  EXPECT_NE(run.table.find("| TTFT p99, no CPU stall in it (µs) |"), std::string::npos)
      << run.table;
  EXPECT_NE(run.table.find("| CPU stalls (all rounds) |"), std::string::npos) << run.table;
  const auto& stalled = target_named(run.document, "direct")["rounds"][0];
  ASSERT_TRUE(stalled.contains("cpu_stalls")) << stalled.dump();
  EXPECT_GE(stalled["cpu_stalls"].get<std::uint64_t>(), 1u) << stalled.dump();
  const auto touched = stalled["ttft_touched"].get<std::uint64_t>();
  EXPECT_GE(touched, 1u) << stalled.dump();
  EXPECT_EQ(touched + stalled["ttft_untouched_us"]["count"].get<std::uint64_t>(),
            stalled["ok"].get<std::uint64_t>())
      << stalled.dump();
  // The stamped events' gaps are sorted the same way, each to one side.
  EXPECT_NE(run.table.find("| gap stretch p99, no CPU stall in it (µs) |"), std::string::npos)
      << run.table;
  const auto stretches = stalled["stretch_us"]["count"].get<std::uint64_t>();
  EXPECT_GE(stretches, 1u) << stalled.dump();
  EXPECT_EQ(stalled["stretch_touched"].get<std::uint64_t>() +
                stalled["stretch_untouched_us"]["count"].get<std::uint64_t>(),
            stretches)
      << stalled.dump();
}

// Without the probe, none of its rows or figures.
TEST(Compare, PrintsNoStallRowsWithoutTheProbe) {
  auto direct = start_mock(0ms);
  auto slow = start_mock(2ms);
  auto slower = start_mock(4ms);
  const CompareRun run = run_compare_with(three_targets(*direct, *slow, *slower, "1"), "noprobe");
  EXPECT_EQ(run.table.find("CPU stall"), std::string::npos) << run.table;
  EXPECT_FALSE(target_named(run.document, "slow")["rounds"][0].contains("cpu_stalls"));
}

}  // namespace
}  // namespace sluice::bench

// The sluice executable as operators run it: what it writes to its logs, and
// how it answers SIGHUP and SIGTERM.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <future>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/child_process.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kListeningPrefix = "sluice listening on http://";

// Whether `binary` allocates with mimalloc, as its --version says;
// `version` is what it said.
bool runs_on_mimalloc(const std::string& binary, std::string& version) {
  ChildProcess child(binary, {"--version"});
  EXPECT_EQ(child.wait_exit(10s), 0);
  version = child.standard_output();
  return version.find("allocator: mimalloc") != std::string::npos;
}

// Every test runs the built executable, and is skipped without it.
class SluiceBinary : public ::testing::Test {
 protected:
  void SetUp() override {
    binary = built_binary("SLUICE_BINARY", "src/sluice").value_or("");
    if (binary.empty()) GTEST_SKIP() << "sluice binary not found; set SLUICE_BINARY";
  }

  // The memory tests drive a burst with sluice-bench and test mimalloc's
  // rules for keeping and giving back pages: sanitizer builds run on an
  // allocator of their own, which keeps freed memory in quarantine on
  // purpose. Empty when they can run; otherwise why they cannot. Sets
  // `bench`.
  std::string why_memory_cannot_be_measured() {
    bench = built_binary("SLUICE_BENCH_BINARY", "tools/bench/sluice-bench").value_or("");
    if (bench.empty()) return "sluice-bench not found; set SLUICE_BENCH_BINARY";
    if (std::string version; !runs_on_mimalloc(binary, version)) return version;
    return "";
  }

  std::string binary;
  std::string bench;
};

// Every secret below is distinctive enough that finding it anywhere in the
// output can only mean it leaked.
TEST_F(SluiceBinary, KeyMaterialNeverAppearsInItsLogs) {
  const std::string team_a_key = "sk-team-a-Qv7Zr2Lm9Xw4";
  const std::string team_b_key = "sk-team-b-Hy3Kd8Np5Tc1";
  const std::string wrong_key = team_a_key + "x";
  const std::string upstream_key = "sk-upstream-Jf6Wb0Rs4Ge8";
  auto upstream = start_mock();

  TempFile config(
      "server:\n  listen: 127.0.0.1:0\n  admin_listen: off\n  threads: 2\n"
      "log:\n  level: trace\n  access_log: stderr\n  format: json\n"
      "auth:\n  keys:\n"
      "    - name: team-a\n      key: ${TEAM_A_KEY}\n      tpm: 100000\n"
      "    - name: team-b\n      key: ${TEAM_B_KEY}\n      models: [chat]\n      rpm: 2\n"
      "models:\n"
      "  - name: chat\n    deployments:\n" +
          deployment_yaml("ok", upstream->base_url(), "        api_key: ${UPSTREAM_KEY}\n") +
          "  - name: leaky\n    deployments:\n" +
          deployment_yaml("rejects-key", upstream->base_url(),
                          "        api_key: ${UPSTREAM_KEY}\n"
                          "        headers: {x-mock-fail: \"401\"}\n"),
      ".yaml");
  ChildProcess sluice(
      binary, {"--config", config.path()},
      {{"TEAM_A_KEY", team_a_key}, {"TEAM_B_KEY", team_b_key}, {"UPSTREAM_KEY", upstream_key}});
  auto port = sluice.wait_for_listening_port(kListeningPrefix, 10s);
  ASSERT_TRUE(port) << sluice.standard_error();

  auto chat = [&](const Headers& headers, const std::string& model, bool stream = false) {
    return http_request(*port, "POST", "/v1/chat/completions", chat_body(model, stream), headers);
  };
  EXPECT_EQ(chat(bearer(team_a_key), "chat").status, 200u);
  auto streamed = chat(bearer(team_a_key), "chat", true);
  EXPECT_EQ(streamed.status, 200u);
  EXPECT_EQ(sse_data(streamed.body).back(), "[DONE]");
  EXPECT_EQ(chat({{"x-api-key", team_a_key}}, "chat").status, 200u);
  EXPECT_EQ(chat({{"api-key", team_b_key}}, "chat").status, 200u);
  EXPECT_EQ(chat(bearer(wrong_key), "chat").status, 401u);
  EXPECT_EQ(chat({{"Authorization", "Basic " + team_a_key}}, "chat").status, 401u);
  EXPECT_EQ(chat(bearer(team_b_key), "leaky").status, 404u);  // not on team-b's list
  EXPECT_EQ(chat(bearer(team_b_key), "chat").status, 200u);
  EXPECT_EQ(chat(bearer(team_b_key), "chat").status, 429u);  // rpm 2 spent
  EXPECT_EQ(http_request(*port, "GET", "/v1/models", "", bearer(team_a_key)).status, 200u);

  // The upstream rejects its key and quotes it, as OpenAI does; the client
  // gets the error without the quote.
  auto rejected = chat(bearer(team_a_key), "leaky");
  EXPECT_EQ(rejected.status, 401u);
  EXPECT_EQ(rejected.body.find(upstream_key), std::string::npos) << rejected.body;
  EXPECT_NE(rejected.body.find("Incorrect API key"), std::string::npos) << rejected.body;

  // Nothing the clients presented went upstream; the upstream's key did.
  for (const auto& seen : upstream->recent_requests()) {
    for (const auto& [name, value] : seen.headers) {
      EXPECT_EQ(value.find(team_a_key), std::string::npos) << name;
      EXPECT_EQ(value.find(team_b_key), std::string::npos) << name;
    }
    EXPECT_EQ(seen.header("authorization").value_or(""), "Bearer " + upstream_key);
  }

  sluice.signal(SIGTERM);
  ASSERT_EQ(sluice.wait_exit(10s), 0);
  const std::string logs = sluice.standard_output() + sluice.standard_error();
  // The logs were written, and name the keys by their names...
  EXPECT_NE(logs.find("\"key\":\"team-a\""), std::string::npos) << logs;
  EXPECT_NE(logs.find("\"key\":\"team-b\""), std::string::npos) << logs;
  // A refused request is logged with whose key it was.
  bool refusal_logged_with_key = false;
  std::istringstream lines(logs);
  for (std::string line; std::getline(lines, line);) {
    refusal_logged_with_key |=
        line.find("\"key\":\"team-b\",\"model\":\"chat\"") != std::string::npos &&
        line.find("\"status\":429") != std::string::npos;
  }
  EXPECT_TRUE(refusal_logged_with_key) << logs;
  // ...and never by their secrets, whole or in part.
  for (const auto& secret : {team_a_key, team_b_key, wrong_key, upstream_key}) {
    const std::string distinctive = secret.substr(secret.size() - 12);
    EXPECT_EQ(logs.find(distinctive), std::string::npos) << "leaked " << distinctive << "\n"
                                                         << logs;
  }
}

TEST_F(SluiceBinary, SighupReloadsAndSigtermDrainsStreamsThenExitsZero) {
  mock::Behaviour slow_stream;
  slow_stream.interval = 40ms;
  slow_stream.tokens = 10;
  auto upstream = start_mock(slow_stream);
  auto config_text = [&](const std::string& model) {
    return "server:\n  listen: 127.0.0.1:0\n  admin_listen: off\n  threads: 2\n"
           "  drain_timeout: 5s\n"
           "log:\n  access_log: off\nauth:\n  disabled: true\n"
           "models:\n  - name: " +
           model + "\n    deployments:\n" + deployment_yaml("d1", upstream->base_url());
  };
  TempFile config(config_text("first"), ".yaml");
  ChildProcess sluice(binary, {"--config", config.path()});
  auto port = sluice.wait_for_listening_port(kListeningPrefix, 10s);
  ASSERT_TRUE(port) << sluice.standard_error();
  // 0 when the request failed; the failure shows what sluice logged.
  auto status_of = [&](const std::string& model) {
    try {
      return http_request(*port, "POST", "/v1/chat/completions", chat_body(model, false)).status;
    } catch (const std::exception& error) {
      ADD_FAILURE() << "request for " << model << ": " << error.what() << "\nsluice's log:\n"
                    << sluice.standard_error();
      return 0u;
    }
  };
  ASSERT_EQ(status_of("first"), 200u);
  ASSERT_EQ(status_of("second"), 404u);

  // Each worker takes the new snapshot in turn: a request may find it on
  // one worker while another still serves the old one. The line is logged
  // once every worker has it.
  std::ofstream(config.path()) << config_text("second");
  sluice.signal(SIGHUP);
  ASSERT_TRUE(eventually(
      [&] { return sluice.standard_error().find("config reloaded from") != std::string::npos; },
      5s))
      << sluice.standard_error();
  for (int request = 0; request < 4; ++request) {
    EXPECT_EQ(status_of("second"), 200u);
    EXPECT_EQ(status_of("first"), 404u);
  }

  // An invalid file is refused and the running config keeps serving.
  std::ofstream(config.path()) << "models: [this is not a model list\n";
  sluice.signal(SIGHUP);
  EXPECT_TRUE(eventually(
      [&] { return sluice.standard_error().find("config reload rejected") != std::string::npos; },
      5s))
      << sluice.standard_error();
  EXPECT_EQ(status_of("second"), 200u);

  // SIGTERM while a stream is in flight: it runs to its end, then the
  // process exits with 0.
  HttpConnection streaming(*port);
  streaming.send("POST", "/v1/chat/completions", chat_body("second", true));
  ASSERT_EQ(streaming.read_head().status, 200u);
  sluice.signal(SIGTERM);
  auto events = sse_data(streaming.read_rest_of_body());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_GE(events.size(), 10u + 1u);  // every token, then [DONE]
  EXPECT_EQ(sluice.wait_exit(10s), 0);
}

std::size_t occurrences(const std::string& text, const std::string& part) {
  std::size_t count = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// The admin port sluice chose, from its start-up line.
std::optional<std::uint16_t> admin_port_of(const ChildProcess& sluice) {
  constexpr std::string_view kAdminPort = "admin on port ";
  std::optional<std::uint16_t> port;
  eventually(
      [&] {
        const auto logs = sluice.standard_error();
        const auto at = logs.find(kAdminPort);
        if (at == std::string::npos) return false;
        port = static_cast<std::uint16_t>(std::stoul(logs.substr(at + kAdminPort.size())));
        return true;
      },
      10s);
  return port;
}

TEST_F(SluiceBinary, ReloadNamesChangedSettingsThatWaitForARestartAndAppliesTheLogLevel) {
  auto upstream = start_mock({});
  auto config_text = [&](unsigned threads, const std::string& level) {
    return "server:\n  listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0\n  threads: " +
           std::to_string(threads) + "\n  drain_timeout: 5s\nlog:\n  level: " + level +
           "\n  access_log: off\nauth:\n  disabled: true\n"
           "models:\n  - name: chat\n    deployments:\n" +
           deployment_yaml("d1", upstream->base_url());
  };
  TempFile config(config_text(1, "info"), ".yaml");
  ChildProcess sluice(binary, {"--config", config.path()});
  auto port = sluice.wait_for_listening_port(kListeningPrefix, 10s);
  ASSERT_TRUE(port) << sluice.standard_error();
  auto admin_port = admin_port_of(sluice);
  ASSERT_TRUE(admin_port) << sluice.standard_error();
  auto reload = [&] { return http_request(*admin_port, "POST", "/admin/reload"); };
  constexpr std::string_view kReloaded = "config reloaded from";
  constexpr std::string_view kRestartOnly =
      "take effect only at restart and keep their running values: server.threads";

  // The same file: nothing waits for a restart.
  auto same = reload();
  EXPECT_EQ(same.status, 200u) << same.body;
  EXPECT_EQ(json::parse(same.body), json::parse(R"({"reloaded":true,"restart_required":[]})"));
  EXPECT_TRUE(eventually(
      [&] { return occurrences(sluice.standard_error(), std::string(kReloaded)) == 1; }, 5s));
  EXPECT_EQ(occurrences(sluice.standard_error(), std::string(kRestartOnly)), 0u);

  // Another thread count is reported, and the new level applies at once: at
  // "warn" this reload's info line is not written. It would have been queued
  // before the warning, which is waited for.
  std::ofstream(config.path()) << config_text(2, "warn");
  auto changed = reload();
  EXPECT_EQ(changed.status, 200u) << changed.body;
  EXPECT_EQ(json::parse(changed.body),
            json::parse(R"({"reloaded":true,"restart_required":["server.threads"]})"));
  EXPECT_TRUE(eventually(
      [&] { return occurrences(sluice.standard_error(), std::string(kRestartOnly)) == 1; }, 5s))
      << sluice.standard_error();
  EXPECT_EQ(occurrences(sluice.standard_error(), std::string(kReloaded)), 1u)
      << sluice.standard_error();

  // SIGHUP says the same, and "info" writes the info line again. The thread
  // count is still not the one sluice started with.
  std::ofstream(config.path()) << config_text(2, "info");
  sluice.signal(SIGHUP);
  EXPECT_TRUE(eventually(
      [&] {
        const auto logs = sluice.standard_error();
        return occurrences(logs, std::string(kReloaded)) == 2 &&
               occurrences(logs, std::string(kRestartOnly)) == 2;
      },
      5s))
      << sluice.standard_error();
  EXPECT_EQ(http_request(*port, "POST", "/v1/chat/completions", chat_body("chat", false)).status,
            200u);
  sluice.signal(SIGTERM);
  EXPECT_EQ(sluice.wait_exit(10s), 0);
}

// A config with one model, "chat", on `base_url`: two threads, no admin
// listener, no access log, no keys. `server_lines` and `log_lines` are added
// to their sections.
std::string open_chat_config(const std::string& base_url, const std::string& server_lines,
                             const std::string& log_lines = "") {
  return "server:\n  listen: 127.0.0.1:0\n  admin_listen: off\n  threads: 2\n" + server_lines +
         "log:\n  access_log: off\n" + log_lines + "auth:\n  disabled: true\n" +
         "models:\n  - name: chat\n    deployments:\n" + deployment_yaml("d1", base_url);
}

TEST_F(SluiceBinary, WithBusyPollingItServesSaysSoAndStopsOnSigterm) {
  auto upstream = start_mock({});
  TempFile config(
      open_chat_config(upstream->base_url(), "  busy_poll_us: 200\n  drain_timeout: 5s\n"),
      ".yaml");
  ChildProcess sluice(binary, {"--config", config.path()});
  auto port = sluice.wait_for_listening_port(kListeningPrefix, 10s);
  ASSERT_TRUE(port) << sluice.standard_error();
  HttpConnection client(*port);
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(client.request("POST", "/v1/chat/completions", chat_body("chat", false)).status,
              200u);
  }
  EXPECT_NE(sluice.standard_error().find("busy polling: idle workers poll for 200 µs"),
            std::string::npos)
      << sluice.standard_error();
  client.close();
  sluice.signal(SIGTERM);
  EXPECT_EQ(sluice.wait_exit(10s), 0);
}

// Resident memory of process `pid` in KiB; 0 when it cannot be read.
std::size_t resident_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  }
  return 0;
}

// Opens `streams` streams at once through the gateway on `port` (process
// `pid`) and waits for all of them: the most resident memory seen meanwhile.
std::size_t open_burst_of_streams(const std::string& bench, std::uint16_t port, pid_t pid,
                                  unsigned streams) {
  TempFile results("", ".json");
  ChildProcess load(
      bench,
      {"--url", "http://127.0.0.1:" + std::to_string(port) + "/v1/chat/completions", "--model",
       "chat", "--stream", "--concurrency", std::to_string(streams), "--requests",
       std::to_string(streams), "--warmup", "0s", "--timeout", "20s", "--json", results.path()});
  std::size_t peak = 0;
  eventually(
      [&] {
        peak = std::max(peak, resident_kib(pid));
        return load.exited();
      },
      30s);
  EXPECT_EQ(load.wait_exit(0ms), 0) << load.standard_error();
  const auto outcome = json::parse(std::ifstream(results.path()));
  EXPECT_EQ(outcome["errors"], 0) << outcome.dump();
  EXPECT_GE(outcome["ok"].get<unsigned>(), streams) << outcome.dump();
  return peak;
}

// Streams of 5 events 100 ms apart from a mock on two threads.
std::unique_ptr<mock::MockServer> start_held_stream_mock() {
  mock::Behaviour held;
  held.interval = 100ms;
  held.tokens = 5;
  return start_mock(held, 2);
}

// What a burst of connections took is given back to the system once the
// gateway has been quiet for server.memory_release_after, not kept until
// traffic comes again.
TEST_F(SluiceBinary, GivesBackTheMemoryOfABurstOfStreamsOnceItEnds) {
  if (auto why = why_memory_cannot_be_measured(); !why.empty()) GTEST_SKIP() << why;
  constexpr unsigned kStreams = 1000;
  // Each stream holds a descriptor in the load generator and two in sluice.
  ASSERT_GT(raise_descriptor_limit(), 2 * kStreams + 256);
  auto upstream = start_held_stream_mock();
  TempFile config(
      open_chat_config(upstream->base_url(), "  memory_release_after: 1s\n", "  level: warn\n"),
      ".yaml");
  ChildProcess sluice(binary, {"--config", config.path()});
  auto port = sluice.wait_for_listening_port(kListeningPrefix, 10s);
  ASSERT_TRUE(port) << sluice.standard_error();
  ASSERT_EQ(http_request(*port, "POST", "/v1/chat/completions", chat_body("chat", true)).status,
            200u);
  const std::size_t before = resident_kib(sluice.pid());
  ASSERT_GT(before, 0u);

  const std::size_t peak =
      std::max(before, open_burst_of_streams(bench, *port, sluice.pid(), kStreams));
  // About 14 KiB a held stream; well above what the process moves by alone.
  ASSERT_GT(peak, before + 6 * 1024) << "before " << before << " KiB, peak " << peak << " KiB";

  // Half of what the burst took is back within a few seconds. About a
  // quarter stays (Asio keeps the state of every descriptor it has watched
  // for reuse); with freed pages decommitted only on the thread's next
  // allocation, more than nine tenths stayed.
  const std::size_t allowed = before + (peak - before) / 2;
  std::size_t after = 0;
  EXPECT_TRUE(eventually(
      [&] {
        after = resident_kib(sluice.pid());
        return after <= allowed;
      },
      6s))
      << "before " << before << " KiB, peak " << peak << " KiB, still " << after << " KiB";
  sluice.signal(SIGTERM);
  EXPECT_EQ(sluice.wait_exit(10s), 0);
}

// Minor page faults of process `pid` so far; 0 when they cannot be read.
std::uint64_t minor_faults(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto end_of_name = text.rfind(") ");
  if (end_of_name == std::string::npos) return 0;
  std::istringstream fields(text.substr(end_of_name + 2));
  std::string field;
  // state, ppid, pgrp, session, tty_nr, tpgid, flags, then minflt.
  for (int i = 0; i < 8; ++i) fields >> field;
  return field.empty() ? 0 : std::stoull(field);
}

// Freed memory goes back once a worker is quiet, not while it serves: under
// a steady load, a page of coroutine frames that falls empty for a moment
// stays, rather than going back to the system and faulting in again (a
// madvise and 16 faults each time: 0.23 faults per request at concurrency
// 64 on one thread when every empty page went back at once).
TEST_F(SluiceBinary, KeepsItsPagesUnderASteadyLoad) {
  if (auto why = why_memory_cannot_be_measured(); !why.empty()) GTEST_SKIP() << why;
  auto upstream = start_mock({}, 2);
  std::string yaml = open_chat_config(upstream->base_url(), "", "  level: warn\n");
  yaml.replace(yaml.find("threads: 2"), 10, "threads: 1");
  TempFile config(yaml, ".yaml");
  ChildProcess sluice(binary, {"--config", config.path()});
  auto port = sluice.wait_for_listening_port(kListeningPrefix, 10s);
  ASSERT_TRUE(port) << sluice.standard_error();
  TempFile results("", ".json");
  const auto load = [&](unsigned requests) {
    ChildProcess bench_run(
        bench, {"--url", "http://127.0.0.1:" + std::to_string(*port) + "/v1/chat/completions",
                "--model", "chat", "--concurrency", "64", "--requests", std::to_string(requests),
                "--warmup", "0s", "--timeout", "20s", "--json", results.path()});
    ASSERT_EQ(bench_run.wait_exit(60s), 0) << bench_run.standard_error();
    const auto outcome = json::parse(std::ifstream(results.path()));
    ASSERT_EQ(outcome["errors"], 0) << outcome.dump();
  };
  // Pools, buffers and the heap grow to the load first.
  load(5000);
  const std::uint64_t before = minor_faults(sluice.pid());
  ASSERT_GT(before, 0u);
  constexpr unsigned kRequests = 20000;
  load(kRequests);
  const std::uint64_t faults = minor_faults(sluice.pid()) - before;
  EXPECT_LT(faults, kRequests / 50) << faults << " page faults in " << kRequests << " requests";
  sluice.signal(SIGTERM);
  EXPECT_EQ(sluice.wait_exit(10s), 0);
}

// A second burst soon after the first finds the memory the first one took:
// faulting it in again cost each stream about 3.5 page faults, a third of
// the gateway's CPU time for a burst.
TEST_F(SluiceBinary, KeepsTheMemoryOfABurstForTheNextOne) {
  if (auto why = why_memory_cannot_be_measured(); !why.empty()) GTEST_SKIP() << why;
  constexpr unsigned kStreams = 1000;
  ASSERT_GT(raise_descriptor_limit(), 2 * kStreams + 256);
  auto upstream = start_held_stream_mock();
  TempFile config(open_chat_config(upstream->base_url(), "", "  level: warn\n"), ".yaml");
  ChildProcess sluice(binary, {"--config", config.path()});
  auto port = sluice.wait_for_listening_port(kListeningPrefix, 10s);
  ASSERT_TRUE(port) << sluice.standard_error();

  const std::uint64_t at_start = minor_faults(sluice.pid());
  open_burst_of_streams(bench, *port, sluice.pid(), kStreams);
  const std::uint64_t first = minor_faults(sluice.pid()) - at_start;
  // Quiet for longer than a worker once took to give its memory back.
  std::this_thread::sleep_for(2500ms);
  const std::uint64_t between = minor_faults(sluice.pid());
  open_burst_of_streams(bench, *port, sluice.pid(), kStreams);
  const std::uint64_t second = minor_faults(sluice.pid()) - between;
  EXPECT_GT(first, kStreams);
  EXPECT_LT(second, first / 4) << first << " page faults in the first burst, " << second
                               << " in the second";
  sluice.signal(SIGTERM);
  EXPECT_EQ(sluice.wait_exit(10s), 0);
}

}  // namespace
}  // namespace sluice::testing

// Limits that follow measured latency, behind the gateway against real mock
// upstreams: adaptive deadlines and the quality guard.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/canned_upstream.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

json deployment_route(TestGateway& gateway, const std::string& id) {
  auto routes = http_request(gateway.gateway().admin_port(), "GET", "/admin/routes");
  const json parsed = json::parse(routes.body);
  for (const auto& model : parsed["models"]) {
    for (const auto& deployment : model["deployments"]) {
      if (deployment["id"] == id) return deployment;
    }
  }
  ADD_FAILURE() << "no deployment " << id << " in " << routes.body;
  return {};
}

std::string metrics_text(TestGateway& gateway) {
  return http_request(gateway.gateway().admin_port(), "GET", "/metrics").body;
}

// The gateway's metrics count `count` quality failures of `deployment` for
// `reason`.
void expect_quality_failures(TestGateway& gateway, const std::string& deployment,
                             const std::string& reason, int count) {
  // The gateway judges an answer once its last byte is written, so the
  // client may read the answer before the count moves.
  const std::string line = "sluice_quality_failures_total{deployment=\"" + deployment +
                           "\",reason=\"" + reason + "\"} " + std::to_string(count);
  std::string metrics;
  EXPECT_TRUE(eventually([&] {
    metrics = metrics_text(gateway);
    return metrics.find(line) != std::string::npos;
  })) << line
      << "\n"
      << metrics;
}

// The head of a chunked event stream, as a canned upstream sends it.
const std::string kEventStreamHead =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";

// A streamed chat request for `model` with max_tokens 100.
std::string chat_stream_of_100_tokens(const std::string& model) {
  return R"({"model":")" + model +
         R"(","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]})";
}

const std::string kAdaptiveRouter =
    "router:\n"
    "  retries: 0\n"
    "  window: 20\n"
    "  cooldown: {fails: 1000}\n"
    "  adaptive:\n"
    "    ttft: {multiplier: 2, floor: 100ms, ceiling: 60s}\n"
    "    idle: {multiplier: 3, floor: 100ms, ceiling: 120s}\n"
    "    min_samples: 10\n";

TEST(AdaptiveDeadlines, FollowTheMeasuredLatencyAndCutOffWhatIsFarSlower) {
  mock::Behaviour behaviour;
  behaviour.ttft = 40ms;
  behaviour.interval = 10ms;
  behaviour.tokens = 4;
  behaviour.stall = 3000ms;
  auto upstream = start_mock(behaviour, 2);
  TestGateway gateway(
      kAdaptiveRouter + "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("a", upstream->base_url(), "        timeouts: {ttft: auto, idle: auto}\n"));

  // Before min_samples: the static defaults, shown as such.
  auto before = deployment_route(gateway, "a")["deadlines"];
  EXPECT_EQ(before["ttft"]["ms"], 10000) << before;
  EXPECT_EQ(before["ttft"]["measured"], false) << before;
  EXPECT_EQ(before["idle"]["ms"], 30000) << before;

  for (int i = 0; i < 12; ++i) {
    auto answer =
        http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
    ASSERT_EQ(answer.status, 200u) << answer.body;
  }
  auto measured = deployment_route(gateway, "a")["deadlines"];
  ASSERT_EQ(measured["ttft"]["measured"], true) << measured;
  ASSERT_EQ(measured["idle"]["measured"], true) << measured;
  const int ttft_ms = measured["ttft"]["ms"];
  const int idle_ms = measured["idle"]["ms"];
  // 2 x a P99 of some 40 ms, and 3 x the longest gaps of ~10 ms, floored.
  EXPECT_GE(ttft_ms, 80) << measured;
  EXPECT_LT(ttft_ms, 1000) << measured;
  EXPECT_GE(idle_ms, 100) << measured;
  EXPECT_LT(idle_ms, 1000) << measured;

  const auto metrics = metrics_text(gateway);
  EXPECT_NE(metrics.find("sluice_deadline_seconds{deployment=\"a\",kind=\"ttft\"}"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("sluice_deadline_seconds{deployment=\"a\",kind=\"idle\"}"),
            std::string::npos);

  // The cached deadlines are at most a second old.
  std::this_thread::sleep_for(1100ms);

  // An answer far slower than the measured P99 is cut off at the adaptive
  // deadline, not at the static 10 s.
  auto started = SteadyClock::now();
  auto slow = http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true),
                           {{"x-mock-ttft-ms", "3000"}});
  auto waited = SteadyClock::now() - started;
  EXPECT_EQ(slow.status, 504u) << slow.body;
  EXPECT_LT(waited, 1500ms);

  // That timeout counts as a sample at the deadline: the P99 rises to it.
  auto after_timeout = deployment_route(gateway, "a")["deadlines"]["ttft"];
  EXPECT_GE(after_timeout["p99_ms"].get<double>(), ttft_ms - 1) << after_timeout;

  // A stream that stalls is ended at the adaptive stall deadline.
  started = SteadyClock::now();
  auto stalled =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true),
                   {{"x-mock-fail", "stall-mid"}, {"x-mock-stall-ms", "3000"}});
  waited = SteadyClock::now() - started;
  EXPECT_EQ(stalled.status, 200u);
  EXPECT_NE(stalled.body.find("upstream_timeout"), std::string::npos) << stalled.body;
  EXPECT_LT(waited, 1500ms);
}

TEST(AdaptiveDeadlines, StaticDeadlinesAreNotExported) {
  auto upstream = start_mock();
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("a", upstream->base_url()));
  auto answer =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(answer.status, 200u);
  EXPECT_EQ(metrics_text(gateway).find("sluice_deadline_seconds{"), std::string::npos);
  auto deadlines = deployment_route(gateway, "a")["deadlines"];
  EXPECT_EQ(deadlines["ttft"]["ms"], 10000);
  EXPECT_EQ(deadlines["ttft"]["auto"], false);
}

// One of two deployments answers fast, but 30% of its answers are cut short
// (a clean end without [DONE]). The guard counts those as its failures, so
// it loses the traffic its speed would win it. The cooldown here starts at
// the first failure: the mock's seeded draws put only two truncations in
// the fast deployment's first twelve answers, so with two to a cooldown the
// test would hang on that one sequence rather than on the guard.
// Without the guard the fast deployment would answer nearly all 50.
TEST(QualityGuard, FastTruncatingDeploymentLosesTraffic) {
  mock::Behaviour cutting;
  cutting.fail = "cut-short";
  cutting.fail_rate = 0.3;
  auto bad = start_mock(cutting, 2);
  mock::Behaviour slower;
  slower.ttft = 30ms;
  auto good = start_mock(slower, 2);
  TestGateway gateway(
      "router:\n  quality: {enabled: true}\n  cooldown: {fails: 1, within: 60s, for: 60s}\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("bad", bad->base_url()) + deployment_yaml("good", good->base_url()));

  int to_bad = 0;
  int cut_answers = 0;
  for (int i = 0; i < 50; ++i) {
    auto answer =
        http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
    ASSERT_EQ(answer.status, 200u) << answer.body;
    if (answer.header("x-sluice-deployment") == "bad") {
      ++to_bad;
      // The client gets the answer as it came: no error event is added.
      EXPECT_EQ(answer.body.find("error"), std::string::npos) << answer.body;
      if (answer.body.find("[DONE]") == std::string::npos) ++cut_answers;
    }
  }
  EXPECT_GT(cut_answers, 0);
  EXPECT_LT(to_bad, 10) << "bad answered " << to_bad << " of 50";

  auto route = deployment_route(gateway, "bad");
  EXPECT_GT(route["recent_error_rate"].get<double>(), 0.0) << route;
  EXPECT_EQ(route["cooling_down"], true) << route;
  expect_quality_failures(gateway, "bad", "truncated", cut_answers);
}

// A JSON answer cut short (its Content-Length met) and an empty one count too.
TEST(QualityGuard, CutJsonAndEmptyAnswersAreFailures) {
  mock::Behaviour cutting;
  cutting.fail = "cut-short";
  auto cut = start_mock(cutting);
  mock::Behaviour silent;
  silent.tokens = 0;
  auto empty = start_mock(silent);
  TestGateway gateway(
      "router:\n  quality: {}\n  retries: 0\n"
      "models:\n  - name: cut\n    deployments:\n" +
      deployment_yaml("cut", cut->base_url()) + "  - name: empty\n    deployments:\n" +
      deployment_yaml("empty", empty->base_url()));
  auto answer =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("cut", false));
  EXPECT_EQ(answer.status, 200u);
  auto streamed =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("empty", true));
  EXPECT_EQ(streamed.status, 200u);
  // The usage the guard asked for is not passed to a client that did not.
  EXPECT_EQ(streamed.body.find("\"usage\":{"), std::string::npos) << streamed.body;
  expect_quality_failures(gateway, "cut", "truncated", 1);
  expect_quality_failures(gateway, "empty", "empty", 1);
}

// Streams whose ends only show across reads: a finish_reason "length" split
// between two of them, well short of the max_tokens asked for, and a [DONE]
// that no finish_reason came before.
TEST(QualityGuard, ReadsTheStreamsEndAcrossReads) {
  const std::string& head = kEventStreamHead;
  const std::string first = R"(data: {"choices":[{"index":0,"delta":{"content":"hi"},)";
  const std::string usage =
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5,"
      "\"total_tokens\":8}}\n\n";
  CannedUpstream early({head + chunk(first + R"("finish_reason":"len)"),
                        chunk("gth\"}]}\n\n" + usage + "data: [DONE]\n\n") + chunk("")});
  CannedUpstream no_reason({head + chunk(first + "\"finish_reason\":null}]}\n\n"),
                            chunk(usage + "data: [DONE]\n\n") + chunk("")});
  TestGateway gateway(
      "router:\n  quality: {}\n  retries: 0\n"
      "models:\n  - name: early\n    deployments:\n" +
      deployment_yaml("early", early.base_url()) + "  - name: no-reason\n    deployments:\n" +
      deployment_yaml("no-reason", no_reason.base_url()));
  for (const std::string model : {"early", "no-reason"}) {
    auto answer = http_request(gateway.port(), "POST", "/v1/chat/completions",
                               chat_stream_of_100_tokens(model));
    ASSERT_EQ(answer.status, 200u) << answer.body;
    // Relayed as it came.
    EXPECT_NE(answer.body.find("data: [DONE]"), std::string::npos) << answer.body;
  }
  expect_quality_failures(gateway, "early", "length_early", 1);
  expect_quality_failures(gateway, "no-reason", "truncated", 1);
}

// An Anthropic stream, as an OpenAI client gets it translated, is judged as
// that client's answer: stopped by max_tokens well short of the request's,
// or ended cleanly before message_stop.
TEST(QualityGuard, JudgesAnswersTranslatedFromAnthropic) {
  const std::string& head = kEventStreamHead;
  const std::string opening =
      "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\","
      "\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":"
      "{\"input_tokens\":3,\"output_tokens\":1}}}\n\n"
      "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
      "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
      "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
      "\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n";
  const std::string stopped_by_length =
      "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"
      "{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":5}}\n\n"
      "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
  CannedUpstream early(head + chunk(opening) + chunk(stopped_by_length) + chunk(""));
  CannedUpstream cut(head + chunk(opening) + chunk(""));
  const auto anthropic_model = [](const std::string& name, const CannedUpstream& upstream) {
    std::string origin = upstream.base_url();
    origin.erase(origin.rfind("/v1"));
    return "  - name: " + name + "\n    deployments:\n      - id: " + name +
           "\n        provider: anthropic\n        base_url: " + origin +
           "\n        model: claude-upstream\n        api_key: sk-ant-test\n";
  };
  TestGateway gateway("router:\n  quality: {}\n  retries: 0\nmodels:\n" +
                      anthropic_model("early", early) + anthropic_model("cut", cut));
  for (const std::string model : {"early", "cut"}) {
    auto answer = http_request(gateway.port(), "POST", "/v1/chat/completions",
                               chat_stream_of_100_tokens(model));
    ASSERT_EQ(answer.status, 200u) << answer.body;
    EXPECT_NE(answer.body.find("\"content\":\"hi\""), std::string::npos) << answer.body;
  }
  expect_quality_failures(gateway, "early", "length_early", 1);
  expect_quality_failures(gateway, "cut", "truncated", 1);
}

// A chat request whose one message is `characters` long.
std::string chat_with_prompt(std::size_t characters) {
  return R"({"model":"chat","messages":[{"role":"user","content":")" +
         std::string(characters, 'a') + R"("}],"stream":true})";
}

std::string answered_by(TestGateway& gateway, std::size_t characters) {
  auto answer =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_with_prompt(characters));
  EXPECT_EQ(answer.status, 200u) << answer.body;
  return answer.header("x-sluice-deployment");
}

// One deployment is fast on short prompts and slow on long ones (its
// prefill costs per token), the other the reverse: with windows per prompt
// size, short prompts go to the first and long ones to the second.
TEST(PromptClasses, ShortAndLongPromptsGoWhereEachIsFastest) {
  mock::Behaviour prefill_bound;
  prefill_bound.ttft_per_prompt_token = 40us;  // 9,000 tokens: 360 ms
  auto short_fast = start_mock(prefill_bound, 2);
  mock::Behaviour flat;
  flat.ttft = 100ms;
  auto long_fast = start_mock(flat, 2);
  TestGateway gateway(
      "router:\n  prompt_classes: true\n  latency_buffer: 0\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("short_fast", short_fast->base_url()) +
      deployment_yaml("long_fast", long_fast->base_url()));
  constexpr std::size_t kShort = 100;
  constexpr std::size_t kLong = 36'000;  // some 9,000 tokens: the 8k-32k class
  for (int i = 0; i < 15; ++i) {
    answered_by(gateway, kShort);
    answered_by(gateway, kLong);
  }
  int short_right = 0;
  int long_right = 0;
  for (int i = 0; i < 10; ++i) {
    short_right += answered_by(gateway, kShort) == "short_fast";
    long_right += answered_by(gateway, kLong) == "long_fast";
  }
  EXPECT_GE(short_right, 9);
  EXPECT_GE(long_right, 9);

  auto classes = deployment_route(gateway, "short_fast")["prompt_classes"];
  ASSERT_EQ(classes.size(), 4u) << classes;
  EXPECT_EQ(classes[0]["class"], "<1k");
  EXPECT_GT(classes[0]["ttft_samples"].get<int>(), 0) << classes;
  EXPECT_GT(classes[2]["ttft_samples"].get<int>(), 0) << classes;
  EXPECT_GT(classes[2]["ttft_p50_ms"].get<double>(), classes[0]["ttft_p50_ms"].get<double>());
}

// An upstream that serves 4 requests at once and queues the rest: under
// more load than that, the adaptive cap comes down near its slots, and
// what it turns away is answered 503 overloaded, as with a fixed cap.
TEST(AdaptiveConcurrency, CapComesDownToTheUpstreamsSlots) {
  mock::Behaviour queueing;
  queueing.slots = 4;
  queueing.ttft = 20ms;
  queueing.interval = 10ms;
  queueing.tokens = 8;
  auto upstream = start_mock(queueing, 2);
  TestGateway gateway(
      "router:\n  retries: 0\n  adaptive:\n"
      "    concurrency: {min: 1, max: 64, tolerance: 1.5, probe_every: 60s}\n"
      "models:\n  - name: chat\n    deployments:\n" +
      deployment_yaml("queued", upstream->base_url(), "        max_parallel: auto\n"));
  EXPECT_EQ(deployment_route(gateway, "queued")["concurrency"]["limit"], 32);

  std::atomic<bool> stop{false};
  std::atomic<int> overloaded{0};
  std::atomic<int> served{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&] {
      while (!stop) {
        auto answer =
            http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", true));
        if (answer.status == 503) {
          ++overloaded;
          std::this_thread::sleep_for(5ms);
        } else if (answer.status == 200) {
          ++served;
        }
      }
    });
  }
  // Six seconds bring it down on a quiet machine; under sanitizers on a busy
  // one the baseline it measures first is longer and the descent slower, so
  // it is given up to twenty.
  std::this_thread::sleep_for(6s);
  auto route = deployment_route(gateway, "queued");
  const auto give_up_at = std::chrono::steady_clock::now() + 14s;
  while (route["concurrency"]["limit"].get<int>() > 10 &&
         std::chrono::steady_clock::now() < give_up_at) {
    std::this_thread::sleep_for(500ms);
    route = deployment_route(gateway, "queued");
  }
  const auto metrics = metrics_text(gateway);
  stop = true;
  for (auto& client : clients) client.join();

  const int limit = route["concurrency"]["limit"];
  EXPECT_GE(limit, 2) << route;
  EXPECT_LE(limit, 10) << route;
  EXPECT_GT(overloaded.load(), 0);
  EXPECT_GT(served.load(), 0);
  EXPECT_NE(metrics.find("sluice_concurrency_limit{deployment=\"queued\"} "), std::string::npos)
      << metrics;
}

}  // namespace
}  // namespace sluice::testing

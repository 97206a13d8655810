// Upstream faults, by the moment they strike: what the client gets, and
// that the gateway keeps no socket or pool slot of the failed exchange.
// Elsewhere: failover before the first byte is Routing's Failover table,
// refused connections and a stalled first byte with one deployment are in
// errors_test, streams broken after their first byte (reset, truncated,
// stalled, endless, dripped) in tests/stream/relay_test, untrusted
// certificates in tests/upstream.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"
#include "support/leak_check.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Where a deployment points for a fault that is not the mock's own.
enum class Target {
  mock,             // the mock, over plain HTTP
  mock_over_https,  // the plain-HTTP mock addressed as https: the handshake fails
  never_resolves,   // a host under .invalid (RFC 6761)
};

// Before the first byte, with no other deployment to fail over to: a clean
// OpenAI-style error on a connection that stays usable.
struct EarlyFault {
  std::string name;
  mock::Behaviour behaviour;
  Target target;
  bool stream;
  unsigned status;
  std::string code;
  std::string failure;  // named in the error message
};

mock::Behaviour failing(const std::string& mode, std::chrono::milliseconds interval = 0ms) {
  mock::Behaviour behaviour;
  behaviour.fail = mode;
  behaviour.interval = interval;
  behaviour.stall = 5000ms;
  return behaviour;
}

std::string base_url(const EarlyFault& fault, const mock::MockServer& upstream) {
  switch (fault.target) {
    case Target::mock:
      return upstream.base_url();
    case Target::mock_over_https:
      return "https://127.0.0.1:" + std::to_string(upstream.port()) + "/v1";
    case Target::never_resolves:
      return "http://sluice-fault.invalid/v1";
  }
  return {};
}

std::string error_code_of(const std::string& body) {
  auto parsed = json::parse(body, nullptr, false);
  if (!parsed.is_object() || !parsed.contains("error")) return "<not an error: " + body + ">";
  return parsed["error"].value("code", "<no code>");
}

// Names the case in test output instead of dumping its bytes.
void PrintTo(const EarlyFault& fault, std::ostream* out) { *out << fault.name; }

class FaultBeforeFirstByte : public ::testing::TestWithParam<EarlyFault> {};

TEST_P(FaultBeforeFirstByte, IsAnOpenAiErrorAndLeavesNothingOpen) {
  const auto& fault = GetParam();
  auto upstream = start_mock(fault.behaviour);
  TestGateway gateway("router:\n  retries: 0\nmodels:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("faulty", base_url(fault, *upstream),
                                      kNoWarmConnections +
                                          "        timeouts: {connect: 500ms, ttft: 200ms, "
                                          "idle: 200ms}\n"));
  LeakCheck leaks(gateway);
  {
    HttpConnection client(gateway.port(), 5s);
    for (int round = 0; round < 2; ++round) {
      auto started = Clock::now();
      auto response =
          client.request("POST", "/v1/chat/completions", chat_body("chat", fault.stream));
      // Bounded by the deployment's timeouts, the DNS lookup included.
      EXPECT_LT(Clock::now() - started, 2s);
      EXPECT_EQ(response.status, fault.status) << response.body;
      EXPECT_EQ(response.header("content-type"), "application/json");
      EXPECT_EQ(error_code_of(response.body), fault.code);
      EXPECT_NE(response.body.find(fault.failure), std::string::npos) << response.body;
      EXPECT_EQ(response.header("x-sluice-deployment"), "faulty");
    }
  }
  EXPECT_TRUE(leaks.settled());
  EXPECT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }, 2s));
}

std::vector<EarlyFault> early_faults() {
  return {
      {"reset", failing("reset"), Target::mock, true, 502, "upstream_unreachable", "no_response"},
      {"garbage", failing("garbage"), Target::mock, true, 502, "upstream_unreachable",
       "bad_response"},
      // One byte of the head every 20 ms: a slow drip never beats the ttft limit.
      {"drip_head", failing("drip", 20ms), Target::mock, true, 504, "upstream_timeout",
       "first_byte_timeout"},
      // The head of a JSON answer, then silence: the client has seen nothing yet.
      {"stall_after_head", failing("stall-mid"), Target::mock, false, 504, "upstream_timeout",
       "idle_timeout"},
      {"tls_to_plain_http", {}, Target::mock_over_https, true, 502, "upstream_unreachable", "tls"},
      {"dns", {}, Target::never_resolves, true, 502, "upstream_unreachable", "dns"},
  };
}

INSTANTIATE_TEST_SUITE_P(Faults, FaultBeforeFirstByte, ::testing::ValuesIn(early_faults()),
                         [](const auto& info) { return info.param.name; });

// A JSON body cut after its first bytes cannot carry an error of its own:
// the client gets fewer bytes than the Content-Length it was promised, and
// the connection closes, so the cut is plain to see.
class JsonBodyCut : public ::testing::TestWithParam<std::string> {};

TEST_P(JsonBodyCut, IsShortOfContentLengthAndCloses) {
  mock::Behaviour behaviour = failing(GetParam());
  behaviour.tokens = 2000;  // a body large enough to be read in several pieces
  auto upstream = start_mock(behaviour);
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("faulty", upstream->base_url(), kNoWarmConnections));
  LeakCheck leaks(gateway);
  {
    HttpConnection client(gateway.port(), 5s);
    client.send("POST", "/v1/chat/completions", chat_body("chat", false));
    auto raw = client.read_until_close();
    auto head_end = raw.find("\r\n\r\n");
    ASSERT_NE(head_end, std::string::npos) << raw.substr(0, 200);
    EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 200");
    auto length_at = raw.find("Content-Length: ");
    ASSERT_LT(length_at, head_end);
    auto promised = std::stoul(raw.substr(length_at + 16));
    auto received = raw.size() - head_end - 4;
    EXPECT_GT(received, 0u);
    EXPECT_LT(received, promised);
  }
  EXPECT_TRUE(leaks.settled());
  EXPECT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }, 2s));
}

INSTANTIATE_TEST_SUITE_P(Faults, JsonBodyCut, ::testing::Values("truncate", "reset-mid"),
                         [](const auto& info) {
                           auto name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Large is not broken: a huge stream and a huge JSON body arrive whole, and
// their connection is pooled.
struct WholeResponse {
  std::string name;
  mock::Behaviour behaviour;
  bool stream;
};

void PrintTo(const WholeResponse& response, std::ostream* out) { *out << response.name; }

class ArrivesWhole : public ::testing::TestWithParam<WholeResponse> {};

TEST_P(ArrivesWhole, EveryEventAndTheEnd) {
  const auto& param = GetParam();
  auto upstream = start_mock(param.behaviour);
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url(), kNoWarmConnections));
  LeakCheck leaks(gateway);
  {
    HttpConnection client(gateway.port(), 10s);
    auto response = client.request("POST", "/v1/chat/completions", chat_body("chat", param.stream));
    ASSERT_EQ(response.status, 200u) << response.body.substr(0, 300);
    const auto last_token = "tok" + std::to_string(param.behaviour.tokens - 1);
    if (param.stream) {
      auto events = sse_data(response.body);
      ASSERT_EQ(events.size(), param.behaviour.tokens + 2u);  // tokens, finish chunk, [DONE]
      EXPECT_EQ(events.back(), "[DONE]");
      EXPECT_NE(events[param.behaviour.tokens - 1].find(last_token), std::string::npos);
    } else {
      auto body = json::parse(response.body);
      auto content = body["choices"][0]["message"]["content"].get<std::string>();
      EXPECT_NE(content.find(last_token), std::string::npos);
    }
    // The whole exchange was read: its upstream connection is reusable.
    EXPECT_TRUE(eventually([&] { return gateway.idle_upstream_connections() == 1; }, 1s));
  }
  EXPECT_TRUE(leaks.settled());
}

std::vector<WholeResponse> whole_responses() {
  mock::Behaviour huge;
  huge.tokens = 20000;
  return {{"huge_stream", huge, true}, {"huge_json", huge, false}};
}

INSTANTIATE_TEST_SUITE_P(Faults, ArrivesWhole, ::testing::ValuesIn(whole_responses()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::testing

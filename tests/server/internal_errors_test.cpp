// An exception that escapes the request path costs its connection, not the
// gateway: what the request held is given back, the exception is counted,
// and the gateway goes on serving.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "sluice/server/internal_errors.hpp"
#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kKey = "sk-internal-errors-0123";

// Makes the request path throw once at `point`. Made before the gateway
// and destroyed after it stopped, so that no worker reads the hook while
// it changes.
class ThrowOnceAt {
 public:
  explicit ThrowOnceAt(server::FaultPoint point) {
    target_ = point;
    throws_left_ = 1;
    server::fault_injection = &maybe_throw;
  }
  ~ThrowOnceAt() { server::fault_injection = nullptr; }
  ThrowOnceAt(const ThrowOnceAt&) = delete;
  ThrowOnceAt& operator=(const ThrowOnceAt&) = delete;

 private:
  static void maybe_throw(server::FaultPoint point) {
    if (point == target_ && throws_left_.fetch_sub(1) > 0) {
      throw std::runtime_error("injected for a test");
    }
  }
  static inline server::FaultPoint target_{};
  static inline std::atomic<int> throws_left_{0};
};

struct Case {
  const char* name;
  server::FaultPoint point;
  bool hedged;  // the first deployment is slow and a hedge goes to the second
};

class InternalError : public ::testing::TestWithParam<Case> {};

TEST_P(InternalError, ReleasesWhatTheRequestHeldAndIsCounted) {
  const Case& param = GetParam();
  mock::Behaviour first_behaviour;
  if (param.hedged) {
    first_behaviour.ttft = 2s;
  } else {
    first_behaviour.fail = "500";
  }
  auto first = start_mock(first_behaviour);
  auto second = start_mock();
  const ThrowOnceAt fault(param.point);
  TestGateway gateway(
      std::string("router:\n  retries: 1\n  hedge: {after: ") + (param.hedged ? "50ms" : "off") +
      "}\nauth:\n  keys:\n    - name: team\n      key: " + kKey +
      "\n      max_parallel: 1\nmodels:\n  - name: chat\n    strategy: priority\n"
      "    deployments:\n" +
      deployment_yaml("first", first->base_url()) + deployment_yaml("second", second->base_url()));
  auto& gateway_metrics = gateway.gateway().metrics();
  auto router = gateway.gateway().snapshot()->router;

  // The request's connection ends without an answer.
  EXPECT_ANY_THROW(http_request(gateway.port(), "POST", "/v1/chat/completions",
                                chat_body("chat", true), bearer(kKey)));
  EXPECT_TRUE(eventually([&] { return gateway_metrics.internal_errors.value() == 1; }));
  EXPECT_TRUE(eventually([&] { return gateway.gateway().open_connections().load() == 0; }))
      << gateway.gateway().open_connections().load() << " connections still counted";
  EXPECT_EQ(gateway_metrics.requests_in_flight.value(), 0);
  EXPECT_EQ(router->state("first")->in_flight(), 0);
  EXPECT_EQ(router->state("second")->in_flight(), 0);
  auto metrics = http_request(gateway.gateway().admin_port(), "GET", "/metrics");
  EXPECT_NE(metrics.body.find("\nsluice_internal_errors_total 1\n"), std::string::npos);

  // The key's one parallel slot is free, and the gateway answers.
  auto next = http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false),
                           bearer(kKey));
  EXPECT_EQ(next.status, 200u) << next.body;
  EXPECT_EQ(gateway_metrics.internal_errors.value(), 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Points, InternalError,
    ::testing::Values(Case{"AttemptFailed", server::FaultPoint::attempt_failed, false},
                      Case{"HedgeLaunched", server::FaultPoint::hedge_launched, true},
                      Case{"HedgeAttempt", server::FaultPoint::hedge_attempt, true}),
    [](const auto& info) { return std::string(info.param.name); });

// A bug met while a connection is accepted costs that connection, not the
// listener: the next connection is served.
TEST(InternalErrorWhileAccepting, CostsTheConnectionAndTheListenerGoesOn) {
  auto upstream = start_mock();
  const ThrowOnceAt fault(server::FaultPoint::connection_accepted);
  TestGateway gateway("server:\n  threads: 1\nmodels:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("only", upstream->base_url()));
  EXPECT_ANY_THROW(http_request(gateway.port(), "GET", "/health"));
  auto& gateway_metrics = gateway.gateway().metrics();
  EXPECT_TRUE(eventually([&] { return gateway_metrics.internal_errors.value() == 1; }));
  EXPECT_EQ(gateway.gateway().open_connections().load(), 0);
  auto next = http_request(gateway.port(), "GET", "/health");
  EXPECT_EQ(next.status, 200u) << next.body;
}

}  // namespace
}  // namespace sluice::testing

// Graceful shutdown and config reload of a running gateway.
#include <gtest/gtest.h>

#include <boost/asio/post.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;

TEST(Lifecycle, DrainLetsStreamsFinishAndClosesIdleConnections) {
  mock::Behaviour behaviour;
  behaviour.interval = 50ms;
  behaviour.tokens = 10;
  auto upstream = start_mock(behaviour);
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));

  HttpConnection idle(gateway.port());
  ASSERT_EQ(idle.request("GET", "/health").status, 200u);

  HttpConnection streaming(gateway.port());
  streaming.send("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(streaming.read_head().status, 200u);

  auto started = std::chrono::steady_clock::now();
  auto drained = std::async(std::launch::async, [&] { gateway.gateway().drain_and_stop(5s); });

  // The idle keep-alive connection is closed at once.
  EXPECT_TRUE(idle.closed_by_peer());
  // The stream in flight runs to its end.
  auto body = streaming.read_rest_of_body();
  auto events = sse_data(body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  drained.wait();
  auto elapsed = std::chrono::steady_clock::now() - started;
  EXPECT_GE(elapsed, 300ms);  // it waited for the stream
  EXPECT_LT(elapsed, 4s);     // and not for the drain timeout
  // Nothing is accepted any more.
  EXPECT_THROW(HttpConnection(gateway.port()).request("GET", "/health"), std::runtime_error);
}

TEST(Lifecycle, DrainTimeoutCutsEndlessStreams) {
  mock::Behaviour behaviour;
  behaviour.fail = "endless";
  behaviour.interval = 20ms;
  auto upstream = start_mock(behaviour);
  TestGateway gateway("models:\n  - name: chat\n    deployments:\n" +
                      deployment_yaml("d1", upstream->base_url()));
  HttpConnection streaming(gateway.port());
  streaming.send("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(streaming.read_head().status, 200u);
  auto started = std::chrono::steady_clock::now();
  gateway.gateway().drain_and_stop(300ms);
  auto elapsed = std::chrono::steady_clock::now() - started;
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 2s);
  EXPECT_TRUE(eventually([&] { return upstream->stats().open_connections == 0; }, 2s));
}

TEST(Lifecycle, AppliedConfigServesNewRequestsWhileInFlightOnesFinish) {
  mock::Behaviour slow_stream;
  slow_stream.interval = 40ms;
  slow_stream.tokens = 8;
  auto old_upstream = start_mock(slow_stream);
  auto new_upstream = start_mock();
  auto config_for = [](const std::string& id, const std::string& url) {
    return "server:\n  listen: 127.0.0.1:0\n  threads: 2\nmodels:\n  - name: chat\n"
           "    deployments:\n" +
           deployment_yaml(id, url);
  };
  TestGateway gateway(config_for("old", old_upstream->base_url()));
  HttpConnection in_flight(gateway.port());
  in_flight.send("POST", "/v1/chat/completions", chat_body("chat", true));
  ASSERT_EQ(in_flight.read_head().header("x-sluice-deployment"), "old");

  gateway.gateway().apply(config::load_string(config_for("new", new_upstream->base_url())));
  auto fresh =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
  EXPECT_EQ(fresh.header("x-sluice-deployment"), "new");
  EXPECT_EQ(sse_data(in_flight.read_rest_of_body()).back(), "[DONE]");
}

TEST(Lifecycle, ApplyReturnsOnceEveryWorkerHasTheNewConfig) {
  auto upstream = start_mock();
  auto config_for = [&](const std::string& id) {
    return "server:\n  listen: 127.0.0.1:0\n  threads: 2\nmodels:\n  - name: chat\n"
           "    deployments:\n" +
           deployment_yaml(id, upstream->base_url());
  };
  TestGateway gateway(config_for("old"));
  // The first worker is busy when the new config arrives, so it can take
  // the config only after that.
  auto& busy = *gateway.gateway().workers().front();
  std::promise<void> started;
  boost::asio::post(busy.context(), [&started] {
    started.set_value();
    std::this_thread::sleep_for(200ms);
  });
  started.get_future().wait();

  auto applied = config::load_string(config_for("new"));
  gateway.gateway().apply(applied);
  // Read from this thread: apply's return orders the workers' replacement
  // before these reads.
  for (auto& worker : gateway.gateway().workers()) {
    EXPECT_EQ(worker->snapshot()->config, applied) << "worker " << worker->index();
  }
  for (int i = 0; i < 8; ++i) {
    auto response =
        http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("chat", false));
    EXPECT_EQ(response.header("x-sluice-deployment"), "new");
  }
}

}  // namespace
}  // namespace sluice::testing

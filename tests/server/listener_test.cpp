// How the gateway takes connections: one listener whose connections are
// handed round the workers, a port another process holds is refused, and the
// connection limit counts the connections of all workers. A test gateway
// never binds a fixed port.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using namespace std::chrono_literals;

// Sockets listening on 127.0.0.1:`port`, as /proc/net/tcp lists them: one
// line per socket, local address in hex, state 0A for LISTEN.
int listening_sockets_on(std::uint16_t port) {
  std::ifstream table("/proc/net/tcp");
  std::ostringstream local;
  local << "0100007F:" << std::uppercase << std::hex;
  local.width(4);
  local.fill('0');
  local << port;
  int count = 0;
  std::string line;
  std::getline(table, line);  // the column names
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local_address, remote_address, state;
    fields >> slot >> local_address >> remote_address >> state;
    if (local_address == local.str() && state == "0A") ++count;
  }
  return count;
}

std::string gateway_yaml(const std::string& server, const std::string& upstream_url) {
  return "server:\n" + server + "models:\n  - name: chat\n    deployments:\n" +
         deployment_yaml("d1", upstream_url, kNoWarmConnections);
}

TEST(Listener, ConnectionsAreSpreadEvenlyOverTheWorkers) {
  auto upstream = start_mock();
  TestGateway gateway(gateway_yaml("  listen: 127.0.0.1:0\n  threads: 3\n", upstream->base_url()));
  EXPECT_EQ(listening_sockets_on(gateway.port()), 1);

  // Held open together: each worker serves a third of them, whatever their
  // addresses (a spread by address, as the kernel's over SO_REUSEPORT
  // listeners, would leave them uneven nearly always).
  std::vector<std::unique_ptr<HttpConnection>> held;
  for (int i = 0; i < 30; ++i) {
    held.push_back(std::make_unique<HttpConnection>(gateway.port()));
    ASSERT_EQ(held.back()->request("GET", "/health").status, 200u);
  }
  std::vector<std::size_t> served;
  std::mutex served_mutex;
  gateway.on_each_worker([&](server::Worker& worker) {
    std::lock_guard lock(served_mutex);
    served.push_back(worker.client_connections());
  });
  EXPECT_EQ(served, (std::vector<std::size_t>{10, 10, 10}));
}

TEST(Listener, APortAnotherGatewayListensOnIsRefused) {
  auto upstream = start_mock();
  TestGateway first(gateway_yaml("  listen: 127.0.0.1:0\n  threads: 2\n", upstream->base_url()));
  const std::string taken = "  listen: 127.0.0.1:" + std::to_string(first.port()) + "\n";
  // The second gateway must find the port taken rather than share it and
  // take part of the connections.
  for (const std::string threads : {"2", "1"}) {
    auto config = config::load_string(gateway_yaml(
        taken + "  threads: " + threads + "\n  admin_listen: off\n", upstream->base_url()));
    server::Gateway second(config);
    EXPECT_THROW(second.start(), std::exception) << "threads: " << threads;
  }
  EXPECT_EQ(listening_sockets_on(first.port()), 1);
  EXPECT_EQ(http_request(first.port(), "GET", "/health").status, 200u);
}

// Test gateways run side by side under `ctest -j`, and beside a gateway a
// developer may be running on the default ports: a test's YAML that names no
// listen address, or another one, must not make the gateway bind it.
TEST(Listener, ATestGatewayListensOnAnEphemeralLoopbackPortWhateverItsYamlSays) {
  auto upstream = start_mock();
  for (const std::string server : {"  threads: 1\n", "  listen: 0.0.0.0:8080\n  threads: 1\n",
                                   "  threads: 1\n  admin_listen: 127.0.0.1:9090\n"}) {
    TestGateway first(gateway_yaml(server, upstream->base_url()));
    TestGateway second(gateway_yaml(server, upstream->base_url()));
    for (auto* gateway : {&first, &second}) {
      EXPECT_NE(gateway->port(), 8080) << server;
      EXPECT_EQ(listening_sockets_on(gateway->port()), 1) << server;
      EXPECT_EQ(listening_sockets_on(gateway->gateway().admin_port()), 1) << server;
      EXPECT_NE(gateway->gateway().admin_port(), 9090) << server;
      EXPECT_EQ(http_request(gateway->port(), "GET", "/health").status, 200u) << server;
    }
    EXPECT_NE(first.port(), second.port());
  }
}

TEST(Listener, TheConnectionLimitCountsTheConnectionsOfAllWorkers) {
  auto upstream = start_mock();
  TestGateway gateway(gateway_yaml("  listen: 127.0.0.1:0\n  threads: 2\n  max_connections: 4\n",
                                   upstream->base_url()));
  std::vector<std::unique_ptr<HttpConnection>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<HttpConnection>(gateway.port()));
    ASSERT_EQ(held.back()->request("GET", "/health").status, 200u);
  }
  for (int i = 0; i < 6; ++i) {
    HttpConnection over(gateway.port());
    auto refused = over.request("GET", "/health");
    EXPECT_EQ(refused.status, 503u);
    auto error = nlohmann::json::parse(refused.body, nullptr, false);
    ASSERT_TRUE(error.contains("error")) << refused.body;
    EXPECT_EQ(error["error"]["code"], "overloaded");
  }
  // A held connection that ends makes room for a new one.
  held.pop_back();
  EXPECT_TRUE(eventually(
      [&] { return http_request(gateway.port(), "GET", "/health").status == 200u; }, 5s));
}

}  // namespace
}  // namespace sluice::testing

#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "mock/mock_server.hpp"
#include "sluice/config/config.hpp"
#include "sluice/server/gateway.hpp"

namespace sluice::testing {

// A gateway running in-process on 127.0.0.1 with an ephemeral port, built
// from a YAML text. `server.listen` defaults to 127.0.0.1:0 and threads to 2
// unless the text sets them.
class TestGateway {
 public:
  explicit TestGateway(const std::string& yaml);
  ~TestGateway();

  std::uint16_t port() const { return gateway_->port(); }
  server::Gateway& gateway() { return *gateway_; }
  config::ConfigPtr config() const { return gateway_->snapshot()->config; }

  // Sum of the pool gauges over all workers.
  std::int64_t idle_upstream_connections();
  std::int64_t active_upstream_connections();
  // Runs `task` on every worker's own thread and returns once all have run it.
  void on_each_worker(const std::function<void(server::Worker&)>& task);
  // Closes every worker's idle pooled connections.
  void close_idle_upstream_connections();

 private:
  std::unique_ptr<server::Gateway> gateway_;
};

// A mock upstream started on an ephemeral port.
std::unique_ptr<mock::MockServer> start_mock(mock::Behaviour behaviour = {}, unsigned threads = 1);

// "- id: ID\n  base_url: URL\n  model: mock-model" indented for a
// deployments list, plus `extra` lines (already in YAML, indented by the caller).
std::string deployment_yaml(const std::string& id, const std::string& base_url,
                            const std::string& extra = "");

// A deployment line for tests that count upstream connections or descriptors:
// warm connections (one per worker by default) would be counted with the
// request's own.
inline const std::string kNoWarmConnections = "        warm_connections: 0\n";

// Waits until `condition` holds or `timeout` passes; returns the last value.
bool eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = std::chrono::seconds(5));

// Raises the soft descriptor limit to the hard one, for this process and the
// children it starts from now on; returns the new soft limit.
std::size_t raise_descriptor_limit();

// A file in the test's temp dir that is removed with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& content, const std::string& suffix = ".tmp");
  ~TempFile();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace sluice::testing

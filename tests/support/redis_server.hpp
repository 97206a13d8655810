#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/child_process.hpp"

namespace sluice::testing {

// A redis-server of the test's own on a loopback port. Redis refuses
// --port 0, so the port is one the kernel just handed out to a socket that
// was closed again; a collision with another process is retried on a new
// port. No persistence: every instance starts empty.
class RedisServer {
 public:
  // An argument replaced by a second port of the server's own, e.g.
  // {"--tls-port", kTlsPortArgument, ...}: the plain port stays open for
  // the test's own commands and the check that it is up.
  static constexpr const char* kTlsPortArgument = "<tls-port>";

  // `arguments` go to redis-server after the port, e.g. {"--requirepass", "x"}.
  explicit RedisServer(std::vector<std::string> arguments = {});
  ~RedisServer();

  std::uint16_t port() const { return port_; }
  std::uint16_t tls_port() const { return tls_port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  void kill();
  // Starts it again on the same port, empty.
  void restart();
  void pause() const;   // SIGSTOP: connections stay open, nothing is answered
  void resume() const;  // SIGCONT

  // A command through a blocking connection of the test's own, e.g.
  // {"GET", "key"}; the raw RESP reply ("" on failure).
  std::string command(const std::vector<std::string>& args, const std::string& password = "") const;

 private:
  bool launch();

  std::vector<std::string> arguments_;
  std::uint16_t port_ = 0;
  std::uint16_t tls_port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

// A loopback port the kernel just handed out and took back: for a server
// that refuses port 0 (redis-server), at the small risk of a collision.
std::uint16_t ephemeral_port();

// A command to a redis-server the test did not start, on `port` of
// 127.0.0.1; the raw RESP reply ("" on failure).
std::string redis_command(std::uint16_t port, const std::vector<std::string>& args);

// The max_parallel permits held in the permit hash `key` (state's format:
// holder -> "count expiry_ms"), summed over the holders; expired entries
// count too, as Redis still has them.
long permits_in(const RedisServer& redis, const std::string& key);

// Whether redis-server is installed (scripts/setup installs it).
std::optional<std::string> redis_server_binary();

}  // namespace sluice::testing

#include "support/redis_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <thread>

namespace sluice::testing {
std::uint16_t ephemeral_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

namespace {

// One command on a fresh blocking connection, bounded by a second.
std::string redis_round_trip(std::uint16_t port, const std::string& payload) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::send(fd, payload.data(), payload.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(payload.size())) {
    char buffer[4096];
    ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) reply.assign(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return reply;
}

std::string resp(const std::vector<std::string>& args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (const auto& arg : args) out += "$" + std::to_string(arg.size()) + "\r\n" + arg + "\r\n";
  return out;
}

}  // namespace

std::optional<std::string> redis_server_binary() {
  for (const char* path : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (std::filesystem::exists(path)) return std::string(path);
  }
  return std::nullopt;
}

RedisServer::RedisServer(std::vector<std::string> arguments) : arguments_(std::move(arguments)) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    port_ = ephemeral_port();
    tls_port_ = 0;
    if (launch()) return;
  }
  throw std::runtime_error("redis-server did not start");
}

RedisServer::~RedisServer() {
  resume();
  kill();
}

bool RedisServer::launch() {
  auto binary = redis_server_binary();
  if (!binary) throw std::runtime_error("redis-server is not installed (scripts/setup)");
  std::vector<std::string> args{"--port", std::to_string(port_), "--bind", "127.0.0.1",   "--save",
                                "",       "--appendonly",        "no",     "--daemonize", "no"};
  for (const auto& argument : arguments_) {
    if (argument != kTlsPortArgument) {
      args.push_back(argument);
      continue;
    }
    if (tls_port_ == 0) tls_port_ = ephemeral_port();
    args.push_back(std::to_string(tls_port_));
  }
  process_ = std::make_unique<ChildProcess>(*binary, args);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (process_->exited()) return false;  // the port was taken meanwhile
    // Any answer will do, NOAUTH included: it is listening.
    if (!redis_round_trip(port_, resp({"PING"})).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void RedisServer::kill() {
  if (!process_) return;
  process_->signal(SIGKILL);
  process_->wait_exit(std::chrono::seconds(5));
  process_.reset();
}

void RedisServer::restart() {
  kill();
  for (int attempt = 0; attempt < 20; ++attempt) {
    if (launch()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw std::runtime_error("redis-server did not start again on its port");
}

void RedisServer::pause() const {
  if (process_) process_->signal(SIGSTOP);
}

void RedisServer::resume() const {
  if (process_) process_->signal(SIGCONT);
}

std::string redis_command(std::uint16_t port, const std::vector<std::string>& args) {
  return redis_round_trip(port, resp(args));
}

std::string RedisServer::command(const std::vector<std::string>& args,
                                 const std::string& password) const {
  std::string payload = password.empty() ? "" : resp({"AUTH", password});
  std::string reply = redis_round_trip(port_, payload + resp(args));
  if (!password.empty()) {
    auto end = reply.find("\r\n");
    reply = end == std::string::npos ? "" : reply.substr(end + 2);
  }
  return reply;
}

long permits_in(const RedisServer& redis, const std::string& key) {
  // HVALS answers "*N\r\n" and N bulk strings "$len\r\ncount expiry\r\n".
  const std::string reply = redis.command({"HVALS", key});
  long total = 0;
  std::size_t at = 0;
  while ((at = reply.find("\r\n$", at)) != std::string::npos) {
    at = reply.find("\r\n", at + 3) + 2;
    total += std::stol(reply.substr(at, reply.find(' ', at) - at));
  }
  return total;
}

}  // namespace sluice::testing

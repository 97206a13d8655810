#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace sluice::testing {

// A raw HTTP/1.1 upstream on 127.0.0.1, for answers sluice-mock does not
// give (interim heads, a connection closed right after its answer). Each
// request, its head and its Content-Length body read whole, is answered with
// what `script` makes of its head: parts written `pause` apart, so that each
// arrives on its own, and the connection closed after them when the reply
// says so. The script runs on the upstream's own thread.
class ScriptedUpstream {
 public:
  struct Reply {
    std::vector<std::string> parts;
    std::chrono::milliseconds pause{0};
    bool then_close = false;
  };
  using Script = std::function<Reply(const std::string& head)>;

  explicit ScriptedUpstream(Script script);
  ~ScriptedUpstream();  // stops and joins
  ScriptedUpstream(const ScriptedUpstream&) = delete;
  ScriptedUpstream& operator=(const ScriptedUpstream&) = delete;

  std::uint16_t port() const { return port_; }
  // "http://127.0.0.1:PORT/v1"
  std::string base_url() const;
  std::uint64_t connections_accepted() const { return connections_accepted_.load(); }
  std::uint64_t requests() const { return requests_.load(); }

 private:
  boost::asio::awaitable<void> accept_connections();
  boost::asio::awaitable<void> answer(boost::asio::ip::tcp::socket connection);

  Script script_;
  boost::asio::io_context context_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::uint16_t port_ = 0;
  std::atomic<std::uint64_t> connections_accepted_{0};
  std::atomic<std::uint64_t> requests_{0};
  std::thread thread_;
};

// The value of the field `name` (any case) in a request head; "" when absent.
std::string field_value(std::string_view head, std::string_view name);

}  // namespace sluice::testing

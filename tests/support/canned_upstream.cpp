#include "support/canned_upstream.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdio>

namespace sluice::testing {

namespace net = boost::asio;
using net::ip::tcp;

std::string chunk(const std::string& data) {
  char size[20];
  const int length = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return std::string(size, static_cast<std::size_t>(length)) + data + "\r\n";
}

CannedUpstream::CannedUpstream(std::vector<std::string> parts)
    : parts_(std::move(parts)), acceptor_(context_, {net::ip::make_address("127.0.0.1"), 0}) {
  net::co_spawn(context_, accept_connections(), net::detached);
  thread_ = std::thread([this] { context_.run(); });
}

CannedUpstream::~CannedUpstream() {
  context_.stop();
  thread_.join();
}

std::string CannedUpstream::base_url() const {
  return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()) + "/v1";
}

net::awaitable<void> CannedUpstream::accept_connections() {
  for (;;) {
    auto [ec, connection] = co_await acceptor_.async_accept(net::as_tuple(net::use_awaitable));
    if (ec) co_return;
    net::co_spawn(context_, answer(std::move(connection)), net::detached);
  }
}

net::awaitable<void> CannedUpstream::answer(tcp::socket connection) {
  std::string received;
  for (;;) {
    auto [ec, head] = co_await net::async_read_until(connection, net::dynamic_buffer(received),
                                                     "\r\n\r\n", net::as_tuple(net::use_awaitable));
    if (ec) co_return;
    // The gateway's requests carry a Content-Length body.
    const auto field = received.substr(0, head).find("Content-Length: ");
    const std::size_t length =
        field == std::string::npos ? 0 : std::stoul(received.substr(field + 16));
    if (received.size() < head + length) {
      auto [body_ec, unused] =
          co_await net::async_read(connection, net::dynamic_buffer(received),
                                   net::transfer_exactly(head + length - received.size()),
                                   net::as_tuple(net::use_awaitable));
      if (body_ec) co_return;
    }
    received.erase(0, head + length);
    for (std::size_t part = 0; part < parts_.size(); ++part) {
      if (part > 0) {
        net::steady_timer pause(context_, std::chrono::milliseconds(30));
        co_await pause.async_wait(net::as_tuple(net::use_awaitable));
      }
      auto [write_ec, written] = co_await net::async_write(connection, net::buffer(parts_[part]),
                                                           net::as_tuple(net::use_awaitable));
      if (write_ec) co_return;
    }
  }
}

}  // namespace sluice::testing

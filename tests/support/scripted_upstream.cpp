#include "support/scripted_upstream.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>

namespace sluice::testing {

namespace net = boost::asio;
using net::as_tuple;
using net::use_awaitable;
using net::ip::tcp;

ScriptedUpstream::ScriptedUpstream(Script script)
    : script_(std::move(script)), acceptor_(context_, {net::ip::make_address("127.0.0.1"), 0}) {
  port_ = acceptor_.local_endpoint().port();
  net::co_spawn(context_, accept_connections(), net::detached);
  thread_ = std::thread([this] { context_.run(); });
}

ScriptedUpstream::~ScriptedUpstream() {
  context_.stop();
  thread_.join();
}

std::string ScriptedUpstream::base_url() const {
  return "http://127.0.0.1:" + std::to_string(port_) + "/v1";
}

net::awaitable<void> ScriptedUpstream::accept_connections() {
  for (;;) {
    auto [ec, connection] = co_await acceptor_.async_accept(as_tuple(use_awaitable));
    if (ec) co_return;
    ++connections_accepted_;
    net::co_spawn(context_, answer(std::move(connection)), net::detached);
  }
}

net::awaitable<void> ScriptedUpstream::answer(tcp::socket connection) {
  std::string received;
  for (;;) {
    auto [ec, head_size] = co_await net::async_read_until(connection, net::dynamic_buffer(received),
                                                          "\r\n\r\n", as_tuple(use_awaitable));
    if (ec) co_return;
    const std::string head = received.substr(0, head_size);
    const std::string length = field_value(head, "Content-Length");
    const std::size_t body_size = length.empty() ? 0 : std::stoul(length);
    if (received.size() < head_size + body_size) {
      auto [body_ec, unused] = co_await net::async_read(
          connection, net::dynamic_buffer(received),
          net::transfer_exactly(head_size + body_size - received.size()), as_tuple(use_awaitable));
      if (body_ec) co_return;
    }
    received.erase(0, head_size + body_size);
    ++requests_;
    const Reply reply = script_(head);
    for (std::size_t part = 0; part < reply.parts.size(); ++part) {
      if (part > 0 && reply.pause.count() > 0) {
        net::steady_timer pause(context_, reply.pause);
        co_await pause.async_wait(as_tuple(use_awaitable));
      }
      auto [write_ec, written] = co_await net::async_write(
          connection, net::buffer(reply.parts[part]), as_tuple(use_awaitable));
      if (write_ec) co_return;
    }
    if (reply.then_close) co_return;
  }
}

std::string field_value(std::string_view head, std::string_view name) {
  for (std::size_t line = head.find("\r\n"); line != std::string_view::npos;) {
    const std::size_t start = line + 2;
    line = head.find("\r\n", start);
    const std::string_view text = head.substr(start, line - start);
    const std::size_t colon = text.find(':');
    if (colon == std::string_view::npos || !boost::beast::iequals(text.substr(0, colon), name)) {
      continue;
    }
    std::string_view value = text.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
    return std::string(value);
  }
  return {};
}

}  // namespace sluice::testing

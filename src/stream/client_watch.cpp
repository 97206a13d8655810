#include "sluice/stream/client_watch.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace sluice::stream {

namespace net = boost::asio;

ClientWatch::ClientWatch(boost::beast::tcp_stream& client)
    : client_(client), finished_signal_(client.get_executor()) {
  finished_signal_.expires_at(net::steady_timer::time_point::max());
}

void ClientWatch::start() {
  running_ = true;
  net::co_spawn(client_.get_executor(), run(), net::detached);
}

net::awaitable<void> ClientWatch::run() {
  auto [ec] = co_await client_.socket().async_wait(net::ip::tcp::socket::wait_read,
                                                   net::as_tuple(net::use_awaitable));
  // Readable with nothing to read is the end of the connection (or a reset);
  // readable with bytes is a pipelined request, left for the session.
  if (!ec) {
    const std::size_t pending = client_.socket().available(ec);
    if (!ec && pending == 0) ec = net::error::eof;
  }
  if (ec && !stopping_) {
    client_gone_ = true;
    for (auto* target : targets_) {
      if (target) target->abort();
    }
  }
  running_ = false;
  finished_signal_.cancel();
}

net::awaitable<void> ClientWatch::stop() {
  if (!running_) co_return;
  stopping_ = true;
  error_code ignored;
  client_.socket().cancel(ignored);
  while (running_) {
    co_await finished_signal_.async_wait(net::as_tuple(net::use_awaitable));
  }
}

void ClientWatch::watch(upstream::AbortHandle* handle) {
  if (client_gone_) {
    handle->abort();
    return;
  }
  for (auto*& target : targets_) {
    if (!target) {
      target = handle;
      return;
    }
  }
}

void ClientWatch::unwatch(upstream::AbortHandle* handle) {
  for (auto*& target : targets_) {
    if (target == handle) target = nullptr;
  }
}

}  // namespace sluice::stream

#include "sluice/upstream/dns_cache.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <memory>

namespace sluice::upstream {

namespace net = boost::asio;
using net::ip::tcp;

net::awaitable<Result<Endpoints, error_code>> DnsCache::resolve(const std::string& host,
                                                                std::uint16_t port,
                                                                TimePoint deadline) {
  error_code parse_error;
  auto address = net::ip::make_address(host, parse_error);
  if (!parse_error) co_return Endpoints{tcp::endpoint(address, port)};

  std::string key = host + ":" + std::to_string(port);
  auto now = Clock::now();
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.expires > now) co_return it->second.endpoints;
  }

  // getaddrinfo runs on Asio's resolver thread; the timer bounds how long the
  // request waits for it.
  auto executor = co_await net::this_coro::executor;
  auto resolver = std::make_shared<tcp::resolver>(executor);
  auto timer = std::make_shared<net::steady_timer>(executor, deadline);
  timer->async_wait([resolver](error_code ec) {
    if (!ec) resolver->cancel();
  });
  auto [ec, results] = co_await resolver->async_resolve(host, std::to_string(port),
                                                        net::as_tuple(net::use_awaitable));
  bool timed_out = timer->expiry() <= Clock::now();
  timer->cancel();
  if (ec) co_return timed_out ? error_code(net::error::timed_out) : ec;
  if (results.empty()) co_return error_code(net::error::host_not_found);

  Endpoints endpoints;
  for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  std::lock_guard lock(mutex_);
  entries_[key] = Entry{endpoints, Clock::now() + ttl_};
  co_return endpoints;
}

}  // namespace sluice::upstream

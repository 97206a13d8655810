#include "sluice/upstream/dns_cache.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

namespace sluice::upstream {

namespace net = boost::asio;
using net::ip::tcp;

net::awaitable<Result<Endpoints, error_code>> DnsCache::resolve(const std::string& host,
                                                                std::uint16_t port,
                                                                TimePoint deadline,
                                                                ResolveWait* wait) {
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

  // The lookup's answer wakes the request by cancelling the deadline timer,
  // as an interrupt does; whichever comes first decides. A late answer finds
  // the request gone and is dropped.
  struct Pending {
    explicit Pending(const net::any_io_executor& executor, TimePoint deadline)
        : wake(executor, deadline) {}
    net::steady_timer wake;
    std::optional<std::pair<error_code, Endpoints>> answer;
  };
  auto executor = co_await net::this_coro::executor;
  auto pending = std::make_shared<Pending>(executor, deadline);
  start_lookup(executor, host, port, deadline, [pending](error_code ec, Endpoints endpoints) {
    if (pending->answer) return;
    pending->answer.emplace(ec, std::move(endpoints));
    pending->wake.cancel();
  });
  error_code woken;
  if (!pending->answer) {
    if (wait) wait->wake_ = &pending->wake;
    std::tie(woken) = co_await pending->wake.async_wait(net::as_tuple(net::use_awaitable));
    if (wait) wait->wake_ = nullptr;
  }
  if (!pending->answer) {
    // Cancelled with no answer: interrupted, not out of time.
    const error_code gone = woken == net::error::operation_aborted ? net::error::operation_aborted
                                                                   : net::error::timed_out;
    // Marks the request as gone for the lookup's late answer.
    pending->answer.emplace(gone, Endpoints{});
    co_return gone;
  }
  auto [ec, endpoints] = std::move(*pending->answer);
  if (ec) co_return ec;
  if (endpoints.empty()) co_return error_code(net::error::host_not_found);

  std::lock_guard lock(mutex_);
  entries_[key] = Entry{endpoints, Clock::now() + ttl_};
  co_return endpoints;
}

void DnsCache::start_lookup(const net::any_io_executor& executor, const std::string& host,
                            std::uint16_t port, TimePoint deadline, LookupDone done) {
  auto resolver = std::make_shared<tcp::resolver>(executor);
  // Cancelling drops the lookup if it is still queued behind another on the
  // resolver thread; one already in getaddrinfo runs to its end.
  auto timer = std::make_shared<net::steady_timer>(executor, deadline);
  timer->async_wait([resolver](error_code ec) {
    if (!ec) resolver->cancel();
  });
  resolver->async_resolve(host, std::to_string(port),
                          [resolver, timer, done = std::move(done)](
                              error_code ec, tcp::resolver::results_type results) {
                            timer->cancel();
                            Endpoints endpoints;
                            for (const auto& entry : results) endpoints.push_back(entry.endpoint());
                            done(ec, std::move(endpoints));
                          });
}

}  // namespace sluice::upstream

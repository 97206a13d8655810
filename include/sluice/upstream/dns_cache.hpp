#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/common/result.hpp"
#include "sluice/http/network_errors.hpp"

namespace sluice::upstream {

using Endpoints = std::vector<boost::asio::ip::tcp::endpoint>;

// Lets another coroutine on the same thread end a resolve's wait (an attempt
// aborted while its upstream is looked up): the resolve returns
// operation_aborted at once. The lookup itself goes on and its answer is
// dropped, as one after the deadline is; other resolves of the same name
// wait on their own.
class ResolveWait {
 public:
  // Does nothing when no resolve is waiting.
  void interrupt() {
    if (wake_) wake_->cancel();
  }

 private:
  friend class DnsCache;
  boost::asio::steady_timer* wake_ = nullptr;
};

// Asynchronous name resolution with a shared TTL cache. Only the connect path
// uses it, so one mutex around the map costs nothing per request.
class DnsCache {
 public:
  using LookupDone = std::function<void(error_code, Endpoints)>;

  explicit DnsCache(std::chrono::milliseconds ttl) : ttl_(ttl) {}
  virtual ~DnsCache() = default;
  DnsCache(const DnsCache&) = delete;
  DnsCache& operator=(const DnsCache&) = delete;

  // Resolves with a deadline; IP literals never reach the resolver. The
  // deadline holds even when the lookup itself does not end: a getaddrinfo
  // call in progress cannot be cancelled, so the request stops waiting for
  // it rather than stopping it.
  // `wait`, when given, may end the wait early (ResolveWait::interrupt).
  boost::asio::awaitable<Result<Endpoints, error_code>> resolve(const std::string& host,
                                                                std::uint16_t port,
                                                                TimePoint deadline,
                                                                ResolveWait* wait = nullptr);

 protected:
  // Starts the system lookup (getaddrinfo on Asio's resolver thread); `done`
  // runs on `executor`, at most once, possibly after `deadline`. A seam for
  // tests, which stand in lookups that never end.
  virtual void start_lookup(const boost::asio::any_io_executor& executor, const std::string& host,
                            std::uint16_t port, TimePoint deadline, LookupDone done);

 private:
  struct Entry {
    Endpoints endpoints;
    TimePoint expires;
  };
  std::chrono::milliseconds ttl_;
  std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace sluice::upstream

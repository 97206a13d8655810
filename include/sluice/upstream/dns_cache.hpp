#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/common/errors.hpp"
#include "sluice/common/result.hpp"

namespace sluice::upstream {

using Endpoints = std::vector<boost::asio::ip::tcp::endpoint>;

// Asynchronous name resolution with a shared TTL cache. Only the connect path
// uses it, so one mutex around the map costs nothing per request.
class DnsCache {
 public:
  explicit DnsCache(std::chrono::milliseconds ttl) : ttl_(ttl) {}

  // Resolves with a deadline; IP literals never reach the resolver.
  boost::asio::awaitable<Result<Endpoints, error_code>> resolve(const std::string& host,
                                                                std::uint16_t port,
                                                                TimePoint deadline);

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

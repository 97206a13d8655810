#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "sluice/common/clock.hpp"
#include "sluice/upstream/connection.hpp"

namespace sluice::upstream {

struct PoolOptions {
  unsigned max_idle_per_origin = 1024;
  std::chrono::milliseconds idle_expiry{60000};
};

// Gauges readable from any thread (metrics, tests); written by the owner.
struct PoolCounters {
  std::atomic<std::int64_t> idle{0};
  std::atomic<std::int64_t> active{0};
  std::atomic<std::uint64_t> opened{0};
  std::atomic<std::uint64_t> reused{0};
};

// Idle keep-alive connections per origin. One pool per event-loop thread, used
// only from that thread: taking and returning a connection needs no lock.
// Most recently used first, so the warmest connection is reused and the rest
// age out.
class Pool {
 public:
  explicit Pool(PoolOptions options) : options_(options) {}
  ~Pool();

  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  std::unique_ptr<Connection> take(const std::string& origin_key, TimePoint now);
  // Keeps the connection for reuse, or closes it when the origin already has
  // max_idle_per_origin idle ones.
  void give_back(std::unique_ptr<Connection> connection, TimePoint now) noexcept;
  // Closes idle connections unused for idle_expiry or closed by the peer.
  void close_expired(TimePoint now);
  std::size_t idle_count(const std::string& origin_key) const;
  void close_all();
  // At shutdown: closes the idle connections and every connection given back
  // later, so none outlives the event loop it belongs to.
  void shut_down() {
    shut_down_ = true;
    close_all();
  }

  // Bookkeeping for connections handed out, so the gauges stay right.
  void note_opened() {
    counters_.opened.fetch_add(1, std::memory_order_relaxed);
    counters_.active.fetch_add(1, std::memory_order_relaxed);
  }
  void note_discarded() { counters_.active.fetch_sub(1, std::memory_order_relaxed); }
  // An HTTP/2 connection never sits in the idle stacks: it is shared while
  // it is out, and counts as idle whenever it carries no stream.
  void note_streams_ended() {
    counters_.active.fetch_sub(1, std::memory_order_relaxed);
    counters_.idle.fetch_add(1, std::memory_order_relaxed);
  }
  void note_streams_began() {
    counters_.idle.fetch_sub(1, std::memory_order_relaxed);
    counters_.active.fetch_add(1, std::memory_order_relaxed);
  }

  const PoolCounters& counters() const { return counters_; }
  const PoolOptions& options() const { return options_; }

 private:
  PoolOptions options_;
  PoolCounters counters_;
  std::unordered_map<std::string, std::vector<std::unique_ptr<Connection>>> idle_;
  bool shut_down_ = false;
};

}  // namespace sluice::upstream

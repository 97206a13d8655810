#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/intrusive/list.hpp>
#include <chrono>
#include <cstdint>
#include <string>

#include "sluice/config/config.hpp"
#include "sluice/state/redis_client.hpp"

// A worker's part of the shared state backend (state.backend: redis): its
// own connection to Redis, and the max_parallel leases its requests hold,
// renewed together by one timer rather than one per request.
namespace sluice::server {

// How long a max_parallel permit outlives the last renewal of its holder:
// what a crashed instance's requests keep a key's slots for.
inline constexpr std::chrono::milliseconds kLeaseTtl{10000};
inline constexpr std::chrono::milliseconds kLeaseRenewal{3000};

struct SharedLease {
  std::string set;  // the key's lease set in Redis
  std::string id;   // unique across instances
  boost::intrusive::list_member_hook<boost::intrusive::link_mode<boost::intrusive::auto_unlink>>
      hook;

  bool held() const { return hook.is_linked(); }
};

class Worker;

// How often an instance publishes its new cooldowns and reads the others':
// a deployment cooled down anywhere is skipped everywhere within two ticks.
inline constexpr std::chrono::milliseconds kCooldownTick{250};

// Shares the deployments' cooldowns through Redis, on `worker`'s loop (one
// per instance), until the worker stops. Polled rather than pushed by
// pub/sub: a subscription needs a connection of its own per instance, which
// can lose messages while it reconnects, and every instance must claim the
// recovery probe through Redis anyway; a read every tick of one script over
// all deployments costs one round trip, and a missed tick loses nothing.
boost::asio::awaitable<void> share_cooldowns(Worker& worker);

class WorkerState {
 public:
  WorkerState(boost::asio::io_context& context, const config::State& settings,
              state::BackendStatus& status, std::uint64_t seed);

  void start();
  void stop();
  bool stopped() const { return stopped_; }
  std::uint64_t instance() const { return instance_; }
  state::RedisClient& redis() { return redis_; }
  const config::State& settings() const { return settings_; }

  // A lease id no other request of any instance uses.
  std::string next_lease_id();
  void hold(SharedLease& lease) { leases_.push_back(lease); }
  // Gives the permit back at once (not waiting for Redis's answer).
  void release(SharedLease& lease);

 private:
  boost::asio::awaitable<void> renew_leases();

  const config::State settings_;
  state::RedisClient redis_;
  boost::asio::steady_timer renewal_;
  std::uint64_t instance_;
  std::uint64_t next_lease_ = 0;
  bool stopped_ = false;
  boost::intrusive::list<
      SharedLease,
      boost::intrusive::member_hook<SharedLease, decltype(SharedLease::hook), &SharedLease::hook>,
      boost::intrusive::constant_time_size<false>>
      leases_;
};

}  // namespace sluice::server

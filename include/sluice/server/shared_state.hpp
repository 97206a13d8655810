#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/intrusive/list.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sluice/auth/key_store.hpp"
#include "sluice/config/config.hpp"
#include "sluice/state/redis_client.hpp"

// A worker's part of the shared state backend (state.backend: redis): its
// own connection to Redis, and the max_parallel leases its requests hold,
// renewed together by one timer rather than one per request.
namespace sluice::server {

class WorkerState;
struct Snapshot;

// A max_parallel permit in Redis (of a key or a deployment), renewed by its
// worker every third of state.lease_ttl while held; one still held when it
// is destroyed (an attempt's, when the attempt ends) is given back then.
struct SharedLease {
  SharedLease() = default;
  SharedLease(const SharedLease&) = delete;
  SharedLease& operator=(const SharedLease&) = delete;
  ~SharedLease();

  std::string set;  // the key's or deployment's lease set in Redis
  std::string id;   // unique across instances
  WorkerState* owner = nullptr;
  boost::intrusive::list_member_hook<boost::intrusive::link_mode<boost::intrusive::auto_unlink>>
      hook;

  bool held() const { return hook.is_linked(); }
};

class Worker;

// The Redis key names and fixed script arguments of one client key's or one
// deployment's shared limits: the same for every request under one config
// snapshot, so made with the snapshot (Snapshot::key_budgets, and each
// deployment's wiring) rather than per request. Keys are hash-tagged by the
// client key or deployment, so that they share a Redis Cluster slot, and
// named with their limit: a changed limit starts afresh, as a local budget
// does on a reload.
struct SharedBudget {
  std::string rpm_key;
  std::string tpm_key;
  std::string parallel_key;
  std::string interval_ns;  // the rpm GCRA's, "0" for no rpm
  std::string window_ns;
  std::string max_parallel;
  std::string lease_ttl_ms;
};

SharedBudget shared_key_budget(const config::State& settings, const auth::KeyPolicy& key);
SharedBudget shared_deployment_budget(const config::State& settings,
                                      const config::Deployment& deployment);

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

// Redis's answer to one request under a SharedBudget's limits (see
// state::budget_script): refused 0 admitted, 1 max_parallel, 2 rpm, 3 tpm;
// how far each TAT stood ahead of now before the request.
struct AdmitAnswer {
  long long refused = 0;
  long long rpm_owed_ns = 0;
  long long tpm_owed_ns = 0;
};

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
  void hold(SharedLease& lease) {
    lease.owner = this;
    leases_.push_back(lease);
  }
  // Gives the permit back at once (not waiting for Redis's answer).
  void release(SharedLease& lease);
  // Stops renewing a permit the caller gives back itself.
  void forget(SharedLease& lease) { lease.hook.unlink(); }

  // Asks Redis to admit one request under `budget` (of the snapshot
  // `keep_alive`): its estimate's cost in ns ("0" for none) and, with
  // max_parallel, its lease id. A lone request is sent at once; requests of
  // the same budget that come while a call for it is in flight go together
  // in the next call, one script for all, so that under load Redis runs a
  // script per batch rather than per request. Nothing when Redis does not
  // answer.
  boost::asio::awaitable<std::optional<AdmitAnswer>> admit(
      const SharedBudget& budget, const std::shared_ptr<const Snapshot>& keep_alive,
      bool tpm_limited, std::string_view cost, std::string_view lease_id);

  // Gives back what a request of client key `budget` reserved and did not
  // spend: `delta_ns` moves its tpm TAT (negative refunds, 0 leaves it),
  // and its max_parallel `lease` (or null) is released. Batched as admit's
  // calls are, and carried by the budget's next admission call when one is
  // in flight; nothing waits for the answer.
  void settle(const SharedBudget& budget, const std::shared_ptr<const Snapshot>& keep_alive,
              std::int64_t delta_ns, SharedLease* lease);

 private:
  struct AdmitWaiter;
  struct AdmitQueue {
    std::shared_ptr<const Snapshot> keep_alive;
    bool tpm_limited = false;
    std::vector<std::shared_ptr<AdmitWaiter>> waiting;
  };
  struct Settlement {
    std::string delta_ns;
    std::string lease_id;  // "" for none
  };
  struct SettleQueue {
    WorkerState* owner = nullptr;
    const SharedBudget* budget = nullptr;
    std::shared_ptr<const Snapshot> keep_alive;
    std::vector<Settlement> waiting;
    std::vector<Settlement> in_flight;
  };
  boost::asio::awaitable<void> renew_leases();
  boost::asio::awaitable<void> send_admits(const SharedBudget* budget);
  // Sends the queue's next batch, or forgets the queue when none is left.
  void send_settlements(SettleQueue& queue);
  static void settlements_sent(void* queue);

  const config::State settings_;
  state::RedisClient redis_;
  boost::asio::steady_timer renewal_;
  std::uint64_t instance_;
  std::uint64_t next_lease_ = 0;
  bool stopped_ = false;
  // A budget has a queue while a call for it is in flight.
  std::unordered_map<const SharedBudget*, AdmitQueue> admits_;
  std::unordered_map<const SharedBudget*, SettleQueue> settlements_;
  boost::intrusive::list<
      SharedLease,
      boost::intrusive::member_hook<SharedLease, decltype(SharedLease::hook), &SharedLease::hook>,
      boost::intrusive::constant_time_size<false>>
      leases_;
};

// Whether a deployment has limits the instances share: its rpm and a fixed
// max_parallel (`max_parallel: auto` follows each instance's own latency).
inline bool has_shared_limits(const config::Deployment& deployment) {
  return deployment.rpm > 0 || (deployment.max_parallel > 0 && !deployment.max_parallel_auto);
}

enum class SharedDeploymentVerdict { admitted, at_limit, unavailable };

// Takes an rpm unit and, with max_parallel, a lease (into `lease`, renewed
// until it is destroyed) of `deployment` (whose `budget` it is, owned by
// `keep_alive`) in Redis, by the key limits' script:
// the same GCRA, keys hash-tagged per deployment. `unavailable` when Redis
// does not answer: the caller falls back on state.on_unavailable.
boost::asio::awaitable<SharedDeploymentVerdict> take_shared_deployment_limits(
    WorkerState& shared, const config::Deployment& deployment, const SharedBudget& budget,
    const std::shared_ptr<const Snapshot>& keep_alive, std::unique_ptr<SharedLease>& lease);

}  // namespace sluice::server

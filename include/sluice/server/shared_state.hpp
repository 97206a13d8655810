#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
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
// own connection to Redis, and the max_parallel permits its requests hold,
// counted per budget and renewed together by one timer.
namespace sluice::server {

class WorkerState;
struct Snapshot;

struct SharedBudget;

// A max_parallel permit in Redis (of a key or a deployment). A worker
// counts the permits its requests hold per budget and writes that count to
// Redis as its own entry, renewed every third of state.lease_ttl while it
// is above zero: an instance that dies stops renewing, and its entries
// expire. A permit still held when it is destroyed (an attempt's, when the
// attempt ends) is given back then.
class SharedLease {
 public:
  SharedLease(WorkerState& owner, const SharedBudget& budget,
              std::shared_ptr<const Snapshot> keep_alive, long& count)
      : owner_(&owner), budget_(&budget), keep_alive_(std::move(keep_alive)), count_(&count) {}
  SharedLease(const SharedLease&) = delete;
  SharedLease& operator=(const SharedLease&) = delete;
  ~SharedLease();

  bool held() const { return count_ != nullptr; }

 private:
  friend class WorkerState;
  WorkerState* owner_;
  const SharedBudget* budget_;
  std::shared_ptr<const Snapshot> keep_alive_;  // the budget's
  long* count_;                                 // the worker's count for the budget
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
  std::string max_parallel;  // "0" for none
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
// how far each TAT stood ahead of now before the request; and, when it was
// admitted under a max_parallel, its permit.
struct AdmitAnswer {
  long long refused = 0;
  long long rpm_owed_ns = 0;
  long long tpm_owed_ns = 0;
  std::unique_ptr<SharedLease> permit;
};

// How long the settlements of a budget that is admitting (its last
// admission call went less than this long ago) may wait for its next
// admission call to ride on: under load one comes sooner, and Redis runs
// a script per batch of admissions rather than one more for the
// settlements. Permits given back wait only while Redis last counted at
// most half of max_parallel in use, where a moment's delay refuses
// nobody; a quiet budget, or one near its limit, settles at once, so
// that a permit given back is free on every instance a round trip later.
inline constexpr std::chrono::milliseconds kSettlementWait{5};

class WorkerState {
 public:
  // `settlement_wait`: kSettlementWait, but for tests.
  WorkerState(boost::asio::io_context& context, const config::State& settings,
              state::BackendStatus& status, std::uint64_t seed,
              std::chrono::steady_clock::duration settlement_wait = kSettlementWait);

  void start();
  void stop();
  bool stopped() const { return stopped_; }
  std::uint64_t instance() const { return instance_; }
  state::RedisClient& redis() { return redis_; }
  const config::State& settings() const { return settings_; }

  // Asks Redis to admit one request under `budget` (of the snapshot
  // `keep_alive`), its estimate's cost in ns ("0" for none). A lone request
  // is sent at once; requests of the same budget that come while a call for
  // it is in flight go together in the next call, one script for all, so
  // that under load Redis runs a script per batch rather than per request.
  // Nothing when Redis does not answer.
  boost::asio::awaitable<std::optional<AdmitAnswer>> admit(
      const SharedBudget& budget, const std::shared_ptr<const Snapshot>& keep_alive,
      bool tpm_limited, std::string_view cost);

  // Gives back what a request of client key `budget` reserved and did not
  // spend: `delta_ns` moves its tpm TAT (negative refunds, 0 leaves it),
  // and its max_parallel `lease` (or null) is released. Nothing waits for
  // Redis: the settlements of a budget ride in its admission call in
  // flight, or in its next one within kSettlementWait, in order and ahead
  // of its requests; otherwise they go in a call of their own.
  void settle(const SharedBudget& budget, const std::shared_ptr<const Snapshot>& keep_alive,
              std::int64_t delta_ns, SharedLease* lease);

  // How many permits of the budget whose lease set is `parallel_key` this
  // worker's requests hold (none for a budget without max_parallel).
  long permits_held(const std::string& parallel_key) const;

 private:
  struct AdmitWaiter;
  struct AdmitQueue {
    std::shared_ptr<const Snapshot> keep_alive;
    bool tpm_limited = false;
    std::vector<std::shared_ptr<AdmitWaiter>> waiting;
  };
  struct SettleQueue {
    WorkerState* owner = nullptr;
    const SharedBudget* budget = nullptr;
    std::shared_ptr<const Snapshot> keep_alive;
    std::vector<std::string> waiting;    // tpm deltas, ns
    std::vector<std::string> in_flight;  // what the call out carries
    bool calling = false;                // a call of the queue's own is out
    bool permits_given_back = false;     // the count in Redis is to be written anew
  };
  boost::asio::awaitable<void> renew_leases();
  boost::asio::awaitable<void> send_admits(const SharedBudget* budget);
  // Sends the queue's next batch, or forgets the queue when none is left.
  void send_settlements(SettleQueue& queue);
  // Sends the queue's settlements now, or lets them wait for a ride.
  void settle_or_wait(SettleQueue& queue);
  bool may_wait(const SharedBudget& budget, bool permits_given_back) const;
  // Sends, after the settlement wait, the settlements no admission call
  // took.
  void wait_for_a_ride();
  void note_admission_call(const SharedBudget* budget);
  static void settlements_sent(void* queue);

  const config::State settings_;
  state::RedisClient redis_;
  boost::asio::steady_timer renewal_;
  const std::chrono::steady_clock::duration settlement_wait_;
  boost::asio::steady_timer settlement_timer_;
  bool settlement_timer_armed_ = false;
  // A budget's last admission call: when it went, and the permits in use
  // across the instances that its answer reported.
  struct AdmissionCall {
    std::chrono::steady_clock::time_point sent_at;
    long long permits_in_use = 0;
  };
  std::unordered_map<const SharedBudget*, AdmissionCall> admission_calls_;
  std::uint64_t instance_;
  std::string holder_;  // this worker's entry in the budgets' permit counts
  bool stopped_ = false;
  // A budget has a queue while a call for it is in flight.
  std::unordered_map<const SharedBudget*, AdmitQueue> admits_;
  std::unordered_map<const SharedBudget*, SettleQueue> settlements_;
  // Permits held per lease set: by key name, so that two snapshots whose
  // budgets share a set count together. A count stays in place while a
  // permit points at it; it is dropped when it falls to zero.
  std::unordered_map<std::string, long> permits_;
};

// Whether a deployment has limits the instances share: its rpm and a fixed
// max_parallel (`max_parallel: auto` follows each instance's own latency).
inline bool has_shared_limits(const config::Deployment& deployment) {
  return deployment.rpm > 0 || (deployment.max_parallel > 0 && !deployment.max_parallel_auto);
}

enum class SharedDeploymentVerdict { admitted, at_limit, unavailable };

// Takes an rpm unit and, with max_parallel, a permit (into `lease`, held
// until it is destroyed) of a deployment's `budget` (owned by `keep_alive`)
// in Redis, by the key limits' script:
// the same GCRA, keys hash-tagged per deployment. `unavailable` when Redis
// does not answer: the caller falls back on state.on_unavailable.
boost::asio::awaitable<SharedDeploymentVerdict> take_shared_deployment_limits(
    WorkerState& shared, const SharedBudget& budget,
    const std::shared_ptr<const Snapshot>& keep_alive, std::unique_ptr<SharedLease>& lease);

}  // namespace sluice::server

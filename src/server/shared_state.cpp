#include "sluice/server/shared_state.hpp"

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <optional>
#include <vector>

#include "sluice/state/limit_scripts.hpp"

namespace sluice::server {

namespace net = boost::asio;

WorkerState::WorkerState(net::io_context& context, const config::State& settings,
                         state::BackendStatus& status, std::uint64_t seed)
    : settings_(settings),
      redis_(context, settings.redis, status, seed),
      renewal_(context),
      instance_(seed) {}

void WorkerState::start() {
  redis_.start();
  net::co_spawn(renewal_.get_executor(), renew_leases(), net::detached);
}

void WorkerState::stop() {
  stopped_ = true;
  renewal_.cancel();
  redis_.stop();
}

std::string WorkerState::next_lease_id() {
  char text[40];
  int length =
      std::snprintf(text, sizeof text, "%016llx.%llx", static_cast<unsigned long long>(instance_),
                    static_cast<unsigned long long>(++next_lease_));
  return std::string(text, static_cast<std::size_t>(length));
}

SharedLease::~SharedLease() {
  if (held() && owner != nullptr) owner->release(*this);
}

void WorkerState::release(SharedLease& lease) {
  lease.hook.unlink();
  std::array<std::string_view, 3> remove{"ZREM", lease.set, lease.id};
  redis_.send(remove);
}

namespace {

// One script call takes at most this many requests: its arguments stay far
// below what Lua's unpack takes.
constexpr std::size_t kMostRequestsPerCall = 128;

// The most a key's tokens may owe in Redis: 2^52 ns (about 52 days), where
// the scripts' doubles are still exact. The local bucket's cap is a year,
// which no sane budget reaches either.
constexpr std::string_view kMostSharedDebtNs = "4503599627370496";

// Moves the first requests of `waiting` (as many as one call takes) into
// `batch`.
template <class Entry>
void take_batch(std::vector<Entry>& waiting, std::vector<Entry>& batch) {
  const auto count = static_cast<std::ptrdiff_t>(std::min(waiting.size(), kMostRequestsPerCall));
  batch.assign(std::make_move_iterator(waiting.begin()),
               std::make_move_iterator(waiting.begin() + count));
  waiting.erase(waiting.begin(), waiting.begin() + count);
}

// The keys of a budget_script call for `budget`.
std::array<std::string_view, 3> budget_keys(const SharedBudget& budget) {
  return {budget.rpm_key, budget.tpm_key, budget.parallel_key};
}

// Starts a budget_script call's arguments: the budget's fixed ones, then
// `settlements` (counted into `count`, which `args` points into); the
// requests to judge, if any, go after them.
template <class Settlements>
void begin_budget_call(const SharedBudget& budget, std::string_view tpm_limited,
                       const Settlements& settlements, std::string& count,
                       std::vector<std::string_view>& args) {
  count = std::to_string(settlements.size());
  args.assign({budget.interval_ns, budget.window_ns, tpm_limited, budget.max_parallel,
               budget.lease_ttl_ms, kMostSharedDebtNs, count});
  for (const auto& settlement : settlements) {
    args.push_back(settlement.delta_ns);
    args.push_back(settlement.lease_id);
  }
}

}  // namespace

struct WorkerState::AdmitWaiter {
  AdmitWaiter(const net::any_io_executor& executor, std::string_view cost,
              std::string_view lease_id)
      : cost(cost), lease_id(lease_id), wake(executor) {}
  std::string cost;
  std::string lease_id;
  std::optional<AdmitAnswer> answer;
  net::steady_timer wake;  // cancelled when the answer is in, or is not coming
};

net::awaitable<std::optional<AdmitAnswer>> WorkerState::admit(
    const SharedBudget& budget, const std::shared_ptr<const Snapshot>& keep_alive, bool tpm_limited,
    std::string_view cost, std::string_view lease_id) {
  // Shared with the call that answers it: a request that stops waiting
  // leaves nothing behind that the answer would write to.
  auto waiter = std::make_shared<AdmitWaiter>(renewal_.get_executor(), cost, lease_id);
  auto [queue, first] = admits_.try_emplace(&budget);
  queue->second.waiting.push_back(waiter);
  if (first) {
    queue->second.keep_alive = keep_alive;
    queue->second.tpm_limited = tpm_limited;
    // This request goes at once; those that come while it is in flight
    // wait for the next call.
    net::co_spawn(renewal_.get_executor(), send_admits(&budget), net::detached);
  }
  waiter->wake.expires_at(net::steady_timer::time_point::max());
  co_await waiter->wake.async_wait(net::as_tuple(net::use_awaitable));
  co_return waiter->answer;
}

net::awaitable<void> WorkerState::send_admits(const SharedBudget* budget) {
  std::vector<std::shared_ptr<AdmitWaiter>> batch;
  std::vector<Settlement> riding;
  std::string riding_count;
  std::vector<std::string_view> args;
  for (;;) {
    auto queue = admits_.find(budget);
    if (queue->second.waiting.empty()) {
      admits_.erase(queue);
      // Settlements that waited for this call's end go on their own.
      if (auto parked = settlements_.find(budget);
          parked != settlements_.end() && parked->second.in_flight.empty()) {
        send_settlements(parked->second);
      }
      co_return;
    }
    take_batch(queue->second.waiting, batch);
    // The budget's settlements ride along, unless a call of their own is
    // out: one script for both, ahead of the admissions, as they came.
    if (auto parked = settlements_.find(budget);
        parked != settlements_.end() && parked->second.in_flight.empty()) {
      take_batch(parked->second.waiting, riding);
      if (parked->second.waiting.empty()) settlements_.erase(parked);
    }
    // The budget lives while the call is in flight, whatever its requests
    // do meanwhile.
    const std::shared_ptr<const Snapshot> keep_alive = queue->second.keep_alive;
    const auto keys = budget_keys(*budget);
    begin_budget_call(*budget, queue->second.tpm_limited ? "1" : "0", riding, riding_count, args);
    for (const auto& waiter : batch) {
      args.push_back(waiter->cost);
      args.push_back(waiter->lease_id);
    }
    auto reply = co_await redis_.eval(state::budget_script(), keys, args);
    riding.clear();
    const bool whole = reply && reply->type == state::Reply::Type::array &&
                       reply->elements.size() == 3 * batch.size();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& waiter = *batch[i];
      if (whole) {
        const auto* triple = &reply->elements[3 * i];
        if (triple[0].type == state::Reply::Type::integer &&
            triple[1].type == state::Reply::Type::integer &&
            triple[2].type == state::Reply::Type::integer) {
          waiter.answer = AdmitAnswer{triple[0].integer, triple[1].integer, triple[2].integer};
        }
      }
      waiter.wake.cancel();
    }
    batch.clear();
  }
}

void WorkerState::settle(const SharedBudget& budget,
                         const std::shared_ptr<const Snapshot>& keep_alive, std::int64_t delta_ns,
                         SharedLease* lease) {
  auto [queue, first] = settlements_.try_emplace(&budget);
  Settlement settlement{std::to_string(delta_ns), {}};
  if (lease != nullptr) {
    settlement.lease_id = std::move(lease->id);
    forget(*lease);
  }
  queue->second.waiting.push_back(std::move(settlement));
  if (first) {
    queue->second.owner = this;
    queue->second.budget = &budget;
    queue->second.keep_alive = keep_alive;
    send_settlements(queue->second);
  }
}

// One call per budget in flight, and no coroutine or timer for it: the
// client calls back when its reply is in or the connection is lost. A
// queue's address stays put in the map while the call is out. While an
// admission call of the budget is out, the settlements wait for it and go
// with the next one, or on their own once it ends (send_admits).
void WorkerState::send_settlements(SettleQueue& queue) {
  std::vector<std::string_view> args;
  std::string count;
  while (!queue.waiting.empty()) {
    if (admits_.contains(queue.budget)) return;
    take_batch(queue.waiting, queue.in_flight);
    begin_budget_call(*queue.budget, "0", queue.in_flight, count, args);
    if (redis_.send_eval(state::budget_script(), budget_keys(*queue.budget), args,
                         state::Completion{&settlements_sent, &queue}))
      return;
    // Redis is away: what could not be sent is lost, as a lost reply is.
    queue.in_flight.clear();
  }
  settlements_.erase(queue.budget);
}

void WorkerState::settlements_sent(void* queue) {
  auto& sent = *static_cast<SettleQueue*>(queue);
  sent.in_flight.clear();
  sent.owner->send_settlements(sent);
}

net::awaitable<void> WorkerState::renew_leases() {
  std::vector<std::string_view> keys;
  std::vector<std::string_view> args;
  const std::string ttl = std::to_string(settings_.lease_ttl.count());
  while (!stopped_) {
    renewal_.expires_after(settings_.lease_ttl / 3);
    co_await renewal_.async_wait(net::as_tuple(net::use_awaitable));
    if (stopped_) break;
    if (leases_.empty()) continue;
    keys.clear();
    args.clear();
    args.push_back(ttl);
    for (const SharedLease& lease : leases_) {
      keys.push_back(lease.set);
      args.push_back(lease.id);
    }
    redis_.send_eval(state::renew_script(), keys, args);
  }
}

}  // namespace sluice::server

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
                         state::BackendStatus& status, std::uint64_t seed,
                         std::chrono::steady_clock::duration settlement_wait)
    : settings_(settings),
      redis_(context, settings.redis, status, seed),
      renewal_(context),
      settlement_wait_(settlement_wait),
      settlement_timer_(context),
      instance_(seed) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(instance_));
  holder_ = text;
}

void WorkerState::start() {
  redis_.start();
  net::co_spawn(renewal_.get_executor(), renew_leases(), net::detached);
}

void WorkerState::stop() {
  stopped_ = true;
  renewal_.cancel();
  settlement_timer_.cancel();
  redis_.stop();
}

SharedLease::~SharedLease() {
  if (held()) owner_->settle(*budget_, keep_alive_, 0, this);
}

long WorkerState::permits_held(const std::string& parallel_key) const {
  auto found = permits_.find(parallel_key);
  return found == permits_.end() ? 0 : found->second;
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

bool has_permits(const SharedBudget& budget) { return budget.max_parallel != "0"; }

// The numbers a budget_script call's arguments point into.
struct CallNumbers {
  std::string permits;
  std::string settlements;
};

// Starts a budget_script call's arguments: the budget's fixed ones, this
// worker's entry (`holder`) and its count of permits, then `settlements`;
// the requests to judge, if any, go after them.
void begin_budget_call(const SharedBudget& budget, std::string_view tpm_limited,
                       std::string_view holder, long permits,
                       const std::vector<std::string>& settlements, CallNumbers& numbers,
                       std::vector<std::string_view>& args) {
  numbers.permits = std::to_string(permits);
  numbers.settlements = std::to_string(settlements.size());
  args.assign({budget.interval_ns, budget.window_ns, tpm_limited, budget.max_parallel,
               budget.lease_ttl_ms, kMostSharedDebtNs, holder, numbers.permits,
               numbers.settlements});
  args.insert(args.end(), settlements.begin(), settlements.end());
}

}  // namespace

struct WorkerState::AdmitWaiter {
  AdmitWaiter(const net::any_io_executor& executor, std::string_view cost)
      : cost(cost), wake(executor) {}
  std::string cost;
  std::optional<AdmitAnswer> answer;
  net::steady_timer wake;  // cancelled when the answer is in, or is not coming
};

net::awaitable<std::optional<AdmitAnswer>> WorkerState::admit(
    const SharedBudget& budget, const std::shared_ptr<const Snapshot>& keep_alive, bool tpm_limited,
    std::string_view cost) {
  // Shared with the call that answers it: a request that stops waiting
  // leaves nothing behind that the answer would write to, and a permit it
  // would have held is given back with the waiter.
  auto waiter = std::make_shared<AdmitWaiter>(renewal_.get_executor(), cost);
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
  co_return std::move(waiter->answer);
}

net::awaitable<void> WorkerState::send_admits(const SharedBudget* budget) {
  std::vector<std::shared_ptr<AdmitWaiter>> batch;
  std::vector<std::string> riding;
  CallNumbers numbers;
  std::vector<std::string_view> args;
  for (;;) {
    auto queue = admits_.find(budget);
    if (queue->second.waiting.empty()) {
      admits_.erase(queue);
      // Settlements that came during this call go now, or wait on for the
      // next one.
      if (auto parked = settlements_.find(budget);
          parked != settlements_.end() && !parked->second.calling) {
        settle_or_wait(parked->second);
      }
      co_return;
    }
    take_batch(queue->second.waiting, batch);
    // The budget's settlements ride along, unless a call of their own is
    // out: one script for both, ahead of the admissions, as they came.
    if (auto parked = settlements_.find(budget);
        parked != settlements_.end() && !parked->second.calling) {
      take_batch(parked->second.waiting, riding);
      // The call writes the count of permits as it stands.
      parked->second.permits_given_back = false;
      if (parked->second.waiting.empty()) settlements_.erase(parked);
    }
    note_admission_call(budget);
    // The budget lives while the call is in flight, whatever its requests
    // do meanwhile.
    const std::shared_ptr<const Snapshot> keep_alive = queue->second.keep_alive;
    const auto keys = budget_keys(*budget);
    const bool permits = has_permits(*budget);
    begin_budget_call(*budget, queue->second.tpm_limited ? "1" : "0", holder_,
                      permits_held(budget->parallel_key), riding, numbers, args);
    for (const auto& waiter : batch) args.push_back(waiter->cost);
    auto reply = co_await redis_.eval(state::budget_script(), keys, args);
    riding.clear();
    // Three numbers per request, then the permits in use after the call.
    const bool whole = reply && reply->type == state::Reply::Type::array &&
                       reply->elements.size() == 3 * batch.size() + 1;
    if (whole && reply->elements.back().type == state::Reply::Type::integer) {
      admission_calls_[budget].permits_in_use = reply->elements.back().integer;
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& waiter = *batch[i];
      if (whole) {
        const auto* triple = &reply->elements[3 * i];
        if (triple[0].type == state::Reply::Type::integer &&
            triple[1].type == state::Reply::Type::integer &&
            triple[2].type == state::Reply::Type::integer) {
          waiter.answer = AdmitAnswer{triple[0].integer, triple[1].integer, triple[2].integer, {}};
          // Redis counted the permit in this worker's entry: it is counted
          // here before anything else is sent for the budget.
          if (permits && triple[0].integer == 0) {
            long& count = permits_[budget->parallel_key];
            ++count;
            waiter.answer->permit =
                std::make_unique<SharedLease>(*this, *budget, keep_alive, count);
          }
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
  if (lease != nullptr && lease->held()) {
    if (--*lease->count_ == 0) permits_.erase(lease->budget_->parallel_key);
    lease->count_ = nullptr;
  } else {
    lease = nullptr;
  }
  if (stopped_ || (delta_ns == 0 && lease == nullptr)) return;
  auto [entry, first] = settlements_.try_emplace(&budget);
  SettleQueue& queue = entry->second;
  if (first) {
    queue.owner = this;
    queue.budget = &budget;
    queue.keep_alive = keep_alive;
  }
  if (delta_ns != 0) queue.waiting.push_back(std::to_string(delta_ns));
  if (lease != nullptr) queue.permits_given_back = true;
  // A call out takes them, or is followed by them, when it ends.
  if (queue.calling || admits_.contains(&budget)) return;
  settle_or_wait(queue);
}

void WorkerState::settle_or_wait(SettleQueue& queue) {
  if (may_wait(*queue.budget, queue.permits_given_back)) {
    wait_for_a_ride();
  } else {
    send_settlements(queue);
  }
}

bool WorkerState::may_wait(const SharedBudget& budget, bool permits_given_back) const {
  auto call = admission_calls_.find(&budget);
  if (call == admission_calls_.end() ||
      std::chrono::steady_clock::now() - call->second.sent_at >= settlement_wait_) {
    return false;
  }
  return !permits_given_back || 2 * call->second.permits_in_use <= std::stoll(budget.max_parallel);
}

void WorkerState::note_admission_call(const SharedBudget* budget) {
  const auto now = std::chrono::steady_clock::now();
  // Budgets of snapshots gone and keys gone quiet are forgotten.
  if (admission_calls_.size() >= 256) {
    std::erase_if(admission_calls_,
                  [&](const auto& call) { return now - call.second.sent_at >= settlement_wait_; });
  }
  admission_calls_[budget].sent_at = now;
}

void WorkerState::wait_for_a_ride() {
  if (settlement_timer_armed_) return;
  settlement_timer_armed_ = true;
  settlement_timer_.expires_after(settlement_wait_);
  settlement_timer_.async_wait([this](const boost::system::error_code&) {
    settlement_timer_armed_ = false;
    if (stopped_) return;
    std::vector<SettleQueue*> due;
    for (auto& [budget, queue] : settlements_) {
      if (!queue.calling && !admits_.contains(budget)) due.push_back(&queue);
    }
    for (SettleQueue* queue : due) send_settlements(*queue);
  });
}

// One call per budget in flight, and no coroutine or timer for it: the
// client calls back when its reply is in or the connection is lost. A
// queue's address stays put in the map while the call is out.
void WorkerState::send_settlements(SettleQueue& queue) {
  std::vector<std::string_view> args;
  CallNumbers numbers;
  while (!queue.waiting.empty() || queue.permits_given_back) {
    take_batch(queue.waiting, queue.in_flight);
    queue.permits_given_back = false;
    begin_budget_call(*queue.budget, "0", holder_, permits_held(queue.budget->parallel_key),
                      queue.in_flight, numbers, args);
    if (redis_.send_eval(state::budget_script(), budget_keys(*queue.budget), args,
                         state::Completion{&settlements_sent, &queue})) {
      queue.calling = true;
      return;
    }
    // Redis is away: what could not be sent is lost, as a lost reply is.
    queue.in_flight.clear();
  }
  settlements_.erase(queue.budget);
}

void WorkerState::settlements_sent(void* queue) {
  auto& sent = *static_cast<SettleQueue*>(queue);
  sent.in_flight.clear();
  sent.calling = false;
  WorkerState& owner = *sent.owner;
  if (sent.waiting.empty() && !sent.permits_given_back) {
    owner.settlements_.erase(sent.budget);
  } else if (!owner.admits_.contains(sent.budget)) {
    owner.settle_or_wait(sent);
  }
}

net::awaitable<void> WorkerState::renew_leases() {
  std::vector<std::string_view> keys;
  std::vector<std::string_view> args;
  const std::string ttl = std::to_string(settings_.lease_ttl.count());
  while (!stopped_) {
    renewal_.expires_after(settings_.lease_ttl / 3);
    co_await renewal_.async_wait(net::as_tuple(net::use_awaitable));
    if (stopped_) break;
    if (permits_.empty()) continue;
    keys.clear();
    for (const auto& held : permits_) keys.push_back(held.first);
    args.assign({ttl, holder_});
    redis_.send_eval(state::renew_script(), keys, args);
  }
}

}  // namespace sluice::server

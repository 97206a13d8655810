#include "sluice/server/shared_state.hpp"

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
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

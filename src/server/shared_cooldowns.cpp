#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "sluice/server/gateway.hpp"
#include "sluice/state/limit_scripts.hpp"

namespace sluice::server {

namespace net = boost::asio;

namespace {

// What this instance knows of one deployment's shared cooldown.
struct Tracked {
  // The local cooldown end this instance published or took from Redis;
  // a different one is new, and published.
  std::optional<TimePoint> known_until;
  bool probing = false;  // this instance holds the probe claim
};

std::string cooldown_key(const config::State& settings, const std::string& deployment_id) {
  return state::tagged_key(settings.redis.key_prefix, "dep:" + deployment_id, ":cooldown");
}

}  // namespace

net::awaitable<void> share_cooldowns(Worker& worker) {
  WorkerState& shared = *worker.shared_state();
  const config::State& settings = shared.settings();
  const std::string instance = std::to_string(shared.instance());
  std::unordered_map<std::string, Tracked> tracked;
  net::steady_timer tick(worker.context());
  std::vector<std::string> keys;
  std::vector<router::DeploymentState*> states;
  std::vector<Tracked*> entries;
  while (!shared.stopped()) {
    tick.expires_after(kCooldownTick);
    co_await tick.async_wait(net::as_tuple(net::use_awaitable));
    if (shared.stopped()) break;
    if (!shared.redis().up()) continue;
    auto snapshot = worker.snapshot();
    const auto& policy = snapshot->config->router.cooldown;
    keys.clear();
    states.clear();
    entries.clear();
    for (const auto& model : snapshot->config->models) {
      for (const auto& deployment : model.deployments) {
        auto* state = snapshot->router->state(deployment.id);
        if (state == nullptr) continue;
        keys.push_back(cooldown_key(settings, deployment.id));
        states.push_back(state);
        entries.push_back(&tracked[deployment.id]);
      }
    }
    if (keys.empty()) continue;

    // What changed here since the last tick goes out first.
    auto now = Clock::now();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      Tracked& entry = *entries[i];
      auto until = states[i]->cooldown_until();
      std::array<std::string_view, 1> key{keys[i]};
      if (entry.probing && !until) {
        // This instance's probe succeeded: the deployment is back everywhere.
        std::array<std::string_view, 1> ok{"ok"};
        shared.redis().send_eval(state::cooldown_script(), key, ok);
        entry.probing = false;
        entry.known_until.reset();
      } else if (until && *until > now && until != entry.known_until) {
        // A new cooldown of this instance's own (a probe that failed too).
        auto ms =
            std::to_string(std::chrono::ceil<std::chrono::milliseconds>(*until - now).count());
        std::array<std::string_view, 2> args{"set", ms};
        shared.redis().send_eval(state::cooldown_script(), key, args);
        entry.probing = false;
        entry.known_until = until;
      }
    }

    std::vector<std::string_view> key_views(keys.begin(), keys.end());
    auto timeout = std::to_string(std::max<std::int64_t>(policy.duration.count(), 1000));
    std::array<std::string_view, 2> args{instance, timeout};
    auto reply = co_await shared.redis().eval(state::cooldown_poll_script(), key_views, args);
    if (!reply || reply->type != state::Reply::Type::array ||
        reply->elements.size() != 2 * keys.size()) {
      continue;
    }
    now = Clock::now();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const long long verdict = reply->elements[2 * i].integer;
      const long long ms = reply->elements[2 * i + 1].integer;
      router::DeploymentState& state = *states[i];
      Tracked& entry = *entries[i];
      switch (verdict) {
        case 0:
          // Not cooled down anywhere: a cooldown taken from another
          // instance ends here too (its probe succeeded).
          if (entry.known_until && !entry.probing && state.cooldown_until() == entry.known_until) {
            state.end_cooldown();
          }
          entry.known_until.reset();
          break;
        case 1:
          // A tick past Redis's end, so that no instance probes on its own
          // before the claim below picks exactly one of them.
          state.hold_cooldown_until(now + std::chrono::milliseconds(ms) + kCooldownTick);
          entry.known_until = state.cooldown_until();
          break;
        case 2:
          entry.probing = true;
          state.end_cooldown_for_probe(now);
          entry.known_until = state.cooldown_until();
          break;
        case 3:
          state.hold_cooldown_until(now + 2 * kCooldownTick);
          entry.known_until = state.cooldown_until();
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace sluice::server

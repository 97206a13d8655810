#include "sluice/upstream/pool.hpp"

#include <algorithm>
#include <new>

namespace sluice::upstream {

Pool::~Pool() { close_all(); }

std::unique_ptr<Connection> Pool::take(const std::string& origin_key, TimePoint now) {
  auto it = idle_.find(origin_key);
  if (it == idle_.end()) return nullptr;
  auto& stack = it->second;
  while (!stack.empty()) {
    auto connection = std::move(stack.back());
    stack.pop_back();
    counters_.idle.fetch_sub(1, std::memory_order_relaxed);
    if (now - connection->idle_since < options_.idle_expiry && connection->is_open()) {
      connection->idle_stack = &stack;
      counters_.active.fetch_add(1, std::memory_order_relaxed);
      counters_.reused.fetch_add(1, std::memory_order_relaxed);
      return connection;
    }
    connection->close();
  }
  return nullptr;
}

void Pool::give_back(std::unique_ptr<Connection> connection, TimePoint now) noexcept {
  counters_.active.fetch_sub(1, std::memory_order_relaxed);
  if (shut_down_) {
    connection->close();
    return;
  }
  try {
    // The map's nodes stay put, so a stack found once is found for good.
    auto& stack =
        connection->idle_stack ? *connection->idle_stack : idle_[connection->origin_key()];
    connection->idle_stack = &stack;
    if (stack.size() >= options_.max_idle_per_origin) {
      connection->close();
      return;
    }
    connection->idle_since = now;
    stack.push_back(std::move(connection));
  } catch (const std::bad_alloc&) {
    // No memory to keep it idle: it is closed instead. An exchange gives its
    // connection back from its destructor, where nothing may escape; a
    // failed push_back leaves the connection with us.
    if (connection) connection->close();
    return;
  }
  counters_.idle.fetch_add(1, std::memory_order_relaxed);
}

void Pool::close_expired(TimePoint now) {
  for (auto& [key, stack] : idle_) {
    auto expired = [&](const std::unique_ptr<Connection>& c) {
      return now - c->idle_since >= options_.idle_expiry || c->peer_closed();
    };
    auto first_kept = std::stable_partition(stack.begin(), stack.end(), expired);
    for (auto it = stack.begin(); it != first_kept; ++it) (*it)->close();
    counters_.idle.fetch_sub(first_kept - stack.begin(), std::memory_order_relaxed);
    stack.erase(stack.begin(), first_kept);
  }
}

std::size_t Pool::idle_count(const std::string& origin_key) const {
  auto it = idle_.find(origin_key);
  return it == idle_.end() ? 0 : it->second.size();
}

void Pool::close_all() {
  for (auto& [key, stack] : idle_) {
    for (auto& connection : stack) connection->close();
    counters_.idle.fetch_sub(static_cast<std::int64_t>(stack.size()), std::memory_order_relaxed);
    stack.clear();
  }
}

}  // namespace sluice::upstream

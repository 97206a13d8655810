#include "support/leak_check.hpp"

#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <map>
#include <string>

namespace sluice::testing {

std::map<int, std::string> open_descriptor_targets() {
  std::map<int, std::string> targets;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code link_ec;
    auto target = std::filesystem::read_symlink(it->path(), link_ec);
    // The listing's own descriptor, open only while it runs.
    if (!link_ec && target.filename() == "fd" && target.string().starts_with("/proc/")) continue;
    targets[std::stoi(it->path().filename().string())] = link_ec ? "?" : target.string();
  }
  return targets;
}

std::size_t open_descriptors() { return open_descriptor_targets().size(); }

namespace {
// An io_context opens its epoll, eventfd and timerfd descriptors only when
// its first socket or timer is made: a worker that has served nothing yet
// would open three at its first request. Made here, before the baseline.
TestGateway& with_event_loops_ready(TestGateway& gateway) {
  gateway.on_each_worker(
      [](server::Worker& worker) { boost::asio::steady_timer ready(worker.context()); });
  return gateway;
}
}  // namespace

LeakCheck::LeakCheck(TestGateway& gateway)
    : gateway_(with_event_loops_ready(gateway)),
      baseline_(open_descriptors()),
      baseline_targets_(open_descriptor_targets()),
      idle_at_baseline_(gateway.idle_upstream_connections()) {}

::testing::AssertionResult LeakCheck::settled(std::chrono::milliseconds timeout) {
  if (idle_at_baseline_ != 0) {
    return ::testing::AssertionFailure() << "the baseline was taken with " << idle_at_baseline_
                                         << " pooled connections; take it before any traffic";
  }
  // Connections still checked out may yet be given back to a pool, so the
  // pools are emptied again until nothing is active.
  std::size_t descriptors = 0;
  std::int64_t active = 0;
  bool ok = eventually(
      [&] {
        gateway_.close_idle_upstream_connections();
        active = gateway_.active_upstream_connections();
        descriptors = open_descriptors();
        return active == 0 && gateway_.idle_upstream_connections() == 0 && descriptors == baseline_;
      },
      timeout);
  if (ok) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure()
                 << "after " << timeout.count() << " ms: " << descriptors
                 << " descriptors open (baseline " << baseline_ << "), " << active
                 << " upstream connections active, " << gateway_.idle_upstream_connections()
                 << " idle; opened since:";
  for (const auto& [fd, target] : open_descriptor_targets()) {
    auto before = baseline_targets_.find(fd);
    if (before == baseline_targets_.end() || before->second != target) {
      failure << " " << fd << " -> " << target;
    }
  }
  return failure;
}

}  // namespace sluice::testing

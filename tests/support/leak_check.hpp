#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <string>

#include "support/gateway_fixture.hpp"

namespace sluice::testing {

// Descriptors this process holds (entries of /proc/self/fd). The gateway,
// the mock upstreams and the test's clients all live in the test process,
// so a socket any of them forgets to close shows up here.
std::size_t open_descriptors();
// The same descriptors by number, with what each refers to ("socket:[inode]",
// a path...), to name the ones a test left open.
std::map<int, std::string> open_descriptor_targets();

// Proves that traffic left nothing behind: construct it once the gateway and
// its upstreams are up and before any request, run the traffic, close the
// test's own connections, then `EXPECT_TRUE(leaks.settled())`.
class LeakCheck {
 public:
  explicit LeakCheck(TestGateway& gateway);

  // Closes the gateway's idle pooled connections (keeping them is pooling,
  // not leaking), then waits for asynchronous closes until no upstream
  // connection is checked out of a pool and the process holds exactly the
  // descriptors it held at construction.
  ::testing::AssertionResult settled(std::chrono::milliseconds timeout = std::chrono::seconds(5));

 private:
  TestGateway& gateway_;
  std::size_t baseline_;
  std::map<int, std::string> baseline_targets_;
  std::int64_t idle_at_baseline_;
};

}  // namespace sluice::testing

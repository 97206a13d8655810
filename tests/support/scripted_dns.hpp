#pragma once

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sluice/upstream/dns_cache.hpp"

namespace sluice::testing {

// Stands in for the system lookup behind a DnsCache: each lookup answers
// `answer` after a delay, on the executor as the real one does, or never
// (a name server that does not answer: getaddrinfo cannot be cancelled).
// Tests declare their io_context before it: lookups it still holds own
// timers of that context.
class ScriptedDns : public upstream::DnsCache {
 public:
  ScriptedDns(std::optional<std::chrono::milliseconds> delay, upstream::Endpoints answer,
              std::chrono::milliseconds ttl = std::chrono::seconds(60))
      : DnsCache(ttl), delay_(delay), answer_(std::move(answer)) {}

  // Lookups started from now on answer after `delay`, or never when unset.
  void answer_after(std::optional<std::chrono::milliseconds> delay) { delay_ = delay; }

  int lookups = 0;
  int late_answers = 0;

 protected:
  void start_lookup(const boost::asio::any_io_executor& executor, const std::string& /*host*/,
                    std::uint16_t /*port*/, TimePoint deadline, LookupDone done) override {
    ++lookups;
    if (!delay_) {
      never_answered_.push_back(std::move(done));
      return;
    }
    auto timer = std::make_shared<boost::asio::steady_timer>(executor, *delay_);
    timer->async_wait([this, timer, deadline, done = std::move(done)](error_code) {
      if (Clock::now() > deadline) ++late_answers;
      done({}, answer_);
    });
  }

 private:
  std::optional<std::chrono::milliseconds> delay_;
  upstream::Endpoints answer_;
  std::vector<LookupDone> never_answered_;
};

}  // namespace sluice::testing

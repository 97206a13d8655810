#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "histogram.hpp"
#include "options.hpp"

namespace sluice::bench {

enum class ErrorKind : unsigned {
  connect,   // could not open a connection
  send,      // writing the request failed
  receive,   // reading failed (reset...)
  closed,    // the peer closed before the response was complete
  protocol,  // the response was not valid HTTP/1.1
  timeout,   // no complete response within --timeout
  http_4xx,
  http_5xx,
  http_other,  // any other non-2xx status
  backlog,     // open loop: more requests due than connections could carry
};
inline constexpr std::size_t kErrorKindCount = 10;
std::string_view error_name(ErrorKind kind);

inline std::uint64_t nanoseconds_between(Clock::time_point from, Clock::time_point to) {
  if (to <= from) return 0;
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}

// A measured value and the time in which it came about: a request's start
// to its first body byte (TTFT), or an event's previous one to its arrival
// (gap stretch).
struct TimedSample {
  Clock::time_point from;
  Clock::time_point to;
  std::uint64_t nanoseconds;
};

// What one run measured. Latencies are in nanoseconds and cover only the
// requests whose (scheduled) start fell after the warmup and which got a 2xx.
struct RunResult {
  LatencyHistogram ttft;   // start -> first body byte
  LatencyHistogram total;  // start -> last byte
  LatencyHistogram gap;    // between consecutive SSE event ends
  // Only for events the mock stamped with its send time (x-mock-stamp: 1),
  // which the steady clock makes comparable on one machine:
  LatencyHistogram delay;    // the mock's write of an event -> its arrival here
  LatencyHistogram stretch;  // how much longer a gap arrived than it was sent
  // With LoadOptions::keep_sample_times, the TTFT and gap stretch samples
  // with their times, in no particular order.
  std::vector<TimedSample> ttft_samples;
  std::vector<TimedSample> stretch_samples;
  // Filled by set_apart_stalled (stall_probe.hpp): the samples no CPU stall
  // overlapped, and how many one did.
  LatencyHistogram ttft_untouched;
  std::uint64_t ttft_touched = 0;
  LatencyHistogram stretch_untouched;
  std::uint64_t stretch_touched = 0;
  std::uint64_t ok = 0;
  std::uint64_t body_bytes = 0;
  std::uint64_t events = 0;
  std::array<std::uint64_t, kErrorKindCount> errors{};
  // 2xx responses that ended inside the measurement window: the throughput
  // numerator in duration mode.
  std::uint64_t completed_in_window = 0;
  // Every exchange whose request reached the server, warmup included: what
  // the server's CPU time is divided by.
  std::uint64_t exchanges = 0;
  Clock::time_point first_start = Clock::time_point::max();
  Clock::time_point last_end = Clock::time_point::min();
  unsigned peak_connections = 0;

  // Filled by run_load once the threads are merged.
  double measured_seconds = 0;
  double requests_per_second = 0;

  void merge(const RunResult& other);
  std::uint64_t error_count() const;
};

// Runs the load described by `options` against `url` and returns the merged
// measurements of every thread. Throws UsageError when the host does not
// resolve.
RunResult run_load(const HttpUrl& url, const LoadOptions& options, const std::string& request);

}  // namespace sluice::bench

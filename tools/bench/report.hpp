#pragma once

#include <array>
#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "load_runner.hpp"

namespace sluice::bench {

// Percentiles of one latency histogram, in microseconds.
struct LatencySummary {
  std::uint64_t count = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double p999 = 0;
  double max = 0;
  double mean = 0;
};

LatencySummary summarize(const LatencyHistogram& histogram);

// A run reduced to the figures that are printed and compared.
struct RunSummary {
  LatencySummary ttft;
  LatencySummary total;
  LatencySummary gap;
  LatencySummary delay;
  LatencySummary stretch;
  // Only from a run with a stall probe (set_apart_stalled): the samples no
  // CPU stall overlapped, and how many one did.
  LatencySummary ttft_untouched;
  std::uint64_t ttft_touched = 0;
  LatencySummary stretch_untouched;
  std::uint64_t stretch_touched = 0;
  double requests_per_second = 0;
  double measured_seconds = 0;
  std::uint64_t ok = 0;
  std::uint64_t exchanges = 0;
  std::uint64_t body_bytes = 0;
  std::uint64_t events = 0;
  std::uint64_t errors = 0;
  std::array<std::uint64_t, kErrorKindCount> errors_by_kind{};
  unsigned peak_connections = 0;
};

RunSummary summarize(const RunResult& result);

// The human-readable report of a single run.
void print_run(std::ostream& out, const std::string& url, const LoadOptions& options,
               const RunSummary& summary);

nlohmann::json to_json(const RunSummary& summary);

// Writes the cumulative distributions of TTFT, total time and inter-event gap
// as three gnuplot data sets ("index 0", "index 1", "index 2"), each line
// "microseconds cumulative_fraction". Throws UsageError when the file cannot
// be written.
void write_cdf_file(const std::string& path, const RunResult& result);

void write_json_file(const std::string& path, const nlohmann::json& document);

}  // namespace sluice::bench

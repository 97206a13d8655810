#include "report.hpp"

#include <cstdio>
#include <fstream>

namespace sluice::bench {

namespace {

constexpr double kNanosecondsPerMicrosecond = 1e3;

double to_microseconds(std::uint64_t nanoseconds) {
  return static_cast<double>(nanoseconds) / kNanosecondsPerMicrosecond;
}

void print_latency_row(std::ostream& out, const char* label, const LatencySummary& latency) {
  char line[160];
  if (latency.count == 0) {
    std::snprintf(line, sizeof line, "  %-7s %12s\n", label, "-");
  } else {
    std::snprintf(line, sizeof line, "  %-7s %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %10llu\n",
                  label, latency.p50, latency.p90, latency.p99, latency.p999, latency.max,
                  latency.mean, static_cast<unsigned long long>(latency.count));
  }
  out << line;
}

nlohmann::json latency_json(const LatencySummary& latency) {
  return {{"count", latency.count}, {"p50", latency.p50},    {"p90", latency.p90},
          {"p99", latency.p99},     {"p99_9", latency.p999}, {"max", latency.max},
          {"mean", latency.mean}};
}

}  // namespace

LatencySummary summarize(const LatencyHistogram& histogram) {
  LatencySummary summary;
  summary.count = histogram.count();
  if (summary.count == 0) return summary;
  summary.p50 = to_microseconds(histogram.percentile(0.50));
  summary.p90 = to_microseconds(histogram.percentile(0.90));
  summary.p99 = to_microseconds(histogram.percentile(0.99));
  summary.p999 = to_microseconds(histogram.percentile(0.999));
  summary.max = to_microseconds(histogram.max());
  summary.mean = histogram.mean() / kNanosecondsPerMicrosecond;
  return summary;
}

RunSummary summarize(const RunResult& result) {
  RunSummary summary;
  summary.ttft = summarize(result.ttft);
  summary.total = summarize(result.total);
  summary.gap = summarize(result.gap);
  summary.delay = summarize(result.delay);
  summary.stretch = summarize(result.stretch);
  summary.ttft_untouched = summarize(result.ttft_untouched);
  summary.ttft_touched = result.ttft_touched;
  summary.stretch_untouched = summarize(result.stretch_untouched);
  summary.stretch_touched = result.stretch_touched;
  summary.requests_per_second = result.requests_per_second;
  summary.measured_seconds = result.measured_seconds;
  summary.ok = result.ok;
  summary.exchanges = result.exchanges;
  summary.body_bytes = result.body_bytes;
  summary.events = result.events;
  summary.errors = result.error_count();
  summary.errors_by_kind = result.errors;
  summary.peak_connections = result.peak_connections;
  return summary;
}

void print_run(std::ostream& out, const std::string& url, const LoadOptions& options,
               const RunSummary& summary) {
  out << "target   " << url << "\n";
  out << "load     " << describe(options) << "\n";
  char line[256];
  std::snprintf(line, sizeof line,
                "result   %llu ok, %llu errors, %.1f req/s over %.2f s, %.1f KiB body, %llu "
                "events, %u connections\n",
                static_cast<unsigned long long>(summary.ok),
                static_cast<unsigned long long>(summary.errors), summary.requests_per_second,
                summary.measured_seconds, static_cast<double>(summary.body_bytes) / 1024.0,
                static_cast<unsigned long long>(summary.events), summary.peak_connections);
  out << line;
  if (summary.errors > 0) {
    out << "errors  ";
    for (std::size_t kind = 0; kind < kErrorKindCount; ++kind) {
      if (summary.errors_by_kind[kind] == 0) continue;
      out << " " << error_name(static_cast<ErrorKind>(kind)) << "=" << summary.errors_by_kind[kind];
    }
    out << "\n";
  }
  std::snprintf(line, sizeof line, "  %-7s %12s %12s %12s %12s %12s %12s %10s\n", "(µs)", "p50",
                "p90", "p99", "p99.9", "max", "mean", "samples");
  out << line;
  print_latency_row(out, "ttft", summary.ttft);
  print_latency_row(out, "total", summary.total);
  print_latency_row(out, "gap", summary.gap);
  // Only stamped streams have these.
  if (summary.delay.count > 0) print_latency_row(out, "delay", summary.delay);
  if (summary.stretch.count > 0) print_latency_row(out, "stretch", summary.stretch);
}

nlohmann::json to_json(const RunSummary& summary) {
  nlohmann::json errors = nlohmann::json::object();
  for (std::size_t kind = 0; kind < kErrorKindCount; ++kind) {
    errors[std::string(error_name(static_cast<ErrorKind>(kind)))] = summary.errors_by_kind[kind];
  }
  nlohmann::json json = {{"ok", summary.ok},
                         {"errors", summary.errors},
                         {"errors_by_kind", errors},
                         {"requests_per_second", summary.requests_per_second},
                         {"measured_seconds", summary.measured_seconds},
                         {"exchanges", summary.exchanges},
                         {"body_bytes", summary.body_bytes},
                         {"events", summary.events},
                         {"peak_connections", summary.peak_connections},
                         {"ttft_us", latency_json(summary.ttft)},
                         {"total_us", latency_json(summary.total)},
                         {"gap_us", latency_json(summary.gap)},
                         {"delay_us", latency_json(summary.delay)},
                         {"stretch_us", latency_json(summary.stretch)}};
  if (summary.ttft_untouched.count > 0 || summary.ttft_touched > 0) {
    json["ttft_untouched_us"] = latency_json(summary.ttft_untouched);
    json["ttft_touched"] = summary.ttft_touched;
    json["stretch_untouched_us"] = latency_json(summary.stretch_untouched);
    json["stretch_touched"] = summary.stretch_touched;
  }
  return json;
}

void write_cdf_file(const std::string& path, const RunResult& result) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (!file) throw UsageError{"cannot write " + path};
  const std::pair<const char*, const LatencyHistogram*> sets[] = {
      {"ttft", &result.ttft}, {"total", &result.total}, {"gap", &result.gap}};
  for (const auto& [name, histogram] : sets) {
    std::fprintf(file, "# %s: microseconds cumulative_fraction (%llu samples)\n", name,
                 static_cast<unsigned long long>(histogram->count()));
    if (histogram->count() == 0) {
      // gnuplot skips an index without points; keep the block so the
      // numbering of the next sets does not shift.
      std::fprintf(file, "# no samples\n");
    }
    histogram->for_each_cdf_point([&](std::uint64_t nanoseconds, double fraction) {
      std::fprintf(file, "%.3f %.6f\n", to_microseconds(nanoseconds), fraction);
    });
    std::fprintf(file, "\n\n");
  }
  std::fclose(file);
}

void write_json_file(const std::string& path, const nlohmann::json& document) {
  std::ofstream file(path);
  if (!file) throw UsageError{"cannot write " + path};
  file << document.dump(2) << "\n";
}

}  // namespace sluice::bench

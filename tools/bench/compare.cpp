#include "compare.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "load_runner.hpp"
#include "options.hpp"
#include "report.hpp"
#include "stall_probe.hpp"

namespace sluice::bench {

namespace {

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();
// Lets the previous target's connections close and its CPU settle before the
// next target is measured.
constexpr auto kPauseBetweenRuns = std::chrono::milliseconds(200);

struct CompareTarget {
  std::string name;
  std::string url_text;
  HttpUrl url;
  std::string request;
  std::vector<int> cpu_pids;  // processes whose CPU time is charged to this target
  RunResult merged;           // every round together, for the distribution plots
};

struct RoundValue {
  RunSummary summary;
  double cpu_us_per_request = kMissing;
  double kernel_us_per_request = kMissing;
  double sleeps_per_request = kMissing;
  std::optional<std::uint64_t> listen_drops;  // machine-wide, during this run
  std::optional<std::uint64_t> stalls;        // CPU stalls, with --stall-probe
};

struct Metric {
  const char* label;
  const char* key;
  double (*value)(const RoundValue&);
  // req/s: a proxy's cost shows as a negative added figure.
  bool higher_is_better = false;
  // The added figure of a process-level metric (CPU) is the value itself: the
  // baseline has no proxy process to charge.
  bool baseline_is_zero = false;
};

// One percentile of one of a round's latency distributions; missing when the
// run had no successful request to measure it on.
template <LatencySummary RunSummary::*Distribution, double LatencySummary::*Percentile>
double latency_figure(const RoundValue& round) {
  const LatencySummary& latency = round.summary.*Distribution;
  return latency.count > 0 ? latency.*Percentile : kMissing;
}

const Metric kMetrics[] = {
    {"TTFT p50 (µs)", "ttft_p50_us", latency_figure<&RunSummary::ttft, &LatencySummary::p50>},
    {"TTFT p99 (µs)", "ttft_p99_us", latency_figure<&RunSummary::ttft, &LatencySummary::p99>},
    {"total p50 (µs)", "total_p50_us", latency_figure<&RunSummary::total, &LatencySummary::p50>},
    {"total p99 (µs)", "total_p99_us", latency_figure<&RunSummary::total, &LatencySummary::p99>},
    {"gap p50 (µs)", "gap_p50_us", latency_figure<&RunSummary::gap, &LatencySummary::p50>},
    {"gap p99 (µs)", "gap_p99_us", latency_figure<&RunSummary::gap, &LatencySummary::p99>},
    {"event delay p50 (µs)", "delay_p50_us",
     latency_figure<&RunSummary::delay, &LatencySummary::p50>},
    {"event delay p99 (µs)", "delay_p99_us",
     latency_figure<&RunSummary::delay, &LatencySummary::p99>},
    {"gap stretch p99 (µs)", "stretch_p99_us",
     latency_figure<&RunSummary::stretch, &LatencySummary::p99>},
    {"TTFT p99, no CPU stall in it (µs)", "ttft_untouched_p99_us",
     latency_figure<&RunSummary::ttft_untouched, &LatencySummary::p99>},
    {"requests a CPU stall touched (%)", "ttft_touched_percent",
     [](const RoundValue& v) {
       const double touched = static_cast<double>(v.summary.ttft_touched);
       const double all = touched + static_cast<double>(v.summary.ttft_untouched.count);
       return v.stalls && all > 0 ? 100 * touched / all : kMissing;
     }},
    {"gap stretch p99, no CPU stall in it (µs)", "stretch_untouched_p99_us",
     latency_figure<&RunSummary::stretch_untouched, &LatencySummary::p99>},
    {"req/s", "requests_per_second",
     [](const RoundValue& v) { return v.summary.requests_per_second; }, true},
    {"CPU µs/req", "cpu_us_per_request", [](const RoundValue& v) { return v.cpu_us_per_request; },
     false, true},
    {"kernel µs/req", "kernel_us_per_request",
     [](const RoundValue& v) { return v.kernel_us_per_request; }, false, true},
    {"sleeps/req", "sleeps_per_request", [](const RoundValue& v) { return v.sleeps_per_request; },
     false, true},
};

// Tails read from every round's samples together. A round of 128 streams
// has its P99 in its second-largest sample, so a median over rounds of such
// P99s follows single outliers; the pooled distribution holds rounds times
// as many samples past its P99. Printed beside the medians, not instead.
struct PooledTail {
  const char* label;
  const char* key;
  LatencySummary RunSummary::*distribution;
};

const PooledTail kPooledTails[] = {
    {"TTFT p99, rounds pooled (µs)", "ttft_p99_us", &RunSummary::ttft},
    {"event delay p99, rounds pooled (µs)", "delay_p99_us", &RunSummary::delay},
    {"gap stretch p99, rounds pooled (µs)", "stretch_p99_us", &RunSummary::stretch},
    {"TTFT p99, no CPU stall in it, rounds pooled (µs)", "ttft_untouched_p99_us",
     &RunSummary::ttft_untouched},
    {"gap stretch p99, no CPU stall in it, rounds pooled (µs)", "stretch_untouched_p99_us",
     &RunSummary::stretch_untouched},
};

double pooled_p99(const RunSummary& pooled, const PooledTail& tail) {
  const LatencySummary& latency = pooled.*tail.distribution;
  return latency.count > 0 ? latency.p99 : kMissing;
}

double median(std::vector<double> values) {
  std::erase_if(values, [](double value) { return std::isnan(value); });
  if (values.empty()) return kMissing;
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "–";
  char text[32];
  if (std::fabs(value) >= 10000) {
    std::snprintf(text, sizeof text, "%.0f", value);
  } else {
    std::snprintf(text, sizeof text, "%.1f", value);
  }
  return text;
}

std::string format_added(double value) {
  if (std::isnan(value)) return "–";
  std::string text = format_value(value);
  return value > 0 ? "+" + text : text;
}

// "n times the cost" only means something when both targets cost something:
// a proxy measured faster than the direct path is noise, not a negative cost.
double ratio_of_costs(double numerator, double denominator, bool higher_is_better) {
  if (std::isnan(numerator) || std::isnan(denominator)) return kMissing;
  if (higher_is_better) {
    numerator = -numerator;
    denominator = -denominator;
  }
  if (numerator <= 0 || denominator <= 0) return kMissing;
  return numerator / denominator;
}

std::string format_ratio(double ratio) {
  if (std::isnan(ratio)) return "–";
  char text[32];
  std::snprintf(text, sizeof text, "%.2fx", ratio);
  return text;
}

struct Ticks {
  std::uint64_t user = 0;
  std::uint64_t system = 0;

  std::uint64_t all() const { return user + system; }
  Ticks& operator+=(const Ticks& other) {
    user += other.user;
    system += other.system;
    return *this;
  }
};

// utime and stime of a process (all its threads), in clock ticks.
std::optional<Ticks> stat_ticks(int pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(file, line)) return std::nullopt;
  // The command name may contain spaces and parentheses; fields are counted
  // from the last ')'.
  const auto name_end = line.rfind(')');
  if (name_end == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(name_end + 2));
  std::string field;
  Ticks ticks;
  // After the name: state is field 3, utime field 14, stime field 15.
  for (int number = 3; number <= 15 && fields >> field; ++number) {
    if (number == 14) ticks.user = std::stoull(field);
    if (number == 15) ticks.system = std::stoull(field);
  }
  return ticks;
}

// How often the threads of a process went to sleep of their own accord (a
// wait for the next event, a contended lock): voluntary_ctxt_switches summed
// over /proc/PID/task. Each sleep is a wake-up later, which costs CPU time
// and, for the request that wakes it, latency.
std::optional<std::uint64_t> voluntary_sleeps(int pid) {
  std::error_code error;
  std::filesystem::directory_iterator tasks("/proc/" + std::to_string(pid) + "/task", error);
  if (error) return std::nullopt;
  std::uint64_t total = 0;
  for (const auto& task : tasks) {
    std::ifstream status(task.path() / "status");
    std::string line;
    constexpr std::string_view kKey = "voluntary_ctxt_switches:";
    while (std::getline(status, line)) {
      if (line.compare(0, kKey.size(), kKey) != 0) continue;
      total += std::stoull(line.substr(kKey.size()));
      break;
    }
  }
  return total;
}

// Connections the kernel dropped because a listen queue was full, on the
// whole machine (TcpExt ListenDrops in /proc/net/netstat). A dropped connect
// is sent again by its client a second later, so in a burst of connects a
// few such drops are a tail of their own, whichever process's queue it was.
std::optional<std::uint64_t> listen_drops() {
  std::ifstream file("/proc/net/netstat");
  std::string names;
  std::string numbers;
  // Pairs of lines: "TcpExt: Name ..." and "TcpExt: 1 ...".
  while (std::getline(file, names) && std::getline(file, numbers)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream name_fields(names);
    std::istringstream number_fields(numbers);
    std::string name;
    std::string number;
    while (name_fields >> name && number_fields >> number) {
      if (name == "ListenDrops") return std::stoull(number);
    }
  }
  return std::nullopt;
}

// A count summed over processes; missing when one of them is gone.
template <class Count>
std::optional<Count> sum_over(const std::vector<int>& pids,
                              std::optional<Count> (*count)(int pid)) {
  Count total{};
  for (int pid : pids) {
    auto one = count(pid);
    if (!one) return std::nullopt;
    total += *one;
  }
  return total;
}

std::vector<int> parse_pids(std::string_view text) {
  std::vector<int> pids;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    int pid = 0;
    auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), pid);
    if (item.empty() || error != std::errc{} || end != item.data() + item.size() || pid <= 0) {
      throw UsageError{"--cpu-pid expects NAME=PID[,PID...]"};
    }
    pids.push_back(pid);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return pids;
}

// Splits "name=value".
std::pair<std::string, std::string> split_named(std::string_view option, std::string_view text) {
  const auto equals = text.find('=');
  if (equals == std::string_view::npos || equals == 0 || equals + 1 == text.size()) {
    throw UsageError{std::string(option) + " expects NAME=VALUE, got '" + std::string(text) + "'"};
  }
  return {std::string(text.substr(0, equals)), std::string(text.substr(equals + 1))};
}

void print_progress(std::size_t round, std::size_t rounds, const CompareTarget& target,
                    const RoundValue& value) {
  const RunSummary& s = value.summary;
  char line[320];
  std::snprintf(line, sizeof line,
                "round %zu/%zu %-8s %9.1f req/s  ttft p50 %8.1f p99 %8.1f  total p50 %8.1f p99 "
                "%8.1f µs",
                round, rounds, target.name.c_str(), s.requests_per_second, s.ttft.p50, s.ttft.p99,
                s.total.p50, s.total.p99);
  std::cerr << line;
  if (s.gap.count > 0) {
    std::snprintf(line, sizeof line, "  gap p50 %.1f p99 %.1f µs", s.gap.p50, s.gap.p99);
    std::cerr << line;
  }
  if (!std::isnan(value.cpu_us_per_request)) {
    std::snprintf(line, sizeof line, "  cpu %.1f µs/req", value.cpu_us_per_request);
    std::cerr << line;
  }
  if (!std::isnan(value.sleeps_per_request)) {
    std::snprintf(line, sizeof line, "  %.2f sleeps/req", value.sleeps_per_request);
    std::cerr << line;
  }
  if (value.listen_drops.value_or(0) > 0) std::cerr << "  listen drops " << *value.listen_drops;
  if (value.stalls) {
    std::snprintf(line, sizeof line, "  %llu CPU stalls, ttft p99 without %.1f µs",
                  static_cast<unsigned long long>(*value.stalls), s.ttft_untouched.p99);
    std::cerr << line;
  }
  if (s.errors > 0) {
    std::cerr << "  errors";
    for (std::size_t kind = 0; kind < kErrorKindCount; ++kind) {
      if (s.errors_by_kind[kind] == 0) continue;
      std::cerr << " " << error_name(static_cast<ErrorKind>(kind)) << "=" << s.errors_by_kind[kind];
    }
  }
  std::cerr << std::endl;
}

}  // namespace

int run_compare(int argc, char** argv, int first) {
  LoadOptions options;
  std::vector<CompareTarget> targets;
  std::vector<std::pair<std::string, std::vector<int>>> cpu_pids;
  unsigned rounds = 3;
  std::string title;
  std::string description;
  std::string json_path;
  std::string samples_prefix;
  std::string reference_name;
  bool stall_probe = false;

  ArgumentCursor cursor(argc, argv, first);
  while (cursor.next()) {
    const std::string_view name = cursor.name();
    if (parse_load_option(cursor, options)) continue;
    if (name == "--target") {
      auto [target_name, url_text] = split_named(name, cursor.value());
      std::string why;
      auto url = parse_http_url(url_text, why);
      if (!url) throw UsageError{"--target " + target_name + ": " + why};
      for (const auto& existing : targets) {
        if (existing.name == target_name) throw UsageError{"target '" + target_name + "' twice"};
      }
      CompareTarget target;
      target.name = std::move(target_name);
      target.url_text = std::move(url_text);
      target.url = std::move(*url);
      targets.push_back(std::move(target));
    } else if (name == "--cpu-pid") {
      auto [target_name, pids] = split_named(name, cursor.value());
      cpu_pids.emplace_back(std::move(target_name), parse_pids(pids));
    } else if (name == "--rounds") {
      rounds = parse_count(name, cursor.value(), 1);
    } else if (name == "--title") {
      title = std::string(cursor.value());
    } else if (name == "--description") {
      description = std::string(cursor.value());
    } else if (name == "--json") {
      json_path = std::string(cursor.value());
    } else if (name == "--samples") {
      samples_prefix = std::string(cursor.value());
    } else if (name == "--reference") {
      reference_name = std::string(cursor.value());
    } else if (name == "--stall-probe") {
      stall_probe = true;
      options.keep_sample_times = true;
    } else {
      throw UsageError{"unknown option '" + std::string(name) + "'"};
    }
  }
  if (targets.empty()) throw UsageError{"compare needs at least one --target NAME=URL"};
  validate(options);
  auto target_named = [&targets](const std::string& wanted) {
    return std::find_if(targets.begin(), targets.end(),
                        [&](const CompareTarget& t) { return t.name == wanted; });
  };
  for (auto& [target_name, pids] : cpu_pids) {
    auto target = target_named(target_name);
    if (target == targets.end())
      throw UsageError{"--cpu-pid names no target '" + target_name + "'"};
    target->cpu_pids = pids;
  }
  // The ratio columns: every other non-baseline target against the
  // reference, or without one, the second target against the third.
  std::vector<std::pair<std::size_t, std::size_t>> ratio_pairs;  // numerator, denominator
  if (!reference_name.empty()) {
    auto reference = target_named(reference_name);
    if (reference == targets.end() || reference == targets.begin()) {
      throw UsageError{"--reference names no target after the baseline: '" + reference_name + "'"};
    }
    const auto denominator = static_cast<std::size_t>(reference - targets.begin());
    for (std::size_t t = 1; t < targets.size(); ++t) {
      if (t != denominator) ratio_pairs.emplace_back(t, denominator);
    }
  } else if (targets.size() >= 3) {
    ratio_pairs.emplace_back(1, 2);
  }
  for (auto& target : targets) target.request = build_request(target.url, options);

  const double seconds_per_tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::vector<std::vector<RoundValue>> values(targets.size());  // [target][round]

  for (unsigned round = 1; round <= rounds; ++round) {
    // Each round starts one target later than the round before: a target
    // that always ran right after another would carry what that one left
    // behind (measured at a few microseconds at concurrency 1).
    for (std::size_t k = 0; k < targets.size(); ++k) {
      const std::size_t t = (round - 1 + k) % targets.size();
      CompareTarget& target = targets[t];
      const auto ticks_before = sum_over(target.cpu_pids, stat_ticks);
      const auto sleeps_before = sum_over(target.cpu_pids, voluntary_sleeps);
      const auto drops_before = listen_drops();
      std::optional<StallProbe> probe;
      if (stall_probe) probe.emplace();
      RunResult result = run_load(target.url, options, target.request);
      const auto ticks_after = sum_over(target.cpu_pids, stat_ticks);
      const auto sleeps_after = sum_over(target.cpu_pids, voluntary_sleeps);
      const auto drops_after = listen_drops();

      RoundValue value;
      if (probe) {
        const std::vector<Stall> stalls = probe->stop();
        set_apart_stalled(result, stalls);
        value.stalls = stalls.size();
        result.ttft_samples = {};
        result.stretch_samples = {};
      }
      value.summary = summarize(result);
      const bool charged = !target.cpu_pids.empty() && result.exchanges > 0;
      const auto per_request = [&](std::uint64_t before, std::uint64_t after, double scale) {
        return static_cast<double>(after - before) * scale / static_cast<double>(result.exchanges);
      };
      const double us_per_tick = seconds_per_tick * 1e6;
      if (charged && ticks_before && ticks_after) {
        value.cpu_us_per_request =
            per_request(ticks_before->all(), ticks_after->all(), us_per_tick);
        value.kernel_us_per_request =
            per_request(ticks_before->system, ticks_after->system, us_per_tick);
      }
      if (charged && sleeps_before && sleeps_after) {
        value.sleeps_per_request = per_request(*sleeps_before, *sleeps_after, 1.0);
      }
      if (drops_before && drops_after) value.listen_drops = *drops_after - *drops_before;
      print_progress(round, rounds, target, value);
      values[t].push_back(value);
      target.merged.merge(result);
      std::this_thread::sleep_for(kPauseBetweenRuns);
    }
  }

  // Medians per target, added figures per round against the first target
  // (then their median), and the ratios of added figures.
  const std::size_t target_count = targets.size();
  auto ratio_name = [&](const std::pair<std::size_t, std::size_t>& pair) {
    return targets[pair.first].name + "/" + targets[pair.second].name;
  };
  std::ostringstream table;
  table << "| metric |";
  for (const auto& target : targets) table << " " << target.name << " |";
  for (std::size_t t = 1; t < target_count; ++t) table << " " << targets[t].name << " added |";
  for (const auto& pair : ratio_pairs) table << " " << ratio_name(pair) << " added |";
  table << "\n|---|";
  const std::size_t columns = target_count + (target_count - 1) + ratio_pairs.size();
  for (std::size_t c = 0; c < columns; ++c) table << "---:|";
  table << "\n";

  // One table row: a value per target, an added figure per target after the
  // baseline, then the ratios.
  auto write_row = [&](std::string_view label, const std::vector<double>& values,
                       const std::vector<double>& added, const std::vector<double>& ratios) {
    table << "| " << label << " |";
    for (std::size_t t = 0; t < target_count; ++t) table << " " << format_value(values[t]) << " |";
    for (std::size_t t = 1; t < target_count; ++t) table << " " << format_added(added[t]) << " |";
    for (double ratio : ratios) table << " " << format_ratio(ratio) << " |";
    table << "\n";
  };

  nlohmann::json medians_json = nlohmann::json::object();
  nlohmann::json added_json = nlohmann::json::object();
  std::vector<nlohmann::json> ratio_json(ratio_pairs.size(), nlohmann::json::object());
  for (const Metric& metric : kMetrics) {
    std::vector<double> medians(target_count);
    std::vector<double> added(target_count, kMissing);
    bool any_value = false;
    for (std::size_t t = 0; t < target_count; ++t) {
      std::vector<double> per_round;
      for (const auto& value : values[t]) per_round.push_back(metric.value(value));
      medians[t] = median(per_round);
      any_value = any_value || !std::isnan(medians[t]);
    }
    if (!any_value) continue;
    for (std::size_t t = 1; t < target_count; ++t) {
      std::vector<double> differences;
      for (std::size_t r = 0; r < rounds; ++r) {
        double baseline = metric.value(values[0][r]);
        if (metric.baseline_is_zero && std::isnan(baseline)) baseline = 0;
        differences.push_back(metric.value(values[t][r]) - baseline);
      }
      added[t] = median(differences);
    }
    std::vector<double> ratios;
    for (const auto& [numerator, denominator] : ratio_pairs) {
      ratios.push_back(
          ratio_of_costs(added[numerator], added[denominator], metric.higher_is_better));
    }

    write_row(metric.label, medians, added, ratios);

    for (std::size_t t = 0; t < target_count; ++t) {
      if (!std::isnan(medians[t])) medians_json[targets[t].name][metric.key] = medians[t];
      if (t > 0 && !std::isnan(added[t])) added_json[targets[t].name][metric.key] = added[t];
    }
    for (std::size_t i = 0; i < ratios.size(); ++i) {
      if (!std::isnan(ratios[i])) ratio_json[i][metric.key] = ratios[i];
    }
  }
  // Each target's rounds together; one round pools nothing new.
  std::vector<RunSummary> pooled;
  pooled.reserve(targets.size());
  for (const auto& target : targets) pooled.push_back(summarize(target.merged));
  nlohmann::json pooled_json = nlohmann::json::object();
  nlohmann::json pooled_added_json = nlohmann::json::object();
  for (const PooledTail& tail : kPooledTails) {
    std::vector<double> values(target_count);
    bool any_value = false;
    for (std::size_t t = 0; t < target_count; ++t) {
      values[t] = pooled_p99(pooled[t], tail);
      any_value = any_value || !std::isnan(values[t]);
    }
    if (!any_value) continue;
    std::vector<double> added(target_count, kMissing);
    for (std::size_t t = 1; t < target_count; ++t) added[t] = values[t] - values[0];
    for (std::size_t t = 0; t < target_count; ++t) {
      if (!std::isnan(values[t])) pooled_json[targets[t].name][tail.key] = values[t];
      if (t > 0 && !std::isnan(added[t])) pooled_added_json[targets[t].name][tail.key] = added[t];
    }
    if (rounds < 2) continue;
    std::vector<double> ratios;
    for (const auto& [numerator, denominator] : ratio_pairs) {
      ratios.push_back(ratio_of_costs(added[numerator], added[denominator], false));
    }
    for (std::size_t i = 0; i < ratios.size(); ++i) {
      if (!std::isnan(ratios[i])) ratio_json[i][std::string("pooled_") + tail.key] = ratios[i];
    }
    write_row(tail.label, values, added, ratios);
  }
  // Counts summed over each target's rounds, and their row.
  auto totals_of = [&](auto count) {
    std::vector<std::uint64_t> totals(target_count, 0);
    for (std::size_t t = 0; t < target_count; ++t) {
      for (const auto& value : values[t]) totals[t] += count(value);
    }
    return totals;
  };
  auto write_count_row = [&](std::string_view label, const std::vector<std::uint64_t>& totals) {
    table << "| " << label << " |";
    for (std::uint64_t count : totals) table << " " << count << " |";
    for (std::size_t c = target_count; c < columns; ++c) table << " |";
    table << "\n";
  };
  write_count_row("errors", totals_of([](const RoundValue& v) { return v.summary.errors; }));
  // Only when there were some: then a tail may be a second's retransmission
  // rather than the path's own doing.
  const std::vector<std::uint64_t> drops =
      totals_of([](const RoundValue& v) { return v.listen_drops.value_or(0); });
  const bool any_drops =
      std::any_of(drops.begin(), drops.end(), [](std::uint64_t count) { return count > 0; });
  if (any_drops) write_count_row("connects dropped, listen queue full (all rounds)", drops);
  if (stall_probe) {
    write_count_row("CPU stalls (all rounds)",
                    totals_of([](const RoundValue& v) { return v.stalls.value_or(0); }));
  }

  if (!title.empty()) std::cout << "### " << title << "\n\n";
  if (!description.empty()) std::cout << description << "\n\n";
  std::cout << "Load: " << describe(options) << "; " << rounds
            << (rounds == 1 ? " round" : " rounds")
            << ", targets alternating, each round starting one later.\n\n";
  std::cout << table.str() << "\n";
  std::cout << "Medians over rounds. \"added\" = target − " << targets[0].name
            << " in the same round, median over rounds";
  for (std::size_t i = 0; i < ratio_pairs.size(); ++i) {
    std::cout << (i == 0 ? "; " : ", ") << ratio_name(ratio_pairs[i]);
  }
  if (!ratio_pairs.empty()) std::cout << " = ratio of the added figures";
  std::cout << ". CPU µs/req = the target process's user+system time per request, kernel µs/req"
               " the system part of it; sleeps/req = how often its threads went to sleep"
               " (voluntary context switches) per request.";
  if (any_drops) {
    std::cout << " Connects dropped: connections the kernel dropped on a full listen queue while"
                 " the target ran, machine-wide (the target's queue or its upstream's); each"
                 " one's client sends it again a second later.";
  }
  if (stall_probe) {
    std::cout << " CPU stalls: a probe thread bound to each CPU sleeps " << kProbeSleep.count()
              << " µs at a time; a wake-up more than " << kStallThreshold.count()
              << " µs late means the CPU served no waiting thread (the hypervisor or other work"
                 " held it), from that sleep's start to the wake-up. \"no CPU stall in it\": the"
                 " requests whose wait for their first byte, or the events whose time since the"
                 " event before, overlapped no stall on any CPU.";
  }
  if (rounds >= 2) {
    std::cout << " \"rounds pooled\" rows: the P99 of all rounds' samples together, and its"
                 " difference to "
              << targets[0].name << "'s.";
  }
  std::cout << "\n" << std::endl;

  if (!samples_prefix.empty()) {
    for (const auto& target : targets) {
      write_cdf_file(samples_prefix + target.name + ".cdf", target.merged);
    }
  }
  if (!json_path.empty()) {
    nlohmann::json document;
    document["title"] = title;
    document["description"] = description;
    document["load"] = describe(options);
    document["rounds"] = rounds;
    document["baseline"] = targets[0].name;
    for (std::size_t t = 0; t < target_count; ++t) {
      nlohmann::json target_json = {{"name", targets[t].name}, {"url", targets[t].url_text}};
      for (const auto& value : values[t]) {
        nlohmann::json round_json = to_json(value.summary);
        // The process-level figures, for a target charged with a process.
        for (const auto& metric : kMetrics) {
          const double figure = metric.value(value);
          if (metric.baseline_is_zero && !std::isnan(figure)) round_json[metric.key] = figure;
        }
        if (value.listen_drops) round_json["listen_drops"] = *value.listen_drops;
        if (value.stalls) round_json["cpu_stalls"] = *value.stalls;
        target_json["rounds"].push_back(std::move(round_json));
      }
      target_json["all_rounds"] = to_json(pooled[t]);
      document["targets"].push_back(std::move(target_json));
    }
    document["median"] = medians_json;
    document["added"] = added_json;
    document["pooled"] = pooled_json;
    document["pooled_added"] = pooled_added_json;
    for (std::size_t i = 0; i < ratio_pairs.size(); ++i) {
      document["ratios_of_added"].push_back({{"numerator", targets[ratio_pairs[i].first].name},
                                             {"denominator", targets[ratio_pairs[i].second].name},
                                             {"values", ratio_json[i]}});
    }
    write_json_file(json_path, document);
  }
  return 0;
}

}  // namespace sluice::bench

#include <gtest/gtest.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/metrics/gateway_metrics.hpp"
#include "sluice/metrics/registry.hpp"

namespace sluice::metrics {
namespace {

// ---- A strict reader of the Prometheus text format 0.0.4, so the tests
// check the rendered text against the format rather than against itself.

struct ParsedSample {
  std::string name;
  std::map<std::string, std::string> labels;  // values unescaped
  double value = 0;
};

struct ParsedFamily {
  std::string name;
  std::string type;
  std::string help;  // unescaped
  std::vector<ParsedSample> samples;
};

struct Exposition {
  std::vector<ParsedFamily> families;
  std::vector<std::string> errors;  // empty when the text is valid

  const ParsedFamily* family(std::string_view name) const {
    for (const ParsedFamily& family : families) {
      if (family.name == name) return &family;
    }
    return nullptr;
  }
  // The value of the sample with exactly these labels, or NaN.
  double value(std::string_view sample_name,
               const std::map<std::string, std::string>& labels = {}) const {
    for (const ParsedFamily& family : families) {
      for (const ParsedSample& sample : family.samples) {
        if (sample.name == sample_name && sample.labels == labels) return sample.value;
      }
    }
    return std::numeric_limits<double>::quiet_NaN();
  }
};

bool name_char(char c, bool first, bool allow_colon) {
  const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const bool digit = c >= '0' && c <= '9';
  return letter || (allow_colon && c == ':') || (!first && digit);
}

// Reads a name at `at`; empty when there is none.
std::string read_name(std::string_view line, std::size_t& at, bool allow_colon) {
  const std::size_t start = at;
  while (at < line.size() && name_char(line[at], at == start, allow_colon)) ++at;
  return std::string(line.substr(start, at - start));
}

bool parse_float(std::string_view text, double& value) {
  if (text == "+Inf" || text == "Inf") {
    value = std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "-Inf") {
    value = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "NaN") {
    value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (text.empty()) return false;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

// `name{label="value",...} value`; returns an error message or "".
std::string parse_sample(std::string_view line, ParsedSample& sample) {
  std::size_t at = 0;
  sample.name = read_name(line, at, true);
  if (sample.name.empty()) return "bad metric name";
  if (at < line.size() && line[at] == '{') {
    ++at;
    while (true) {
      if (at < line.size() && line[at] == '}') {
        ++at;
        break;
      }
      const std::string label = read_name(line, at, false);
      if (label.empty()) return "bad label name";
      if (label.starts_with("__")) return "reserved label name " + label;
      if (at + 1 >= line.size() || line[at] != '=' || line[at + 1] != '"') {
        return "expected =\" after label " + label;
      }
      at += 2;
      std::string value;
      while (true) {
        if (at >= line.size()) return "unterminated label value";
        const char c = line[at++];
        if (c == '"') break;
        if (c == '\\') {
          if (at >= line.size()) return "dangling backslash";
          const char escaped = line[at++];
          if (escaped == '\\') {
            value += '\\';
          } else if (escaped == '"') {
            value += '"';
          } else if (escaped == 'n') {
            value += '\n';
          } else {
            return std::string("invalid escape \\") + escaped;
          }
        } else {
          value += c;
        }
      }
      if (!sample.labels.emplace(label, value).second) return "duplicate label " + label;
      if (at < line.size() && line[at] == ',') {
        ++at;
      } else if (at >= line.size() || line[at] != '}') {
        return "expected , or } after a label";
      }
    }
  }
  if (at >= line.size() || line[at] != ' ') return "expected a space before the value";
  ++at;
  std::string_view rest = line.substr(at);
  const std::size_t space = rest.find(' ');
  const std::string_view value_text = rest.substr(0, space);
  if (!parse_float(value_text, sample.value)) return "bad value '" + std::string(value_text) + "'";
  if (space != std::string_view::npos) {
    std::int64_t timestamp = 0;
    const std::string_view stamp = rest.substr(space + 1);
    auto [end, error] = std::from_chars(stamp.data(), stamp.data() + stamp.size(), timestamp);
    if (error != std::errc() || end != stamp.data() + stamp.size()) return "bad timestamp";
  }
  return "";
}

std::string unescape_help(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '\\' || text[i + 1] == 'n')) {
      out += text[i + 1] == 'n' ? '\n' : '\\';
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

void check_histogram(const ParsedFamily& family, std::vector<std::string>& errors) {
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
    bool has_sum = false;
    bool has_count = false;
    double count = 0;
  };
  std::map<std::map<std::string, std::string>, Series> series;
  for (const ParsedSample& sample : family.samples) {
    auto labels = sample.labels;
    if (sample.name == family.name + "_bucket") {
      auto le = labels.find("le");
      double bound = 0;
      if (le == labels.end() || !parse_float(le->second, bound)) {
        errors.push_back(family.name + ": bucket without a valid le");
        continue;
      }
      labels.erase(le);
      series[labels].buckets.emplace_back(bound, sample.value);
    } else if (sample.name == family.name + "_sum") {
      series[labels].has_sum = true;
    } else if (sample.name == family.name + "_count") {
      series[labels].has_count = true;
      series[labels].count = sample.value;
    } else {
      errors.push_back(family.name + ": unexpected sample " + sample.name);
    }
  }
  for (const auto& [labels, one] : series) {
    if (one.buckets.empty() || !std::isinf(one.buckets.back().first)) {
      errors.push_back(family.name + ": buckets do not end with le=\"+Inf\"");
      continue;
    }
    for (std::size_t i = 1; i < one.buckets.size(); ++i) {
      if (!(one.buckets[i - 1].first < one.buckets[i].first)) {
        errors.push_back(family.name + ": bucket bounds not increasing");
      }
      if (one.buckets[i - 1].second > one.buckets[i].second) {
        errors.push_back(family.name + ": bucket counts not cumulative");
      }
    }
    if (!one.has_sum) errors.push_back(family.name + ": no _sum");
    if (!one.has_count) errors.push_back(family.name + ": no _count");
    if (one.has_count && one.buckets.back().second != one.count) {
      errors.push_back(family.name + ": +Inf bucket differs from _count");
    }
  }
}

Exposition parse_prometheus_text(std::string_view text) {
  Exposition result;
  auto error = [&](std::size_t line_number, const std::string& message) {
    result.errors.push_back("line " + std::to_string(line_number) + ": " + message);
  };
  std::set<std::string> finished_families;
  ParsedFamily* current = nullptr;
  bool current_has_help = false;
  bool current_has_type = false;

  auto start_family = [&](const std::string& name, std::size_t line_number) {
    if (current != nullptr && current->name == name) return;
    if (current != nullptr) finished_families.insert(current->name);
    if (finished_families.contains(name)) error(line_number, name + " is split up");
    if (current != nullptr && !(current->name < name)) error(line_number, "families not sorted");
    result.families.push_back(ParsedFamily{name, "", "", {}});
    current = &result.families.back();
    current_has_help = false;
    current_has_type = false;
  };

  if (!text.empty() && text.back() != '\n') result.errors.push_back("no final newline");
  std::size_t line_number = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (line.empty()) {
      error(line_number, "empty line");
      continue;
    }
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
      const bool help = line[2] == 'H';
      std::size_t at = 7;
      const std::string name = read_name(line, at, true);
      if (name.empty() || at >= line.size() || line[at] != ' ') {
        error(line_number, "bad HELP/TYPE line");
        continue;
      }
      start_family(name, line_number);
      const std::string_view rest = line.substr(at + 1);
      if (!current->samples.empty()) error(line_number, name + ": HELP/TYPE after samples");
      if (help) {
        if (current_has_help) error(line_number, name + ": second HELP");
        current_has_help = true;
        current->help = unescape_help(rest);
      } else {
        if (current_has_type) error(line_number, name + ": second TYPE");
        current_has_type = true;
        static const std::set<std::string_view> kTypes = {"counter", "gauge", "histogram",
                                                          "summary", "untyped"};
        if (!kTypes.contains(rest)) error(line_number, name + ": unknown type");
        current->type = std::string(rest);
      }
      continue;
    }
    if (line.starts_with("#")) continue;  // other comments are allowed

    ParsedSample sample;
    const std::string problem = parse_sample(line, sample);
    if (!problem.empty()) {
      error(line_number, problem + " in '" + std::string(line) + "'");
      continue;
    }
    std::string family_name = sample.name;
    if (current != nullptr && current->type == "histogram") {
      for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
        if (sample.name == current->name + std::string(suffix)) family_name = current->name;
      }
    }
    if (current == nullptr || current->name != family_name) {
      error(line_number, sample.name + " does not follow its family's TYPE line");
      start_family(family_name, line_number);
    }
    if (current->type == "counter" && !(sample.value >= 0)) {
      error(line_number, "negative counter");
    }
    current->samples.push_back(std::move(sample));
  }

  for (const ParsedFamily& family : result.families) {
    if (family.type.empty()) result.errors.push_back(family.name + ": no TYPE");
    if (family.type == "histogram") check_histogram(family, result.errors);
  }
  return result;
}

std::string joined(const std::vector<std::string>& errors) {
  std::string out;
  for (const std::string& e : errors) out += e + "\n";
  return out;
}

// ---- the validator itself must reject what it claims to reject

TEST(PrometheusValidator, RejectsMalformedExpositions) {
  const std::vector<std::string> broken = {
      "# TYPE a counter\na{x=\"1} 1\n",                     // unterminated value
      "# TYPE a counter\na{x=\"\\t\"} 1\n",                 // invalid escape
      "# TYPE a counter\na{1x=\"1\"} 1\n",                  // label name syntax
      "# TYPE 1a counter\n1a 1\n",                          // metric name syntax
      "# TYPE a counter\n# TYPE a counter\na 1\n",          // TYPE twice
      "# TYPE a counter\na one\n",                          // value
      "# TYPE b counter\nb 1\n# TYPE a counter\na 1\n",     // not sorted
      "# TYPE a counter\na 1\n# TYPE b gauge\nb 1\na 2\n",  // family split up
      "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
      "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",  // no +Inf
      "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
      "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",  // no _sum
      "# TYPE a counter\na 1",                                     // no final newline
  };
  for (const std::string& text : broken) {
    EXPECT_FALSE(parse_prometheus_text(text).errors.empty()) << text;
  }
  const std::string valid =
      "# HELP a A \\\\ help\\nline.\n# TYPE a counter\na{x=\"q\\\"\\\\\\n\"} 1\n"
      "# TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3.5\nh_count 2\n";
  const Exposition parsed = parse_prometheus_text(valid);
  EXPECT_TRUE(parsed.errors.empty()) << joined(parsed.errors);
  EXPECT_EQ(parsed.value("a", {{"x", "q\"\\\n"}}), 1);
  EXPECT_EQ(parsed.family("a")->help, "A \\ help\nline.");
}

// ---- registry

TEST(Registry, RendersEveryKindAsValidText) {
  Registry registry(2);
  auto& requests = registry.counter("test_requests_total", "Requests.", {"model", "status"});
  requests.with({"gpt-4o", "200"}).add(0, 3);
  requests.with({"gpt-4o", "200"}).add(1, 2);
  requests.with({"weird \"model\"\\\nname", "500"}).add(0);
  registry.gauge("test_in_flight", "In flight.").with({}).set(7.5);
  auto& latency = registry.histogram("test_latency_seconds", "Latency.", {"model"});
  const HistogramHandle handle = latency.with({"gpt-4o"});
  for (double value : {0.00005, 0.0001, 0.003, 0.2, 0.2, 75.0}) handle.observe(1, value);
  registry.gauge_callback("test_pool", "Pool.\nSecond line with \\.", {{"state", "idle"}},
                          [] { return 4.0; });
  registry.gauge_callback("test_pool", "Pool.", {{"state", "active"}}, [] { return 2.0; });
  registry.histogram("test_empty_seconds", "No series yet.", {"model"});

  const std::string text = registry.render();
  const Exposition parsed = parse_prometheus_text(text);
  ASSERT_TRUE(parsed.errors.empty()) << joined(parsed.errors) << text;

  ASSERT_EQ(parsed.families.size(), 5u);
  EXPECT_EQ(parsed.families[0].name, "test_empty_seconds");
  EXPECT_EQ(parsed.family("test_requests_total")->type, "counter");
  EXPECT_EQ(parsed.family("test_in_flight")->type, "gauge");
  EXPECT_EQ(parsed.family("test_latency_seconds")->type, "histogram");
  EXPECT_EQ(parsed.family("test_pool")->type, "gauge");
  EXPECT_EQ(parsed.family("test_pool")->help, "Pool.\nSecond line with \\.");

  EXPECT_EQ(parsed.value("test_requests_total", {{"model", "gpt-4o"}, {"status", "200"}}), 5);
  EXPECT_EQ(parsed.value("test_requests_total",
                         {{"model", "weird \"model\"\\\nname"}, {"status", "500"}}),
            1);
  EXPECT_EQ(parsed.value("test_in_flight"), 7.5);
  EXPECT_EQ(parsed.value("test_pool", {{"state", "idle"}}), 4);
  EXPECT_EQ(parsed.value("test_pool", {{"state", "active"}}), 2);

  // le is inclusive: 0.0001 falls in the first bucket with 0.00005.
  EXPECT_EQ(parsed.value("test_latency_seconds_bucket", {{"model", "gpt-4o"}, {"le", "0.0001"}}),
            2);
  EXPECT_EQ(parsed.value("test_latency_seconds_bucket", {{"model", "gpt-4o"}, {"le", "0.005"}}), 3);
  EXPECT_EQ(parsed.value("test_latency_seconds_bucket", {{"model", "gpt-4o"}, {"le", "0.25"}}), 5);
  EXPECT_EQ(parsed.value("test_latency_seconds_bucket", {{"model", "gpt-4o"}, {"le", "60"}}), 5);
  EXPECT_EQ(parsed.value("test_latency_seconds_bucket", {{"model", "gpt-4o"}, {"le", "+Inf"}}), 6);
  EXPECT_EQ(parsed.value("test_latency_seconds_count", {{"model", "gpt-4o"}}), 6);
  EXPECT_DOUBLE_EQ(parsed.value("test_latency_seconds_sum", {{"model", "gpt-4o"}}),
                   0.00005 + 0.0001 + 0.003 + 0.2 + 0.2 + 75.0);
}

TEST(Registry, DefaultBucketsSpanALatencyRange) {
  const std::vector<double> bounds = default_latency_buckets();
  EXPECT_EQ(bounds.front(), 0.0001);
  EXPECT_EQ(bounds.back(), 60);
  EXPECT_GE(bounds.size(), 15u);
  EXPECT_LE(bounds.size(), 25u);
  EXPECT_TRUE(std::is_sorted(bounds.begin(), bounds.end()));
}

TEST(Registry, CountersFromFourThreadsAddUpExactly) {
  constexpr unsigned kThreads = 4;
  constexpr std::uint64_t kAdds = 250'000;
  Registry registry(kThreads);
  auto& family = registry.counter("test_total", "Test.", {"model", "deployment", "status"});
  auto& latency = registry.histogram("test_seconds", "Test.");
  std::vector<std::thread> threads;
  for (unsigned worker = 0; worker < kThreads; ++worker) {
    threads.emplace_back([&, worker] {
      // Each thread resolves its own handle: with() must give every
      // thread the same series.
      const CounterHandle counter = family.with({"gpt-4o", "openai-1", "200"});
      const HistogramHandle histogram = latency.with({});
      for (std::uint64_t i = 0; i < kAdds; ++i) {
        counter.add(worker);
        histogram.observe(worker, 0.5);
      }
      // A shard past the last one is shared with the last worker: the
      // adds must still all count.
      for (std::uint64_t i = 0; i < kAdds; ++i) counter.add(kThreads + 7, 2);
    });
  }
  for (auto& thread : threads) thread.join();

  EXPECT_EQ(family.with({"gpt-4o", "openai-1", "200"}).value(), kThreads * kAdds * 3);
  const HistogramHandle::Snapshot snapshot = latency.with({}).snapshot();
  EXPECT_EQ(snapshot.count, kThreads * kAdds);
  EXPECT_EQ(snapshot.sum, 0.5 * kThreads * kAdds);

  const Exposition parsed = parse_prometheus_text(registry.render());
  ASSERT_TRUE(parsed.errors.empty()) << joined(parsed.errors);
  EXPECT_EQ(parsed.value("test_total",
                         {{"model", "gpt-4o"}, {"deployment", "openai-1"}, {"status", "200"}}),
            static_cast<double>(kThreads * kAdds * 3));
}

TEST(Registry, CallbackGaugesAreReadAtScrapeTime) {
  Registry registry(1);
  double idle = 1;
  registry.gauge_callback("test_idle", "Idle.", {}, [&] { return idle; });
  std::vector<std::pair<std::string, bool>> deployments = {{"b", false}, {"a", true}};
  registry.gauge_collector("test_cooldown", "Cooldown.", {"deployment"},
                           [&](std::vector<GaugeSample>& out) {
                             for (const auto& [id, cooling] : deployments) {
                               out.push_back({{id}, cooling ? 1.0 : 0.0});
                             }
                             out.push_back({{"too", "many"}, 1.0});  // dropped, not rendered
                           });

  Exposition parsed = parse_prometheus_text(registry.render());
  ASSERT_TRUE(parsed.errors.empty()) << joined(parsed.errors);
  EXPECT_EQ(parsed.value("test_idle"), 1);
  EXPECT_EQ(parsed.value("test_cooldown", {{"deployment", "a"}}), 1);
  EXPECT_EQ(parsed.value("test_cooldown", {{"deployment", "b"}}), 0);
  EXPECT_EQ(parsed.family("test_cooldown")->samples.size(), 2u);
  EXPECT_EQ(parsed.family("test_cooldown")->samples[0].labels.at("deployment"), "a");

  idle = 9;
  deployments = {{"c", true}};
  parsed = parse_prometheus_text(registry.render());
  ASSERT_TRUE(parsed.errors.empty()) << joined(parsed.errors);
  EXPECT_EQ(parsed.value("test_idle"), 9);
  EXPECT_EQ(parsed.value("test_cooldown", {{"deployment", "c"}}), 1);
  EXPECT_EQ(parsed.family("test_cooldown")->samples.size(), 1u);
}

TEST(Registry, GaugesSetAndAdd) {
  Registry registry(2);
  const GaugeHandle gauge = registry.gauge("test_gauge", "Gauge.", {"pool"}).with({"x"});
  gauge.set(3);
  gauge.add(2.5);
  gauge.sub(1);
  EXPECT_EQ(gauge.value(), 4.5);
  const Exposition parsed = parse_prometheus_text(registry.render());
  EXPECT_EQ(parsed.value("test_gauge", {{"pool", "x"}}), 4.5);
}

TEST(Registry, ShardedGaugesSumTheStepsOfEveryShard) {
  Registry registry(3);
  const ShardedGaugeHandle gauge = registry.sharded_gauge("test_level", "Level.", {{"pool", "x"}});
  // A level raised on one shard and lowered on another: each cell alone is
  // far from the level, their sum is it.
  gauge.add(0, 5);
  gauge.sub(1, 7);
  gauge.add(2);
  gauge.add(9, 3);  // past the last shard: counted on the last one
  EXPECT_EQ(gauge.value(), 2);

  const Exposition parsed = parse_prometheus_text(registry.render());
  ASSERT_TRUE(parsed.errors.empty()) << joined(parsed.errors);
  const ParsedFamily* family = parsed.family("test_level");
  ASSERT_NE(family, nullptr);
  EXPECT_EQ(family->type, "gauge");
  EXPECT_EQ(parsed.value("test_level", {{"pool", "x"}}), 2);

  gauge.sub(0, 10);
  EXPECT_EQ(gauge.value(), -8);
  EXPECT_EQ(parse_prometheus_text(registry.render()).value("test_level", {{"pool", "x"}}), -8);
}

TEST(Registry, ShardedGaugeRegisteredAgainIsTheSameSeries) {
  Registry registry(2);
  const ShardedGaugeHandle first = registry.sharded_gauge("test_level", "Level.");
  const ShardedGaugeHandle second = registry.sharded_gauge("test_level", "Level.");
  first.add(0, 4);
  second.sub(1);
  EXPECT_EQ(first.value(), 3);
  EXPECT_EQ(second.value(), 3);
  const std::string text = registry.render();
  EXPECT_EQ(text.find("test_level 3\n"), text.rfind("test_level 3\n")) << text;
  EXPECT_EQ(parse_prometheus_text(text).value("test_level"), 3);
}

TEST(Registry, ShardedGaugeStepsFromFourThreadsNetExactly) {
  constexpr unsigned kThreads = 4;
  constexpr int kSteps = 100'000;
  Registry registry(kThreads);
  const ShardedGaugeHandle gauge = registry.sharded_gauge("test_in_flight", "In flight.");
  std::vector<std::thread> threads;
  for (unsigned worker = 0; worker < kThreads; ++worker) {
    threads.emplace_back([&, worker] {
      for (int i = 0; i < kSteps; ++i) {
        gauge.add(worker);
        // Lowered on a shard another thread raises, as a request handed
        // between workers would.
        gauge.sub((worker + 1) % kThreads);
      }
      gauge.add(worker, worker + 1);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(gauge.value(), 1 + 2 + 3 + 4);
}

TEST(Registry, SpecialValuesRenderAsGoFloats) {
  Registry registry(1);
  registry.gauge("test_a", "A.", {"k"}).with({"inf"}).set(std::numeric_limits<double>::infinity());
  registry.gauge("test_a", "A.", {"k"})
      .with({"ninf"})
      .set(-std::numeric_limits<double>::infinity());
  registry.gauge("test_a", "A.", {"k"}).with({"nan"}).set(std::numeric_limits<double>::quiet_NaN());
  registry.gauge("test_a", "A.", {"k"}).with({"tiny"}).set(1e-300);
  const std::string text = registry.render();
  EXPECT_NE(text.find("test_a{k=\"inf\"} +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("test_a{k=\"ninf\"} -Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("test_a{k=\"nan\"} NaN\n"), std::string::npos) << text;
  EXPECT_TRUE(parse_prometheus_text(text).errors.empty()) << text;
}

TEST(Registry, NumbersAreWrittenAsGoWritesThem) {
  // le values are compared as strings, so they must match what Prometheus'
  // Go clients write for the same bound.
  auto text = [](double value) {
    std::string out;
    append_prometheus_double(out, value);
    return out;
  };
  EXPECT_EQ(text(0.0001), "0.0001");
  EXPECT_EQ(text(0.00025), "0.00025");
  EXPECT_EQ(text(0.00005), "5e-05");
  EXPECT_EQ(text(60), "60");
  EXPECT_EQ(text(100000), "100000");
  EXPECT_EQ(text(1e6), "1e+06");
  EXPECT_EQ(text(1234567), "1.234567e+06");
  EXPECT_EQ(text(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(text(-2.5), "-2.5");
  EXPECT_EQ(text(0), "0");

  Registry registry(1);
  registry.histogram("test_seconds", "T.").with({}).observe(0, 0.001);
  const std::string rendered = registry.render();
  EXPECT_NE(rendered.find("test_seconds_bucket{le=\"0.0001\"} 0\n"), std::string::npos) << rendered;
  EXPECT_NE(rendered.find("test_seconds_bucket{le=\"0.001\"} 1\n"), std::string::npos);
}

TEST(Registry, NanObservationsAreIgnored) {
  Registry registry(1);
  const HistogramHandle handle = registry.histogram("test_seconds", "T.").with({});
  handle.observe(0, std::numeric_limits<double>::quiet_NaN());
  handle.observe(0, 1.0);
  EXPECT_EQ(handle.snapshot().count, 1u);
  EXPECT_EQ(handle.snapshot().sum, 1.0);
}

TEST(Registry, RegistrationIsIdempotentAndClashesThrow) {
  Registry registry(1);
  CounterFamily& first = registry.counter("test_total", "T.", {"a"});
  EXPECT_EQ(&registry.counter("test_total", "T.", {"a"}), &first);
  EXPECT_THROW(registry.counter("test_total", "T.", {"b"}), std::invalid_argument);
  EXPECT_THROW(registry.gauge("test_total", "T.", {"a"}), std::invalid_argument);
  registry.histogram("test_seconds", "T.", {}, {1, 2});
  EXPECT_THROW(registry.histogram("test_seconds", "T.", {}, {1, 3}), std::invalid_argument);

  EXPECT_THROW(registry.counter("1bad", "T."), std::invalid_argument);
  EXPECT_THROW(registry.counter("bad-name", "T."), std::invalid_argument);
  EXPECT_THROW(registry.counter("test_x", "T.", {"__reserved"}), std::invalid_argument);
  EXPECT_THROW(registry.counter("test_y", "T.", {"a:b"}), std::invalid_argument);
  EXPECT_THROW(registry.counter("test_z", "T.", {"a", "a"}), std::invalid_argument);
  EXPECT_THROW(registry.histogram("test_h", "T.", {"le"}), std::invalid_argument);
  EXPECT_THROW(registry.histogram("test_h2", "T.", {}, {2, 1}), std::invalid_argument);
  EXPECT_THROW(registry.histogram("test_h3", "T.", {}, {}), std::invalid_argument);
  EXPECT_THROW(first.with({"x", "y"}), std::invalid_argument);
  EXPECT_NO_THROW(registry.counter("ns:test_ok_total", "T."));
}

TEST(Registry, UnboundHandlesIgnoreUpdates) {
  CounterHandle counter;
  GaugeHandle gauge;
  HistogramHandle histogram;
  ShardedGaugeHandle level;
  counter.add(0);
  gauge.set(1);
  histogram.observe(0, 1);
  level.add(0, 3);
  EXPECT_FALSE(counter.bound());
  EXPECT_EQ(counter.value(), 0u);
  EXPECT_EQ(gauge.value(), 0);
  EXPECT_FALSE(level.bound());
  EXPECT_EQ(level.value(), 0);
  EXPECT_EQ(histogram.snapshot().count, 0u);
}

TEST(Registry, ManySeriesSpanSeveralChunks) {
  Registry registry(3);
  auto& family = registry.counter("test_total", "T.", {"i"});
  auto& histograms = registry.histogram("test_seconds", "T.", {"i"});
  std::vector<CounterHandle> counters;
  for (int i = 0; i < 2000; ++i) {
    counters.push_back(family.with({std::to_string(i)}));
    histograms.with({std::to_string(i)}).observe(static_cast<unsigned>(i % 3), 0.01);
  }
  for (int i = 0; i < 2000; ++i) counters[i].add(static_cast<unsigned>(i % 3), i);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(counters[i].value(), static_cast<std::uint64_t>(i));
  const Exposition parsed = parse_prometheus_text(registry.render());
  ASSERT_TRUE(parsed.errors.empty()) << joined(parsed.errors);
  EXPECT_EQ(parsed.value("test_total", {{"i", "1999"}}), 1999);
  EXPECT_EQ(parsed.value("test_seconds_count", {{"i", "1234"}}), 1);
}

// ---- the sluice metric set renders as valid text too

TEST(GatewayMetricsExposition, EveryFamilyIsPresentAndValid) {
  Registry registry(2);
  GatewayMetricsSources sources;
  sources.upstream_connections = [] { return UpstreamConnectionCounts{5, 3, 7}; };
  sources.deployment_cooldowns = [](std::vector<DeploymentCooldown>& out) {
    out.push_back({"openai-1", false});
    out.push_back({"azure-1", true});
  };
  GatewayMetrics metrics(registry, std::move(sources));
  metrics.requests("gpt-4o", "openai-1", 200).add(0);
  metrics.requests("nope", "", 404).add(1);
  const ModelMetrics model = metrics.model("gpt-4o");
  model.request_duration.observe(0, 1.5);
  model.inter_token_gap.observe(0, 0.02);
  model.retries.add(0);
  model.fallbacks.add(0);
  model.hedges_fired.add(0);
  model.hedges_won.add(1);
  model.cache_hits.add(0);
  model.cache_misses.add(1);
  const DeploymentMetrics deployment = metrics.deployment("gpt-4o", "openai-1");
  deployment.ttft.observe(1, 0.3);
  deployment.upstream_connect.observe(1, 0.004);
  metrics.tokens("gpt-4o", "team-a").prompt.add(0, 12);
  metrics.tokens("gpt-4o", "team-a").completion.add(0, 340);
  BudgetOverruns overruns;
  overruns.insert(BudgetStage::gateway);
  overruns.insert(BudgetStage::total);
  metrics.count_budget_overruns(0, overruns);
  metrics.gateway_overhead.observe(0, 0.00008);
  metrics.requests_in_flight.add(0, 2);
  metrics.upstream_connections_opened.add(1);
  metrics.client_disconnects.add(0);
  metrics.internal_errors.add(1);

  const std::string text = registry.render();
  const Exposition parsed = parse_prometheus_text(text);
  ASSERT_TRUE(parsed.errors.empty()) << joined(parsed.errors) << text;

  const std::map<std::string, std::string> expected_types = {
      {"sluice_requests_total", "counter"},
      {"sluice_request_duration_seconds", "histogram"},
      {"sluice_ttft_seconds", "histogram"},
      {"sluice_inter_token_gap_seconds", "histogram"},
      {"sluice_gateway_overhead_seconds", "histogram"},
      {"sluice_upstream_connect_seconds", "histogram"},
      {"sluice_requests_in_flight", "gauge"},
      {"sluice_upstream_connections", "gauge"},
      {"sluice_upstream_connections_opened_total", "counter"},
      {"sluice_upstream_streams_active", "gauge"},
      {"sluice_retries_total", "counter"},
      {"sluice_fallbacks_total", "counter"},
      {"sluice_hedges_total", "counter"},
      {"sluice_cache_lookups_total", "counter"},
      {"sluice_deployment_cooldown", "gauge"},
      {"sluice_tokens_total", "counter"},
      {"sluice_budget_exceeded_total", "counter"},
      {"sluice_client_disconnects_total", "counter"},
      {"sluice_internal_errors_total", "counter"},
      {"sluice_quality_failures_total", "counter"},
      {"sluice_deadline_seconds", "gauge"},
      {"sluice_concurrency_limit", "gauge"},
  };
  EXPECT_EQ(parsed.families.size(), expected_types.size());
  for (const auto& [name, type] : expected_types) {
    const ParsedFamily* family = parsed.family(name);
    ASSERT_NE(family, nullptr) << name;
    EXPECT_EQ(family->type, type) << name;
    EXPECT_FALSE(family->help.empty()) << name;
  }

  EXPECT_EQ(parsed.value("sluice_requests_total",
                         {{"model", "gpt-4o"}, {"deployment", "openai-1"}, {"status", "200"}}),
            1);
  EXPECT_EQ(parsed.value("sluice_requests_total",
                         {{"model", "nope"}, {"deployment", ""}, {"status", "404"}}),
            1);
  EXPECT_EQ(parsed.value("sluice_hedges_total", {{"model", "gpt-4o"}, {"outcome", "won"}}), 1);
  EXPECT_EQ(parsed.value("sluice_upstream_streams_active", {}), 7);
  EXPECT_EQ(parsed.value("sluice_cache_lookups_total", {{"model", "gpt-4o"}, {"result", "hit"}}),
            1);
  EXPECT_EQ(parsed.value("sluice_cache_lookups_total", {{"model", "gpt-4o"}, {"result", "miss"}}),
            1);
  EXPECT_EQ(
      parsed.value("sluice_cache_lookups_total", {{"model", "gpt-4o"}, {"result", "semantic_hit"}}),
      0);
  EXPECT_EQ(
      parsed.value("sluice_ttft_seconds_count", {{"model", "gpt-4o"}, {"deployment", "openai-1"}}),
      1);
  EXPECT_EQ(parsed.value("sluice_upstream_connect_seconds_count", {{"deployment", "openai-1"}}), 1);
  EXPECT_EQ(parsed.value("sluice_tokens_total",
                         {{"model", "gpt-4o"}, {"key", "team-a"}, {"kind", "completion"}}),
            340);
  EXPECT_EQ(parsed.value("sluice_budget_exceeded_total", {{"stage", "gateway"}}), 1);
  EXPECT_EQ(parsed.value("sluice_budget_exceeded_total", {{"stage", "upstream_ttfb"}}), 0);
  EXPECT_EQ(parsed.value("sluice_budget_exceeded_total", {{"stage", "total"}}), 1);
  EXPECT_EQ(parsed.value("sluice_upstream_connections", {{"state", "idle"}}), 5);
  EXPECT_EQ(parsed.value("sluice_upstream_connections", {{"state", "active"}}), 3);
  EXPECT_EQ(parsed.value("sluice_deployment_cooldown", {{"deployment", "azure-1"}}), 1);
  EXPECT_EQ(parsed.value("sluice_deployment_cooldown", {{"deployment", "openai-1"}}), 0);
  EXPECT_EQ(parsed.value("sluice_requests_in_flight"), 2);
  EXPECT_EQ(parsed.value("sluice_gateway_overhead_seconds_count"), 1);
  EXPECT_EQ(parsed.value("sluice_client_disconnects_total"), 1);
  EXPECT_EQ(parsed.value("sluice_internal_errors_total"), 1);
}

}  // namespace
}  // namespace sluice::metrics

#pragma once

// The doctor's arithmetic: percentiles, the prefill fit, the queueing knee,
// the verdict and the suggestions, as plain functions of measured samples, so
// that the active mode (requests of its own) and the passive mode (a running
// gateway's records) reach their conclusions by the same code.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice::doctor {

// Linear interpolation between the closest ranks (0 <= q <= 1); 0 for no
// samples. `samples` need not be sorted.
double quantile(std::vector<double> samples, double q);

struct Spread {
  std::size_t samples = 0;
  double median = 0;
  double p95 = 0;
  double p99 = 0;
  double iqr = 0;  // P75 - P25
  double mean = 0;
};
Spread spread(const std::vector<double>& samples);

// TTFT = intercept + slope * tokens, by ordinary least squares.
struct LinearFit {
  bool valid = false;  // at least two distinct token counts
  double intercept_ms = 0;
  double ms_per_token = 0;
  double r_squared = 0;
  double ms_per_1k_tokens() const { return ms_per_token * 1000.0; }
  double predict(double tokens) const { return intercept_ms + ms_per_token * tokens; }
};
struct PromptSample {
  double tokens = 0;
  double ttft_ms = 0;
};
LinearFit fit_prefill(const std::vector<PromptSample>& samples);

// Step 1: the same small request over fresh and over kept-alive connections.
struct NetworkSamples {
  std::vector<double> dns_ms;      // fresh only
  std::vector<double> connect_ms;  // fresh only: TCP, about one round trip
  std::vector<double> tls_ms;      // fresh only, empty for plain HTTP
  std::vector<double> fresh_ttfb_ms;
  std::vector<double> pooled_ttfb_ms;
  std::vector<double> fresh_ttft_ms;
  std::vector<double> pooled_ttft_ms;
};
struct NetworkFindings {
  Spread dns, connect, tls, fresh_ttfb, pooled_ttfb, fresh_ttft, pooled_ttft;
  // What a fresh connection adds to TTFT (median fresh - median pooled,
  // never below 0): what warm_connections saves.
  double setup_ms = 0;
  // The network's part of a request's TTFT on a fresh connection: the setup
  // plus one round trip (TCP connect time) for the request itself.
  double share_fresh = 0;
  // The same on a kept-alive connection: one round trip.
  double share_pooled = 0;
};
NetworkFindings analyse_network(const NetworkSamples& samples);

// Step 2: TTFT by prompt size.
struct SizeFindings {
  double tokens = 0;
  Spread ttft;
};
struct PrefillFindings {
  std::vector<SizeFindings> sizes;  // by increasing size
  LinearFit fit;
  double largest_tokens = 0;
  // What prefill costs at the largest size measured (slope * tokens).
  double prefill_ms_at_largest = 0;
};
PrefillFindings analyse_prefill(const std::vector<PromptSample>& samples);

// Step 3: TTFT at rising concurrency; each level's requests were sent
// together (a burst of `concurrency` at once).
struct LevelSamples {
  unsigned concurrency = 0;
  std::vector<double> ttft_ms;
};
struct LevelFindings {
  unsigned concurrency = 0;
  Spread ttft;
};
struct QueueFindings {
  std::vector<LevelFindings> levels;  // by increasing concurrency
  // The first level whose median is more than 1.5x the lowest level's.
  std::optional<unsigned> knee;
  // Requests the deployment serves at once, estimated from the highest
  // level: a burst of c into n slots of service time T waits in waves, so its
  // mean TTFT is T * (c/n + 1) / 2 and n = c / (2 * mean / T - 1). Only
  // with a knee.
  std::optional<double> capacity;
  // The wait the highest level adds over the lowest (median against median).
  double queueing_ms = 0;
};
QueueFindings analyse_queueing(std::vector<LevelSamples> levels);
// The knee and the added wait from levels already summarised (by
// increasing concurrency); `bursts` when each level was one burst, which
// the capacity estimate assumes.
QueueFindings queueing_from_levels(std::vector<LevelFindings> levels, bool bursts);

enum class Cause { none, network, prefill, queueing };
const char* to_string(Cause cause);

struct Verdict {
  Cause dominant = Cause::none;
  double network_ms = 0;   // a fresh connection's setup
  double prefill_ms = 0;   // at the largest prompt measured
  double queueing_ms = 0;  // at the highest concurrency measured
  double base_ms = 0;      // a small request on a kept-alive connection, unloaded
  std::string text;        // the plain-words sentence
};
// The largest of the three costs is the cause when it is above half the
// base TTFT and at least twice each of the other two.
Verdict judge(const std::optional<NetworkFindings>& network,
              const std::optional<PrefillFindings>& prefill,
              const std::optional<QueueFindings>& queueing, double base_ms);

struct Suggestion {
  std::string line;          // a config line, as it goes under the deployment
  std::string reason;        // why, with the number it follows from
  bool under_model = false;  // the line goes under the deployment's model instead
};
struct SuggestionInputs {
  unsigned current_warm_connections = 1;
  // The P99 of every TTFT measured, for timeouts.ttft.
  double p99_ttft_ms = 0;
};
std::vector<Suggestion> suggest(const std::optional<NetworkFindings>& network,
                                const std::optional<PrefillFindings>& prefill,
                                const std::optional<QueueFindings>& queueing,
                                const SuggestionInputs& inputs);

// "12 ms", "1.2 s": how durations are written in verdicts and tables.
std::string format_ms(double ms);

}  // namespace sluice::doctor

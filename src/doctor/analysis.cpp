#include "sluice/doctor/analysis.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

namespace sluice::doctor {

double quantile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double position = std::clamp(q, 0.0, 1.0) * static_cast<double>(samples.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(position));
  const auto above = std::min(below + 1, samples.size() - 1);
  const double weight = position - static_cast<double>(below);
  return samples[below] + (samples[above] - samples[below]) * weight;
}

Spread spread(const std::vector<double>& samples) {
  Spread out;
  out.samples = samples.size();
  if (samples.empty()) return out;
  out.median = quantile(samples, 0.5);
  out.p95 = quantile(samples, 0.95);
  out.p99 = quantile(samples, 0.99);
  out.iqr = quantile(samples, 0.75) - quantile(samples, 0.25);
  out.mean =
      std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  return out;
}

LinearFit fit_prefill(const std::vector<PromptSample>& samples) {
  LinearFit fit;
  if (samples.size() < 2) return fit;
  const double n = static_cast<double>(samples.size());
  double mean_x = 0;
  double mean_y = 0;
  for (const auto& sample : samples) {
    mean_x += sample.tokens;
    mean_y += sample.ttft_ms;
  }
  mean_x /= n;
  mean_y /= n;
  double sxx = 0;
  double sxy = 0;
  double syy = 0;
  for (const auto& sample : samples) {
    const double dx = sample.tokens - mean_x;
    const double dy = sample.ttft_ms - mean_y;
    sxx += dx * dx;
    sxy += dx * dy;
    syy += dy * dy;
  }
  if (sxx <= 0) return fit;
  fit.valid = true;
  fit.ms_per_token = sxy / sxx;
  fit.intercept_ms = mean_y - fit.ms_per_token * mean_x;
  // All TTFTs equal: the line explains them completely.
  fit.r_squared = syy > 0 ? (sxy * sxy) / (sxx * syy) : 1.0;
  return fit;
}

NetworkFindings analyse_network(const NetworkSamples& samples) {
  NetworkFindings out;
  out.dns = spread(samples.dns_ms);
  out.connect = spread(samples.connect_ms);
  out.tls = spread(samples.tls_ms);
  out.fresh_ttfb = spread(samples.fresh_ttfb_ms);
  out.pooled_ttfb = spread(samples.pooled_ttfb_ms);
  out.fresh_ttft = spread(samples.fresh_ttft_ms);
  out.pooled_ttft = spread(samples.pooled_ttft_ms);
  out.setup_ms = std::max(0.0, out.fresh_ttft.median - out.pooled_ttft.median);
  const double round_trip = out.connect.median;
  if (out.fresh_ttft.median > 0) {
    out.share_fresh = std::min(1.0, (out.setup_ms + round_trip) / out.fresh_ttft.median);
  }
  if (out.pooled_ttft.median > 0) {
    out.share_pooled = std::min(1.0, round_trip / out.pooled_ttft.median);
  }
  return out;
}

PrefillFindings analyse_prefill(const std::vector<PromptSample>& samples) {
  PrefillFindings out;
  std::map<double, std::vector<double>> by_size;
  for (const auto& sample : samples) by_size[sample.tokens].push_back(sample.ttft_ms);
  for (const auto& [tokens, ttfts] : by_size) out.sizes.push_back({tokens, spread(ttfts)});
  out.fit = fit_prefill(samples);
  if (!by_size.empty()) out.largest_tokens = by_size.rbegin()->first;
  if (out.fit.valid) {
    out.prefill_ms_at_largest = std::max(0.0, out.fit.ms_per_token * out.largest_tokens);
  }
  return out;
}

QueueFindings analyse_queueing(std::vector<LevelSamples> levels) {
  std::vector<LevelFindings> summarised;
  for (const auto& level : levels) {
    if (level.ttft_ms.empty()) continue;
    summarised.push_back({level.concurrency, spread(level.ttft_ms)});
  }
  return queueing_from_levels(std::move(summarised), true);
}

QueueFindings queueing_from_levels(std::vector<LevelFindings> levels, bool bursts) {
  QueueFindings out;
  std::sort(levels.begin(), levels.end(),
            [](const auto& a, const auto& b) { return a.concurrency < b.concurrency; });
  out.levels = std::move(levels);
  if (out.levels.empty()) return out;
  const auto& lowest = out.levels.front();
  const auto& highest = out.levels.back();
  const double base = lowest.ttft.median;
  for (const auto& level : out.levels) {
    if (level.concurrency > lowest.concurrency && level.ttft.median > 1.5 * base) {
      out.knee = level.concurrency;
      break;
    }
  }
  out.queueing_ms = std::max(0.0, highest.ttft.median - base);
  if (bursts && out.knee && base > 0) {
    const double waves = 2.0 * highest.ttft.mean / base - 1.0;
    if (waves > 1.0) out.capacity = static_cast<double>(highest.concurrency) / waves;
  }
  return out;
}

const char* to_string(Cause cause) {
  switch (cause) {
    case Cause::network:
      return "network";
    case Cause::prefill:
      return "prefill";
    case Cause::queueing:
      return "queueing";
    case Cause::none:
      break;
  }
  return "none";
}

std::string format_ms(double ms) {
  char text[32];
  if (ms >= 10000) {
    std::snprintf(text, sizeof text, "%.0f s", ms / 1000);
  } else if (ms >= 1000) {
    std::snprintf(text, sizeof text, "%.1f s", ms / 1000);
  } else if (ms >= 10) {
    std::snprintf(text, sizeof text, "%.0f ms", ms);
  } else {
    std::snprintf(text, sizeof text, "%.1f ms", ms);
  }
  return text;
}

namespace {

std::string percent(double share) {
  char text[16];
  std::snprintf(text, sizeof text, "%.0f%%", share * 100);
  return text;
}

std::string number(double value, const char* format) {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

}  // namespace

Verdict judge(const std::optional<NetworkFindings>& network,
              const std::optional<PrefillFindings>& prefill,
              const std::optional<QueueFindings>& queueing, double base_ms) {
  Verdict verdict;
  verdict.base_ms = base_ms;
  std::vector<std::string> parts;
  if (network) {
    verdict.network_ms = network->setup_ms;
    parts.push_back("network is " + percent(network->share_fresh) +
                    " of TTFT on a fresh connection (a new connection adds " +
                    format_ms(network->setup_ms) + "), " + percent(network->share_pooled) +
                    " on a kept-alive one");
  }
  if (prefill && prefill->fit.valid) {
    verdict.prefill_ms = prefill->prefill_ms_at_largest;
    parts.push_back("prefill costs " + format_ms(prefill->fit.ms_per_1k_tokens()) +
                    " per 1k tokens (R² " + number(prefill->fit.r_squared, "%.2f") + "), so a " +
                    number(prefill->largest_tokens, "%.0f") + "-token prompt spends " +
                    format_ms(prefill->prefill_ms_at_largest) + " before the first token");
  }
  if (queueing && !queueing->levels.empty()) {
    verdict.queueing_ms = queueing->queueing_ms;
    if (queueing->knee) {
      std::string part = "queueing starts at " + std::to_string(*queueing->knee) +
                         " concurrent requests (+" + format_ms(queueing->queueing_ms) + " at " +
                         std::to_string(queueing->levels.back().concurrency) + ")";
      if (queueing->capacity) {
        part += ", the deployment serves about " + number(*queueing->capacity, "%.1f") + " at once";
      }
      parts.push_back(std::move(part));
    } else {
      parts.push_back("no queueing up to " + std::to_string(queueing->levels.back().concurrency) +
                      " concurrent requests");
    }
  }

  struct Candidate {
    Cause cause;
    double ms;
  };
  std::vector<Candidate> costs{{Cause::network, verdict.network_ms},
                               {Cause::prefill, verdict.prefill_ms},
                               {Cause::queueing, verdict.queueing_ms}};
  std::sort(costs.begin(), costs.end(),
            [](const Candidate& a, const Candidate& b) { return a.ms > b.ms; });
  const bool above_base = costs[0].ms > 0.5 * base_ms && costs[0].ms > 0;
  const bool clear = costs[0].ms >= 2.0 * costs[1].ms;
  std::string lead;
  if (above_base && clear) {
    verdict.dominant = costs[0].cause;
    lead = std::string("mostly ") + to_string(verdict.dominant) + ": ";
  } else if (above_base) {
    lead = "no single cause: ";
  } else {
    lead = "no added cause: the provider's own TTFT (" + format_ms(base_ms) + ") is most of it; ";
  }
  verdict.text = lead;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    verdict.text += (i == 0 ? "" : "; ") + parts[i];
  }
  return verdict;
}

namespace {

// Durations in config lines: whole milliseconds below 10 s, tenths of a
// second above, always a form config::parse_duration reads.
std::string config_duration(double ms) {
  if (ms < 10000) return std::to_string(static_cast<long long>(std::ceil(ms / 10) * 10)) + "ms";
  return std::to_string(static_cast<long long>(std::ceil(ms / 1000))) + "s";
}

}  // namespace

std::vector<Suggestion> suggest(const std::optional<NetworkFindings>& network,
                                const std::optional<PrefillFindings>& prefill,
                                const std::optional<QueueFindings>& queueing,
                                const SuggestionInputs& inputs) {
  std::vector<Suggestion> out;
  std::optional<unsigned> max_parallel;
  if (queueing && queueing->knee) {
    if (queueing->capacity) {
      max_parallel = std::max(1u, static_cast<unsigned>(std::floor(*queueing->capacity + 0.25)));
    } else {
      max_parallel = std::max(1u, *queueing->knee / 2);
    }
  }
  if (network && network->fresh_ttft.median > 0 &&
      network->setup_ms > 0.2 * network->fresh_ttft.median) {
    const unsigned warm = std::max(inputs.current_warm_connections + 1, max_parallel.value_or(4));
    out.push_back({"warm_connections: " + std::to_string(warm),
                   "a fresh connection adds " + format_ms(network->setup_ms) + ", " +
                       percent(network->setup_ms / network->fresh_ttft.median) +
                       " of its TTFT; kept-alive connections skip it"});
  }
  if (prefill && prefill->fit.valid && prefill->fit.ms_per_token > 0) {
    const double at_largest = prefill->fit.predict(prefill->largest_tokens);
    if (at_largest > 0 && prefill->prefill_ms_at_largest > 0.5 * at_largest) {
      // Where prefill costs no more than the rest of a small request's TTFT.
      const double even = std::max(0.0, prefill->fit.intercept_ms) / prefill->fit.ms_per_token;
      const auto tokens =
          std::max<std::uint64_t>(1000, static_cast<std::uint64_t>(std::floor(even / 500.0)) * 500);
      out.push_back({"shaping: {trim_history: {max_prompt_tokens: " + std::to_string(tokens) + "}}",
                     "prefill is " + percent(prefill->prefill_ms_at_largest / at_largest) +
                         " of TTFT at " + number(prefill->largest_tokens, "%.0f") + " tokens (" +
                         format_ms(prefill->fit.ms_per_1k_tokens()) + " per 1k tokens)",
                     true});
    }
  }
  if (max_parallel) {
    std::string reason =
        "queueing starts at " + std::to_string(*queueing->knee) + " concurrent requests";
    if (queueing->capacity) {
      reason += "; about " + number(*queueing->capacity, "%.1f") + " are served at once";
    }
    out.push_back({"max_parallel: " + std::to_string(*max_parallel), std::move(reason)});
  }
  if (inputs.p99_ttft_ms > 0) {
    out.push_back({"timeouts: {ttft: " + config_duration(2 * inputs.p99_ttft_ms) + "}",
                   "twice the measured P99 TTFT (" + format_ms(inputs.p99_ttft_ms) + ")"});
  }
  return out;
}

}  // namespace sluice::doctor

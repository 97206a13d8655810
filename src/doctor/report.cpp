#include "sluice/doctor/report.hpp"

#include <algorithm>
#include <cstdio>

namespace sluice::doctor {

namespace {

std::string fixed(double value, const char* format) {
  char text[48];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string ms_cell(double ms) { return fixed(ms, ms >= 100 ? "%.0f" : "%.1f"); }

std::string pad(std::string text, std::size_t width) {
  // Counts code points, so "R²" lines up with plain ASCII.
  std::size_t shown = 0;
  for (unsigned char c : text) shown += (c & 0xC0) != 0x80;
  if (shown < width) text.append(width - shown, ' ');
  return text;
}

void append_all_ttfts(std::vector<double>& out, const std::vector<double>& more) {
  out.insert(out.end(), more.begin(), more.end());
}

nlohmann::json spread_json(const Spread& spread) {
  return {{"samples", spread.samples}, {"median_ms", spread.median}, {"p95_ms", spread.p95},
          {"p99_ms", spread.p99},      {"iqr_ms", spread.iqr},       {"mean_ms", spread.mean}};
}

// The network step's rows, in the order every output lists them.
template <class Row>
void for_each_network_row(const NetworkFindings& network, Row row) {
  row("DNS", network.dns);
  row("connect", network.connect);
  row("TLS", network.tls);
  row("TTFB fresh", network.fresh_ttfb);
  row("TTFB pooled", network.pooled_ttfb);
  row("TTFT fresh", network.fresh_ttft);
  row("TTFT pooled", network.pooled_ttft);
}

}  // namespace

void conclude(DeploymentReport& report, unsigned warm_connections, double p99_ttft_ms) {
  // A small request, unloaded, on a kept-alive connection: the lowest
  // concurrency's median, which a gateway's overall first-byte times would
  // overstate under load.
  double base = 0;
  if (report.queueing && !report.queueing->levels.empty()) {
    base = report.queueing->levels.front().ttft.median;
  } else if (report.network && report.network->pooled_ttft.samples > 0) {
    base = report.network->pooled_ttft.median;
  } else if (report.prefill && report.prefill->fit.valid) {
    base = std::max(0.0, report.prefill->fit.intercept_ms);
  }
  report.verdict = judge(report.network, report.prefill, report.queueing, base);
  report.suggestions = suggest(report.network, report.prefill, report.queueing,
                               SuggestionInputs{warm_connections, p99_ttft_ms});
}

DeploymentReport diagnose(const Measurement& measurement, unsigned warm_connections) {
  DeploymentReport report;
  report.model = measurement.model;
  report.deployment = measurement.deployment;
  report.failure = measurement.failure;
  report.requests_sent = measurement.requests_sent;
  report.requests_failed = measurement.requests_failed;
  report.last_error = measurement.last_error;
  if (!report.failure.empty()) return report;
  const auto& network = measurement.network;
  if (!network.fresh_ttft_ms.empty() || !network.pooled_ttft_ms.empty()) {
    report.network = analyse_network(network);
  }
  if (!measurement.prompts.empty()) {
    report.prefill = analyse_prefill(measurement.prompts);
    report.prompt_samples = measurement.prompts;
  }
  if (!measurement.levels.empty()) report.queueing = analyse_queueing(measurement.levels);
  std::vector<double> all;
  append_all_ttfts(all, network.fresh_ttft_ms);
  append_all_ttfts(all, network.pooled_ttft_ms);
  for (const auto& sample : measurement.prompts) all.push_back(sample.ttft_ms);
  for (const auto& level : measurement.levels) append_all_ttfts(all, level.ttft_ms);
  conclude(report, warm_connections, quantile(all, 0.99));
  return report;
}

std::string render_text(const std::vector<DeploymentReport>& reports) {
  std::string out;
  for (const auto& report : reports) {
    out += "== " + report.model + " / " + report.deployment;
    if (report.requests_sent > 0) out += " (" + std::to_string(report.requests_sent) + " requests)";
    out += "\n";
    if (!report.failure.empty()) {
      out += "  FAILED: " + report.failure + "\n\n";
      continue;
    }
    if (report.requests_failed > 0) {
      out += "  " + std::to_string(report.requests_failed) +
             " requests failed and are left out; the last: " + report.last_error + "\n";
    }
    if (const auto& n = report.network) {
      out += "  network        median     P95\n";
      const auto row = [&](const char* name, const Spread& spread) {
        if (spread.samples == 0) return;
        out += "    " + pad(name, 12) + pad(ms_cell(spread.median), 11) + ms_cell(spread.p95) +
               " ms\n";
      };
      for_each_network_row(*n, row);
      out += "    a new connection adds " + format_ms(n->setup_ms) + "; network share of TTFT " +
             fixed(n->share_fresh * 100, "%.0f") + "% fresh, " +
             fixed(n->share_pooled * 100, "%.0f") + "% pooled\n";
    }
    if (const auto& p = report.prefill) {
      std::string tokens = "    " + pad("tokens", 12);
      std::string median = "    " + pad("TTFT median", 12);
      for (const auto& size : p->sizes) {
        tokens += pad(fixed(size.tokens, "%.0f"), 9);
        median += pad(ms_cell(size.ttft.median), 9);
      }
      out += "  input length\n" + tokens + "\n" + median + "ms\n";
      if (p->fit.valid) {
        out += "    fit: " + fixed(p->fit.ms_per_1k_tokens(), "%.1f") + " ms per 1k tokens + " +
               fixed(p->fit.intercept_ms, "%.1f") + " ms, R² " + fixed(p->fit.r_squared, "%.2f") +
               "\n";
      }
    }
    if (const auto& q = report.queueing) {
      std::string level = "    " + pad("concurrency", 12);
      std::string median = "    " + pad("median", 12);
      std::string p95 = "    " + pad("P95", 12);
      std::string iqr = "    " + pad("IQR", 12);
      for (const auto& l : q->levels) {
        level += pad(std::to_string(l.concurrency), 9);
        median += pad(ms_cell(l.ttft.median), 9);
        p95 += pad(ms_cell(l.ttft.p95), 9);
        iqr += pad(ms_cell(l.ttft.iqr), 9);
      }
      out += "  queueing\n" + level + "\n" + median + "ms\n" + p95 + "ms\n" + iqr + "ms\n";
      out += "    knee: " + (q->knee ? std::to_string(*q->knee) : std::string("none"));
      if (q->capacity) out += ", about " + fixed(*q->capacity, "%.1f") + " served at once";
      out += "\n";
    }
    out += "  verdict: " + report.verdict.text + "\n";
    if (!report.suggestions.empty()) {
      out += "  suggestions:\n";
      for (const auto& suggestion : report.suggestions) {
        out += "    " + pad(suggestion.line, 50) + " # " +
               (suggestion.under_model ? "under model " + report.model + ": " : "") +
               suggestion.reason + "\n";
      }
    }
    out += "\n";
  }
  // One line per deployment, for a glance over many.
  out += pad("deployment", 24) + pad("cause", 10) + pad("network", 10) + pad("prefill", 10) +
         pad("queueing", 10) + "base\n";
  for (const auto& report : reports) {
    out += pad(report.model + "/" + report.deployment, 24);
    if (!report.failure.empty()) {
      out += "FAILED\n";
      continue;
    }
    const auto& v = report.verdict;
    out += pad(to_string(v.dominant), 10) + pad(format_ms(v.network_ms), 10) +
           pad(format_ms(v.prefill_ms), 10) + pad(format_ms(v.queueing_ms), 10) +
           format_ms(v.base_ms) + "\n";
  }
  return out;
}

nlohmann::json to_json(const std::vector<DeploymentReport>& reports) {
  auto list = nlohmann::json::array();
  for (const auto& report : reports) {
    nlohmann::json entry = {{"model", report.model},
                            {"deployment", report.deployment},
                            {"requests_sent", report.requests_sent},
                            {"requests_failed", report.requests_failed}};
    if (!report.failure.empty()) {
      entry["failure"] = report.failure;
      list.push_back(std::move(entry));
      continue;
    }
    if (!report.last_error.empty()) entry["last_error"] = report.last_error;
    if (const auto& n = report.network) {
      entry["network"] = {{"dns", spread_json(n->dns)},
                          {"connect", spread_json(n->connect)},
                          {"tls", spread_json(n->tls)},
                          {"ttfb_fresh", spread_json(n->fresh_ttfb)},
                          {"ttfb_pooled", spread_json(n->pooled_ttfb)},
                          {"ttft_fresh", spread_json(n->fresh_ttft)},
                          {"ttft_pooled", spread_json(n->pooled_ttft)},
                          {"setup_ms", n->setup_ms},
                          {"share_fresh", n->share_fresh},
                          {"share_pooled", n->share_pooled}};
    }
    if (const auto& p = report.prefill) {
      auto sizes = nlohmann::json::array();
      for (const auto& size : p->sizes) {
        sizes.push_back({{"tokens", size.tokens}, {"ttft", spread_json(size.ttft)}});
      }
      entry["input_length"] = {{"sizes", std::move(sizes)},
                               {"fit_valid", p->fit.valid},
                               {"ms_per_1k_tokens", p->fit.ms_per_1k_tokens()},
                               {"intercept_ms", p->fit.intercept_ms},
                               {"r_squared", p->fit.r_squared},
                               {"prefill_ms_at_largest", p->prefill_ms_at_largest}};
    }
    if (const auto& q = report.queueing) {
      auto levels = nlohmann::json::array();
      for (const auto& level : q->levels) {
        levels.push_back({{"concurrency", level.concurrency}, {"ttft", spread_json(level.ttft)}});
      }
      entry["queueing"] = {{"levels", std::move(levels)}, {"queueing_ms", q->queueing_ms}};
      entry["queueing"]["knee"] = q->knee ? nlohmann::json(*q->knee) : nlohmann::json();
      entry["queueing"]["capacity"] = q->capacity ? nlohmann::json(*q->capacity) : nlohmann::json();
    }
    const auto& v = report.verdict;
    entry["verdict"] = {{"cause", to_string(v.dominant)}, {"network_ms", v.network_ms},
                        {"prefill_ms", v.prefill_ms},     {"queueing_ms", v.queueing_ms},
                        {"base_ms", v.base_ms},           {"text", v.text}};
    auto suggestions = nlohmann::json::array();
    for (const auto& suggestion : report.suggestions) {
      suggestions.push_back({{"line", suggestion.line},
                             {"reason", suggestion.reason},
                             {"under", suggestion.under_model ? "model" : "deployment"}});
    }
    entry["suggestions"] = std::move(suggestions);
    list.push_back(std::move(entry));
  }
  return {{"deployments", std::move(list)}};
}

std::string render_markdown(const std::vector<DeploymentReport>& reports,
                            const std::vector<PlotFiles>& plots) {
  std::string out = "# sluice doctor report\n\n";
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const auto& report = reports[i];
    out += "## " + report.model + " / " + report.deployment + "\n\n";
    if (!report.failure.empty()) {
      out += "**Failed:** " + report.failure + "\n\n";
      continue;
    }
    out += "**Verdict:** " + report.verdict.text + "\n\n";
    if (const auto& n = report.network) {
      out += "| network | median (ms) | P95 (ms) |\n|---|---:|---:|\n";
      const auto row = [&](const char* name, const Spread& spread) {
        if (spread.samples == 0) return;
        out += std::string("| ") + name + " | " + ms_cell(spread.median) + " | " +
               ms_cell(spread.p95) + " |\n";
      };
      for_each_network_row(*n, row);
      out += "\nA new connection adds " + format_ms(n->setup_ms) + "; the network is " +
             fixed(n->share_fresh * 100, "%.0f") + "% of TTFT on a fresh connection.\n\n";
    }
    if (const auto& p = report.prefill) {
      out += "| prompt tokens | TTFT median (ms) |\n|---:|---:|\n";
      for (const auto& size : p->sizes) {
        out += "| " + fixed(size.tokens, "%.0f") + " | " + ms_cell(size.ttft.median) + " |\n";
      }
      if (p->fit.valid) {
        out += "\nFit: " + fixed(p->fit.ms_per_1k_tokens(), "%.1f") + " ms per 1k tokens + " +
               fixed(p->fit.intercept_ms, "%.1f") + " ms, R² " + fixed(p->fit.r_squared, "%.2f") +
               ".\n\n";
      }
    }
    if (const auto& q = report.queueing) {
      out += "| concurrency | median (ms) | P95 (ms) | IQR (ms) |\n|---:|---:|---:|---:|\n";
      for (const auto& level : q->levels) {
        out += "| " + std::to_string(level.concurrency) + " | " + ms_cell(level.ttft.median) +
               " | " + ms_cell(level.ttft.p95) + " | " + ms_cell(level.ttft.iqr) + " |\n";
      }
      out += "\nKnee: " + (q->knee ? std::to_string(*q->knee) : std::string("none"));
      if (q->capacity) out += " (about " + fixed(*q->capacity, "%.1f") + " served at once)";
      out += ".\n\n";
    }
    if (i < plots.size()) {
      out += "![TTFT against prompt length](" + plots[i].prompt_length + ")\n";
      out += "![TTFT against concurrency](" + plots[i].concurrency + ")\n\n";
    }
    if (!report.suggestions.empty()) {
      out += "Suggestions:\n\n```yaml\n";
      for (const auto& suggestion : report.suggestions) {
        out += suggestion.line + "  # " +
               (suggestion.under_model ? "under model " + report.model + ": " : "") +
               suggestion.reason + "\n";
      }
      out += "```\n\n";
    }
  }
  return out;
}

}  // namespace sluice::doctor

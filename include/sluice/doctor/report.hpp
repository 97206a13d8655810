#pragma once

// A deployment's diagnosis, from the active mode's measurements or a
// gateway's records, and the ways it is written out: the terminal's tables,
// JSON, report.md and its two plots.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sluice/doctor/analysis.hpp"
#include "sluice/doctor/probe.hpp"

namespace sluice::doctor {

struct DeploymentReport {
  std::string model;
  std::string deployment;
  std::string failure;  // not measured at all, and why
  unsigned requests_sent = 0;
  unsigned requests_failed = 0;
  std::string last_error;
  std::optional<NetworkFindings> network;
  std::optional<PrefillFindings> prefill;
  std::optional<QueueFindings> queueing;
  std::vector<PromptSample> prompt_samples;  // for the plot's points
  Verdict verdict;
  std::vector<Suggestion> suggestions;
};

// The findings, verdict and suggestions from one deployment's samples;
// `warm_connections` is the deployment's current setting.
DeploymentReport diagnose(const Measurement& measurement, unsigned warm_connections);

// Fills in verdict and suggestions from the findings already set.
void conclude(DeploymentReport& report, unsigned warm_connections, double p99_ttft_ms);

std::string render_text(const std::vector<DeploymentReport>& reports);
nlohmann::json to_json(const std::vector<DeploymentReport>& reports);

// report.md: the text tables plus the plots, named by the files given.
struct PlotFiles {
  std::string prompt_length;  // TTFT against prompt length, with the fit
  std::string concurrency;    // TTFT against concurrency, P95 whiskers
};
std::string render_markdown(const std::vector<DeploymentReport>& reports,
                            const std::vector<PlotFiles>& plots);

// The two plots as standalone SVG documents.
std::string prompt_length_svg(const DeploymentReport& report);
std::string concurrency_svg(const DeploymentReport& report);

}  // namespace sluice::doctor

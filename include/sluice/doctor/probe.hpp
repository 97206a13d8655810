#pragma once

// The active mode's measurements: one deployment, the plan's requests, sent
// with the gateway's own upstream client (its pool, TLS contexts, the
// deployment's headers and key, its protocol adapter).

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/doctor/analysis.hpp"
#include "sluice/doctor/plan.hpp"

namespace sluice::doctor {

struct Measurement {
  std::string model;
  std::string deployment;
  // Set when the deployment could not be measured at all: the first
  // request's failure (DNS, refused, TLS verification, HTTP 401, ...).
  std::string failure;
  unsigned requests_sent = 0;
  unsigned requests_failed = 0;  // after the first, counted and left out
  std::string last_error;
  NetworkSamples network;
  std::vector<PromptSample> prompts;
  std::vector<LevelSamples> levels;
};

// Called after each request: the step's name, requests done of the plan's.
using Progress = std::function<void(std::string_view step, unsigned done, unsigned total)>;

// Runs the plan against one deployment, on an event loop of its own; blocks
// until done.
Measurement measure(const config::Model& model, const config::Deployment& deployment,
                    const Plan& plan, const Progress& progress);

}  // namespace sluice::doctor

#pragma once

// `sluice doctor`: where each deployment's first token goes (network,
// prompt length or queueing), measured and explained.

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "sluice/doctor/plan.hpp"

namespace sluice::doctor {

struct Options {
  std::string config_path;
  std::string from_url;  // passive mode: a running gateway's admin URL
  std::string admin_key;
  std::string model;
  std::string deployment;
  PlanLimits limits;
  bool yes = false;
  bool json = false;
  std::string out_dir;
  std::string plots = "auto";  // auto (PNG when gnuplot is installed), svg or png
};

// `args` are the words after "doctor"; nullopt with `error` set when they
// are not a valid command line.
std::optional<Options> parse_options(const std::vector<std::string>& args, std::string& error);

extern const char* const kDoctorUsage;

// Runs the diagnosis; the process's exit code: 0 when every deployment was
// measured, 1 when any failed, 2 for a usage error.
int run(const Options& options);

// The whole subcommand, from its arguments.
int main(const std::vector<std::string>& args);

}  // namespace sluice::doctor

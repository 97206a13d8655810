#include "sluice/doctor/doctor.hpp"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "sluice/config/config.hpp"
#include "sluice/doctor/passive.hpp"
#include "sluice/doctor/report.hpp"
#include "sluice/protocol/adapters.hpp"

namespace sluice::doctor {

const char* const kDoctorUsage =
    R"(usage: sluice doctor --config FILE [options]     measure each deployment (sends requests)
       sluice doctor --from http://ADMIN/ [options] read a running gateway's records (sends none)

Where each deployment's first token goes: the network (fresh against
kept-alive connections), the prompt's length (prefill), or queueing at the
provider. Every request asks for one output token, streamed.

  --admin-key KEY         the admin listener's bearer key (--from)
  --model NAME            only this model's deployments
  --deployment ID         only this deployment
  --max-requests N        requests per deployment at most (default 60)
  --max-prompt-tokens N   the largest synthetic prompt (default 16384)
  --max-concurrency N     the highest concurrency tried (default 16)
  --yes                   do not ask before sending
  --json                  print JSON instead of tables
  --out DIR               write DIR/report.md and its two plots
  --plots auto|png|svg    plot format for --out: PNG through gnuplot when it
                          is installed (auto), or SVG written directly

Exit code: 0 when every deployment was diagnosed, 1 when any failed, 2 for
a usage error.
)";

namespace {

bool parse_count(const std::string& text, unsigned& out) {
  unsigned value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size()) return false;
  out = value;
  return true;
}

// Progress on stderr: a bar redrawn in place on a terminal, a line per step
// elsewhere (a CI log has no use for a hundred carriage returns).
class ProgressBar {
 public:
  explicit ProgressBar(bool quiet) : quiet_(quiet), terminal_(isatty(STDERR_FILENO) == 1) {}

  void begin(const std::string& name) {
    name_ = name;
    step_.clear();
  }
  void update(std::string_view step, unsigned done, unsigned total) {
    if (quiet_) return;
    if (terminal_) {
      constexpr unsigned kWidth = 30;
      const unsigned filled = total ? done * kWidth / total : kWidth;
      std::fprintf(stderr, "\r%-24s [%s%s] %3u/%u %-14.*s", name_.c_str(),
                   std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                   done, total, static_cast<int>(step.size()), step.data());
      std::fflush(stderr);
    } else if (step != step_) {
      std::fprintf(stderr, "%s: %.*s (%u/%u)\n", name_.c_str(), static_cast<int>(step.size()),
                   step.data(), done, total);
    }
    step_ = std::string(step);
  }
  void end() {
    if (!quiet_ && terminal_) std::fputs("\n", stderr);
  }

 private:
  bool quiet_;
  bool terminal_;
  std::string name_;
  std::string step_;
};

struct Selected {
  const config::Model* model;
  const config::Deployment* deployment;
};

bool gnuplot_installed() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

// Draws both plots with gnuplot; false when it failed (the caller falls
// back to SVG).
bool gnuplot_pngs(const DeploymentReport& report, const std::filesystem::path& prompt_png,
                  const std::filesystem::path& concurrency_png) {
  std::string script = "set terminal pngcairo size 800,500\nset grid\nset key top left\n";
  script += "$prompts << EOD\n";
  for (const auto& sample : report.prompt_samples) {
    script += std::to_string(sample.tokens) + " " + std::to_string(sample.ttft_ms) + "\n";
  }
  script += "EOD\n$levels << EOD\n";
  if (report.queueing) {
    for (const auto& level : report.queueing->levels) {
      script += std::to_string(level.concurrency) + " " + std::to_string(level.ttft.median) + " " +
                std::to_string(level.ttft.median) + " " + std::to_string(level.ttft.p95) + "\n";
    }
  }
  script += "EOD\n";
  const bool fitted = report.prefill && report.prefill->fit.valid;
  script += "set output '" + prompt_png.string() + "'\n";
  script += "set title 'TTFT against prompt length: " + report.deployment +
            "'\nset xlabel 'prompt tokens'\nset ylabel 'TTFT (ms)'\nset yrange [0:*]\n";
  script += "plot $prompts using 1:2 with points pt 7 title 'measured TTFT'";
  if (fitted) {
    script += ", " + std::to_string(report.prefill->fit.intercept_ms) + " + " +
              std::to_string(report.prefill->fit.ms_per_token) +
              " * x with lines lw 2 title 'least-squares fit'";
  }
  script += "\nset output '" + concurrency_png.string() + "'\n";
  script += "set title 'TTFT against concurrency: " + report.deployment +
            "'\nset xlabel 'concurrent requests'\nset ylabel 'TTFT (ms)'\nset yrange [0:*]\n"
            "set offsets 0.5, 1, 0, 0\n";
  script +=
      "plot $levels using 1:2:3:4 with yerrorbars title 'median, whisker to P95', "
      "$levels using 1:2 with lines notitle\n";
  FILE* pipe = popen("gnuplot 2>/dev/null", "w");
  if (!pipe) return false;
  std::fwrite(script.data(), 1, script.size(), pipe);
  const int status = pclose(pipe);
  return status == 0 && std::filesystem::exists(prompt_png) &&
         std::filesystem::exists(concurrency_png);
}

// report.md and two plots per deployment measured.
bool write_report(const std::vector<DeploymentReport>& reports, const Options& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options.out_dir, ec);
  if (ec) {
    std::fprintf(stderr, "sluice doctor: cannot create %s: %s\n", options.out_dir.c_str(),
                 ec.message().c_str());
    return false;
  }
  const bool png = options.plots == "png" || (options.plots == "auto" && gnuplot_installed());
  std::vector<PlotFiles> plots;
  for (const auto& report : reports) {
    const std::string stem = report.deployment;
    PlotFiles files{stem + "-prompt-length", stem + "-concurrency"};
    bool drawn = false;
    if (png && report.failure.empty()) {
      drawn = gnuplot_pngs(report, fs::path(options.out_dir) / (files.prompt_length + ".png"),
                           fs::path(options.out_dir) / (files.concurrency + ".png"));
    }
    if (drawn) {
      files.prompt_length += ".png";
      files.concurrency += ".png";
    } else {
      files.prompt_length += ".svg";
      files.concurrency += ".svg";
      std::ofstream(fs::path(options.out_dir) / files.prompt_length) << prompt_length_svg(report);
      std::ofstream(fs::path(options.out_dir) / files.concurrency) << concurrency_svg(report);
    }
    plots.push_back(std::move(files));
  }
  std::ofstream markdown(fs::path(options.out_dir) / "report.md");
  markdown << render_markdown(reports, plots);
  return static_cast<bool>(markdown);
}

int finish(const std::vector<DeploymentReport>& reports, const Options& options) {
  if (options.json) {
    std::cout << to_json(reports).dump(2) << "\n";
  } else {
    std::cout << render_text(reports);
  }
  std::cout.flush();
  if (!options.out_dir.empty() && !write_report(reports, options)) return 1;
  for (const auto& report : reports) {
    if (!report.failure.empty()) return 1;
  }
  return 0;
}

int run_active(const Options& options) {
  config::ConfigPtr config;
  try {
    config = config::load_file(options.config_path);
    protocol::check_providers(*config);
  } catch (const config::ConfigError& error) {
    std::fprintf(stderr, "sluice doctor: invalid config: %s\n", error.what());
    return 2;
  }
  std::vector<Selected> selected;
  for (const auto& model : config->models) {
    if (!options.model.empty() && model.name != options.model) continue;
    for (const auto& deployment : model.deployments) {
      if (!options.deployment.empty() && deployment.id != options.deployment) continue;
      selected.push_back({&model, &deployment});
    }
  }
  if (selected.empty()) {
    std::fprintf(stderr, "sluice doctor: no deployment matches%s%s%s%s\n",
                 options.model.empty() ? "" : " --model ", options.model.c_str(),
                 options.deployment.empty() ? "" : " --deployment ", options.deployment.c_str());
    return 2;
  }
  std::string why;
  auto plan = make_plan(options.limits, why);
  if (!plan) {
    std::fprintf(stderr, "sluice doctor: %s\n", why.c_str());
    return 2;
  }
  const auto count = static_cast<unsigned>(selected.size());
  std::fprintf(stderr,
               "plan: %u deployment%s x %u requests (%u network, %zu prompt sizes up to %u "
               "tokens x %u, concurrency up to %u) = %u requests, about %llu input tokens and "
               "%u output tokens\n",
               count, count == 1 ? "" : "s", plan->requests(), 2 * plan->network_each,
               plan->prompt_sizes.size(), plan->prompt_sizes.back(), plan->per_size,
               plan->levels.back(), count * plan->requests(),
               static_cast<unsigned long long>(count * plan->input_tokens()),
               count * plan->requests());
  if (!options.yes && isatty(STDIN_FILENO) == 1) {
    std::fprintf(stderr, "send them? [y/N] ");
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "y" && answer != "Y" && answer != "yes") {
      std::fprintf(stderr, "nothing sent\n");
      return 1;
    }
  }
  ProgressBar progress(false);
  std::vector<DeploymentReport> reports;
  for (const auto& [model, deployment] : selected) {
    progress.begin(model->name + "/" + deployment->id);
    auto measurement = measure(*model, *deployment, *plan,
                               [&](std::string_view step, unsigned done, unsigned total) {
                                 progress.update(step, done, total);
                               });
    progress.end();
    reports.push_back(diagnose(measurement, deployment->warm_connections));
  }
  return finish(reports, options);
}

int run_passive(const Options& options) {
  std::string error;
  auto reports = read_gateway(options.from_url, options.admin_key, error);
  if (!reports) {
    std::fprintf(stderr, "sluice doctor: %s\n", error.c_str());
    return 1;
  }
  std::erase_if(*reports, [&](const DeploymentReport& report) {
    return (!options.model.empty() && report.model != options.model) ||
           (!options.deployment.empty() && report.deployment != options.deployment);
  });
  if (reports->empty()) {
    std::fprintf(stderr,
                 "sluice doctor: no deployment has first-byte times from the last 10 "
                 "minutes to diagnose\n");
    return 1;
  }
  return finish(*reports, options);
}

}  // namespace

std::optional<Options> parse_options(const std::vector<std::string>& args, std::string& error) {
  Options options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const auto value = [&]() -> const std::string* {
      if (i + 1 >= args.size()) {
        error = arg + " needs a value";
        return nullptr;
      }
      return &args[++i];
    };
    const auto count = [&](unsigned& out) {
      const auto* text = value();
      if (!text) return false;
      if (!parse_count(*text, out)) {
        error = arg + " expects a whole number, not '" + *text + "'";
        return false;
      }
      return true;
    };
    const auto text = [&](std::string& out) {
      const auto* given = value();
      if (!given) return false;
      out = *given;
      return true;
    };
    bool ok = true;
    if (arg == "--config" || arg == "-c") {
      ok = text(options.config_path);
    } else if (arg == "--from") {
      ok = text(options.from_url);
    } else if (arg == "--admin-key") {
      ok = text(options.admin_key);
    } else if (arg == "--model") {
      ok = text(options.model);
    } else if (arg == "--deployment") {
      ok = text(options.deployment);
    } else if (arg == "--max-requests") {
      ok = count(options.limits.max_requests);
      if (ok && options.limits.max_requests == 0) {
        error = "--max-requests 0 would send nothing; give at least 1 (default 60 per deployment)";
        return std::nullopt;
      }
    } else if (arg == "--max-prompt-tokens") {
      ok = count(options.limits.max_prompt_tokens);
    } else if (arg == "--max-concurrency") {
      ok = count(options.limits.max_concurrency);
    } else if (arg == "--yes" || arg == "-y") {
      options.yes = true;
    } else if (arg == "--json") {
      options.json = true;
    } else if (arg == "--out") {
      ok = text(options.out_dir);
    } else if (arg == "--plots") {
      ok = text(options.plots);
      if (ok && options.plots != "auto" && options.plots != "png" && options.plots != "svg") {
        error = "--plots expects auto, png or svg";
        return std::nullopt;
      }
    } else {
      error = "unknown argument " + arg;
      return std::nullopt;
    }
    if (!ok) return std::nullopt;
  }
  if (options.config_path.empty() == options.from_url.empty()) {
    error = "give either --config FILE (measure) or --from http://ADMIN/ (read a gateway)";
    return std::nullopt;
  }
  return options;
}

int run(const Options& options) {
  return options.from_url.empty() ? run_active(options) : run_passive(options);
}

int main(const std::vector<std::string>& args) {
  for (const auto& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::fputs(kDoctorUsage, stdout);
      return 0;
    }
  }
  std::string error;
  auto options = parse_options(args, error);
  if (!options) {
    std::fprintf(stderr, "sluice doctor: %s\n%s", error.c_str(), kDoctorUsage);
    return 2;
  }
  return run(*options);
}

}  // namespace sluice::doctor

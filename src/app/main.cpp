// sluice: an OpenAI-compatible gateway that routes to the fastest healthy
// upstream and relays streamed tokens as they arrive.
#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/logging.hpp"
#include "sluice/common/version.hpp"
#include "sluice/config/config.hpp"
#include "sluice/doctor/doctor.hpp"
#include "sluice/protocol/adapters.hpp"
#include "sluice/server/gateway.hpp"

#if SLUICE_WITH_MIMALLOC
#include <mimalloc.h>
#endif

namespace {

constexpr const char* kUsage =
    R"(usage: sluice [--config FILE] [--check-config FILE] [--version] [--help]
       sluice doctor --config FILE | --from http://ADMIN/ [options]   (sluice doctor --help)

  --config FILE        run the gateway with this YAML config (default: $SLUICE_CONFIG)
  --check-config FILE  validate the config, print the first error, exit non-zero if invalid
  --version            print the version
  --help               print this help

Signals: SIGTERM/SIGINT stop the gateway, SIGHUP reloads the config file.
)";

// Names the allocator that serves malloc. With mimalloc linked, the answer
// comes from asking it whether a fresh calloc block is its own, since a link
// order that lost the override would otherwise go unnoticed.
std::string allocator_in_use() {
#if SLUICE_WITH_MIMALLOC
  void* probe = std::calloc(1, 64);
  const bool overridden = mi_is_in_heap_region(probe);
  std::free(probe);
  if (!overridden) return "glibc malloc (mimalloc linked but not serving malloc)";
  const int version = mi_version();
  return "mimalloc " + std::to_string(version / 100) + "." + std::to_string(version / 10 % 10) +
         "." + std::to_string(version % 10);
#else
  return "glibc malloc";
#endif
}

// mimalloc gives back the pages a thread freed 25 ms after they fell empty,
// but only when that thread next allocates or frees in the same segment: a
// gateway gone quiet after 8,000 held streams kept 117 MiB resident for as
// long as it stayed quiet (8 MiB before the burst). A decommit delay of 0
// gave them back at once, but under a steady load it also gave back, and
// faulted in again, every 64 KiB page of coroutine frames that fell empty
// for a moment: a madvise, its TLB shootdown and 16 page faults each time,
// a third of the CPU time per request at concurrency 64 on one thread
// (bench/RESULTS.md). So the delay stays, and each worker has what it freed
// given back once it has gone quiet. mimalloc 2.0.9 has no call for that:
// mi_collect(true) reaches only the segments in which it frees a page, and
// after 3,000 held streams (10 MiB before, 51 at the peak) 31 MiB stayed.
// Ending the worker's heap leaves 16, as the delay of 0 did: its segments
// are abandoned, which decommits their expired spans, and the thread takes
// a fresh heap at its next allocation and its old segments back as it
// needs them, as mimalloc does for what an exiting thread leaves behind.
//
// Given back too soon, though, a burst's memory is faulted in again by the
// next burst: 3.5 page faults per stream of 2,000 opened at once, each about
// 10 µs on a virtual machine, a third of the gateway's CPU for the burst and
// most of what set its first tokens behind HAProxy's, which keeps what it
// allocated. So what a worker frees is kept for server.memory_release_after
// (a minute by default), as the decommit delay, and given back once the
// worker has been quiet that long.
[[maybe_unused]] void give_back_freed_memory() {
#if SLUICE_WITH_MIMALLOC
  mi_thread_done();
#endif
}

// Freed spans stay committed for `period` after they fall empty, unless the
// environment says otherwise (MIMALLOC_DECOMMIT_DELAY, in milliseconds).
void keep_freed_memory_for([[maybe_unused]] std::chrono::milliseconds period) {
#if SLUICE_WITH_MIMALLOC
  if (std::getenv("MIMALLOC_DECOMMIT_DELAY") == nullptr) {
    mi_option_set(mi_option_decommit_delay, static_cast<long>(period.count()));
  }
#endif
}

int check_config(const std::string& path) {
  try {
    auto config = sluice::config::load_file(path);
    sluice::config::require_auth_or_explicit_opt_out(*config);
    sluice::protocol::check_providers(*config);
    std::printf("%s: ok (%zu models)\n", path.c_str(), config->models.size());
    return 0;
  } catch (const sluice::config::ConfigError& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
}

int run(const std::string& path) {
  sluice::config::ConfigPtr config;
  try {
    config = sluice::config::load_file(path);
    sluice::config::require_auth_or_explicit_opt_out(*config);
  } catch (const sluice::config::ConfigError& error) {
    std::fprintf(stderr, "sluice: invalid config: %s\n", error.what());
    return 1;
  }
  sluice::init_logging(config->log.level);

  // Building the first snapshot reads files again (the listener's
  // certificate and key), which may have changed since the config was
  // checked: a clean refusal, not an uncaught exception.
  std::unique_ptr<sluice::server::Gateway> built;
  try {
    built = std::make_unique<sluice::server::Gateway>(config);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "sluice: cannot start: %s\n", error.what());
    return 1;
  }
  sluice::server::Gateway& gateway = *built;
  // SIGHUP and POST /admin/reload both re-read the file: a valid config
  // replaces the old one for new requests, an invalid one is refused.
  auto reload = [&gateway, path]() -> sluice::server::ReloadOutcome {
    try {
      auto reloaded = sluice::config::load_file(path);
      sluice::config::require_auth_or_explicit_opt_out(*reloaded);
      sluice::set_log_level(reloaded->log.level);
      auto restart_required = gateway.apply(reloaded);
      spdlog::info("config reloaded from {}", path);
      if (!restart_required.empty()) {
        std::string settings;
        for (const auto& setting : restart_required) {
          settings += settings.empty() ? "" : ", ";
          settings += setting;
        }
        spdlog::warn(
            "config reload: these changed settings take effect only at restart and "
            "keep their running values: {}",
            settings);
      }
      return {{}, std::move(restart_required)};
    } catch (const sluice::config::ConfigError& error) {
      spdlog::error("config reload rejected, still serving the previous one: {}", error.what());
      return {error.what(), {}};
    }
  };
  gateway.set_reload_handler(reload);
#if SLUICE_WITH_MIMALLOC
  keep_freed_memory_for(config->server.memory_release_after);
  gateway.set_quiet_hook(give_back_freed_memory);
#endif
  try {
    gateway.start();
  } catch (const std::exception& error) {
    spdlog::critical("cannot start: {}", error.what());
    spdlog::shutdown();
    return 1;
  }
  std::printf("sluice listening on %s\n", gateway.listen_url().c_str());
  std::fflush(stdout);
  spdlog::info("sluice {} listening on {} with {} threads, {} models; admin on port {}; {}",
               sluice::kVersion, gateway.listen_url(), gateway.workers().size(),
               config->models.size(), gateway.admin_port(), allocator_in_use());
  // It changes what the process costs when idle-ish, so it is said once.
  if (config->server.busy_poll.count() > 0) {
    spdlog::info("busy polling: idle workers poll for {} µs before they sleep",
                 config->server.busy_poll.count());
  }

  boost::asio::io_context signals_context;
  boost::asio::signal_set signals(signals_context, SIGINT, SIGTERM, SIGHUP);
  std::function<void(const sluice::error_code&, int)> on_signal = [&](const sluice::error_code& ec,
                                                                      int signal) {
    if (ec) return;
    if (signal == SIGHUP) {
      gateway.reload();
      signals.async_wait(on_signal);
      return;
    }
    auto drain_timeout = gateway.snapshot()->config->server.drain_timeout;
    spdlog::info("signal {} received: draining (up to {} ms), then stopping", signal,
                 drain_timeout.count());
    gateway.drain_and_stop(drain_timeout);
  };
  signals.async_wait(on_signal);
  signals_context.run();
  spdlog::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "doctor") {
    sluice::init_logging("warn");
    return sluice::doctor::main(std::vector<std::string>(argv + 2, argv + argc));
  }
  std::string config_path;
  if (const char* from_env = std::getenv("SLUICE_CONFIG")) config_path = from_env;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "sluice: %s needs a value\n%s", arg.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--version") {
      std::printf("sluice %s\nbuild: %s\nlink-time optimisation: %s\nallocator: %s\n",
                  sluice::kVersion, SLUICE_BUILD_KIND, SLUICE_LINK_TIME_OPTIMISED,
                  allocator_in_use().c_str());
      return 0;
    } else if (arg == "--check-config") {
      return check_config(value());
    } else if (arg == "--config" || arg == "-c") {
      config_path = value();
    } else {
      std::fprintf(stderr, "sluice: unknown argument %s\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "sluice: no config given (use --config FILE or SLUICE_CONFIG)\n%s",
                 kUsage);
    return 2;
  }
  return run(config_path);
}

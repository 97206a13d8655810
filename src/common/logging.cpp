#include "sluice/common/logging.hpp"

#include <spdlog/async.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace sluice {

void init_logging(const std::string& level) {
  // Diagnostic lines are few (the access log has its own queue); each queued
  // slot is preallocated at about 400 bytes, so 8192 slots cost 3 MiB of RSS.
  if (!spdlog::thread_pool()) spdlog::init_thread_pool(1024, 1);
  auto logger = spdlog::create_async_nb<spdlog::sinks::stderr_sink_mt>("sluice");
  spdlog::set_default_logger(logger);
  set_log_level(level);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
}

void set_log_level(const std::string& level) { spdlog::set_level(spdlog::level::from_str(level)); }

}  // namespace sluice

#pragma once

#include <string>

namespace sluice {

// Installs the default logger: asynchronous, to stderr. When the queue is
// full the oldest message is dropped rather than blocking an event loop.
void init_logging(const std::string& level);

// Changes the level of the installed logger (log.level, on a reload).
void set_log_level(const std::string& level);

}  // namespace sluice

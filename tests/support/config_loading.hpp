#pragma once

// Loading config documents in tests: a fake environment, the error a
// document is refused with, and the check that an error names its YAML path
// and line.

#include <filesystem>
#include <map>
#include <string>

#include "sluice/config/config.hpp"

namespace sluice::config {

EnvLookup fake_env(std::map<std::string, std::string> variables);
extern const EnvLookup kNoEnv;

// A valid models section to append after whatever a test is about.
extern const std::string kOneModel;

// The message `yaml` is refused with; a test failure if it loads.
std::string load_error(const std::string& yaml, const EnvLookup& env = kNoEnv);

// Asserts the message has the "<path>: <what> (line N)" shape and mentions
// `fragment`.
void expect_error(const std::string& yaml, const std::string& path, int line,
                  const std::string& fragment, const EnvLookup& env = kNoEnv);

std::filesystem::path repository_root();

}  // namespace sluice::config

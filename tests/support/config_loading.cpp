#include "support/config_loading.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice::config {

EnvLookup fake_env(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

const EnvLookup kNoEnv = fake_env({});

const std::string kOneModel =
    "models:\n"
    "  - name: m\n"
    "    deployments:\n"
    "      - base_url: http://127.0.0.1:8000\n";

std::string load_error(const std::string& yaml, const EnvLookup& env) {
  try {
    load_string(yaml, env);
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << yaml;
  return {};
}

void expect_error(const std::string& yaml, const std::string& path, int line,
                  const std::string& fragment, const EnvLookup& env) {
  std::string message = load_error(yaml, env);
  EXPECT_THAT(message, ::testing::StartsWith(path + ": ")) << yaml;
  EXPECT_THAT(message, ::testing::EndsWith("(line " + std::to_string(line) + ")")) << message;
  EXPECT_THAT(message, ::testing::HasSubstr(fragment)) << message;
}

// Given by the build: __FILE__ is relative to the checkout when ccache
// compiles with a base directory.
std::filesystem::path repository_root() { return SLUICE_SOURCE_DIR; }

}  // namespace sluice::config

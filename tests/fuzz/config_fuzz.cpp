// libFuzzer entry point for the config loader: config::load_string on
// arbitrary text. A config is written by hand, so whatever it holds must end
// in either a Config or a ConfigError that names a line ("<path>: <problem>
// (line N)"); any other exception, a crash or a sanitizer report is a finding.
// Environment lookups are answered from a fixed table so that "${VAR}"
// substitution is exercised deterministically.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <typeinfo>

#include "sluice/config/config.hpp"

namespace {

using sluice::config::ConfigError;

[[noreturn]] void fail(const char* what, const char* detail) {
  std::fprintf(stderr, "config invariant broken: %s: %s\n", what, detail);
  std::abort();
}

std::optional<std::string> fixed_env(const std::string& name) {
  if (name == "API_KEY") return "sk-test-123";
  if (name == "PORT") return "8081";
  if (name == "TIMEOUT") return "2s";
  if (name == "EMPTY") return "";
  if (name == "BRACES") return "${API_KEY}";
  return std::nullopt;
}

bool names_a_line(const std::string& message) {
  const auto at = message.rfind(" (line ");
  return at != std::string::npos && message.find(": ") < at && message.back() == ')';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto config = sluice::config::load_string(text, fixed_env);
    if (!config) fail("load_string", "returned no config and threw nothing");
    sluice::config::require_auth_or_explicit_opt_out(*config);
  } catch (const ConfigError& error) {
    if (!names_a_line(error.what())) fail("a ConfigError without path and line", error.what());
  } catch (const std::exception& error) {
    fail(typeid(error).name(), error.what());
  } catch (...) {
    fail("a foreign exception", "not derived from std::exception");
  }
  return 0;
}

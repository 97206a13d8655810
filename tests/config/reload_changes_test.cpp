// Which settings of a reloaded config take effect only at restart.

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice::config {
namespace {

using Paths = std::vector<std::string>;

const std::string kRunning = R"(server:
  listen: 127.0.0.1:8080
  threads: 2
  admin_listen: 127.0.0.1:9090
upstream:
  max_idle_per_origin: 16
  idle_expiry: 60s
  dns_ttl: 30s
log:
  format: json
  access_log: stderr
)";

// kRunning with the line that starts with `prefix` replaced by `line`.
std::string running_with(const std::string& prefix, const std::string& line) {
  std::string yaml = kRunning;
  const auto at = yaml.find(prefix);
  EXPECT_NE(at, std::string::npos) << prefix;
  yaml.replace(at, yaml.find('\n', at) - at, line);
  return yaml;
}

TEST(StartOnlyChanges, NoneWhenTheFileIsTheSame) {
  auto running = load_string(kRunning + kOneModel);
  EXPECT_EQ(start_only_changes(*running, *load_string(kRunning + kOneModel)), Paths{});
}

TEST(StartOnlyChanges, NamesEachSettingTakenAtStart) {
  auto running = load_string(kRunning + kOneModel);
  const struct {
    std::string prefix, line, path;
  } cases[] = {
      {"  listen:", "  listen: 127.0.0.1:8081", "server.listen"},
      {"  listen:", "  listen: 0.0.0.0:8080", "server.listen"},
      {"  threads:", "  threads: 4", "server.threads"},
      {"  threads:", "  threads: 2\n  busy_poll_us: 50", "server.busy_poll_us"},
      {"  threads:", "  threads: 2\n  memory_release_after: 5s", "server.memory_release_after"},
      {"  admin_listen:", "  admin_listen: 127.0.0.1:9191", "server.admin_listen"},
      {"  admin_listen:", "  admin_listen: off", "server.admin_listen"},
      {"  max_idle_per_origin:", "  max_idle_per_origin: 8", "upstream.max_idle_per_origin"},
      {"  idle_expiry:", "  idle_expiry: 30s", "upstream.idle_expiry"},
      {"  dns_ttl:", "  dns_ttl: 5s", "upstream.dns_ttl"},
      {"  format:", "  format: text", "log.format"},
      {"  access_log:", "  access_log: off", "log.access_log"},
  };
  for (const auto& change : cases) {
    auto loaded = load_string(running_with(change.prefix, change.line) + kOneModel);
    EXPECT_EQ(start_only_changes(*running, *loaded), Paths{change.path}) << change.line;
  }
}

TEST(StartOnlyChanges, ListsSeveralInTheOrderOfTheSections) {
  auto running = load_string(kRunning + kOneModel);
  std::string yaml = running_with("  access_log:", "  access_log: off");
  yaml.replace(yaml.find("  threads: 2"), 12, "  threads: 8");
  yaml.replace(yaml.find("  dns_ttl: 30s"), 14, "  dns_ttl: 1s");
  EXPECT_EQ(start_only_changes(*running, *load_string(yaml + kOneModel)),
            (Paths{"server.threads", "upstream.dns_ttl", "log.access_log"}));
}

TEST(StartOnlyChanges, SettingsReadPerRequestAreNotListed) {
  auto running = load_string(kRunning + kOneModel);
  // Limits, timeouts, the admin key, the log level, the router and the
  // models all apply to the next request.
  std::string yaml = running_with(
      "  threads:",
      "  threads: 2\n  max_body_bytes: 1024\n  max_header_bytes: 4096\n  header_timeout: 1s\n"
      "  keepalive_timeout: 5s\n  write_timeout: 2s\n  max_connections: 10\n  drain_timeout: 1s\n"
      "  admin_key: an-admin-key-of-some-length");
  yaml.replace(yaml.find("  format: json"), 14, "  format: json\n  level: debug");
  yaml += "router:\n  window: 5\n  retries: 0\n";
  const std::string other_model =
      "models:\n  - name: other\n    deployments:\n      - id: d2\n"
      "        base_url: http://127.0.0.1:9/v1\n        model: m2\n";
  EXPECT_EQ(start_only_changes(*running, *load_string(yaml + other_model)), Paths{});
}

}  // namespace
}  // namespace sluice::config

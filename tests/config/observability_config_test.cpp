// The admin listener, shutdown drain, access log and latency budget keys.
// Error tests check the exact YAML path and line, since those are what make
// a start-up failure fixable.

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace sluice::config {
namespace {

using std::chrono::milliseconds;
using testing::EndsWith;
using testing::HasSubstr;
using testing::StartsWith;

// ---------------------------------------------------------------------------
// Successful loads

TEST(ObservabilityConfig, Defaults) {
  ConfigPtr config = load_string(kOneModel, kNoEnv);
  const Server& server = config->server;
  EXPECT_TRUE(server.admin_enabled);
  EXPECT_EQ(server.admin_host, "127.0.0.1");
  EXPECT_EQ(server.admin_port, 9090);
  EXPECT_EQ(server.admin_key, "");
  EXPECT_EQ(server.drain_timeout, milliseconds(30000));
  EXPECT_EQ(server.memory_release_after, milliseconds(60000));

  EXPECT_EQ(config->log.level, "info");
  EXPECT_EQ(config->log.format, "json");
  EXPECT_EQ(config->log.access_log, "stderr");

  EXPECT_FALSE(config->budgets.gateway.has_value());
  EXPECT_FALSE(config->budgets.upstream_ttfb.has_value());
  EXPECT_FALSE(config->budgets.total.has_value());
}

TEST(ObservabilityConfig, EveryKeyParsed) {
  ConfigPtr config = load_string(
      "server:\n"
      "  listen: 0.0.0.0:8080\n"
      "  admin_listen: \"[::1]:9191\"\n"
      "  admin_key: ${ADMIN_KEY}\n"
      "  drain_timeout: 1.5s\n"
      "  memory_release_after: 10s\n"
      "log:\n"
      "  level: warn\n"
      "  format: text\n"
      "  access_log: /var/log/sluice/access.log\n"
      "budgets:\n"
      "  gateway: 1ms\n"
      "  upstream_ttfb: 800ms\n"
      "  total: 30s\n" +
          kOneModel,
      fake_env({{"ADMIN_KEY", "admin-secret"}}));
  const Server& server = config->server;
  EXPECT_TRUE(server.admin_enabled);
  EXPECT_EQ(server.admin_host, "::1");
  EXPECT_EQ(server.admin_port, 9191);
  EXPECT_EQ(server.admin_key, "admin-secret");
  EXPECT_EQ(server.drain_timeout, milliseconds(1500));
  EXPECT_EQ(server.memory_release_after, milliseconds(10000));

  EXPECT_EQ(config->log.level, "warn");
  EXPECT_EQ(config->log.format, "text");
  EXPECT_EQ(config->log.access_log, "/var/log/sluice/access.log");

  EXPECT_EQ(config->budgets.gateway, milliseconds(1));
  EXPECT_EQ(config->budgets.upstream_ttfb, milliseconds(800));
  EXPECT_EQ(config->budgets.total, milliseconds(30000));
}

TEST(ObservabilityConfig, AdminListenOff) {
  ConfigPtr config = load_string("server:\n  admin_listen: \"off\"\n" + kOneModel, kNoEnv);
  EXPECT_FALSE(config->server.admin_enabled);
}

TEST(ObservabilityConfig, AdminListenPortZeroAndAccessLogOff) {
  ConfigPtr config = load_string(
      "server:\n  admin_listen: 127.0.0.1:0\nlog:\n  access_log: \"off\"\n" + kOneModel, kNoEnv);
  EXPECT_TRUE(config->server.admin_enabled);
  EXPECT_EQ(config->server.admin_port, 0);
  EXPECT_EQ(config->log.access_log, "off");
}

// Port 0 picks a free port per listener, so both may ask for it at once.
TEST(ObservabilityConfig, BothListenersOnPortZero) {
  ConfigPtr config = load_string(
      "server:\n  listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0\n" + kOneModel, kNoEnv);
  EXPECT_EQ(config->server.listen_port, 0);
  EXPECT_EQ(config->server.admin_port, 0);
}

TEST(ObservabilityConfig, OnlySomeBudgets) {
  ConfigPtr config = load_string("budgets:\n  upstream_ttfb: 2s\n" + kOneModel, kNoEnv);
  EXPECT_FALSE(config->budgets.gateway.has_value());
  EXPECT_EQ(config->budgets.upstream_ttfb, milliseconds(2000));
  EXPECT_FALSE(config->budgets.total.has_value());
}

// ---------------------------------------------------------------------------
// Errors

TEST(ObservabilityConfigErrors, BadAdminListen) {
  expect_error("server:\n  threads: 1\n  admin_listen: localhost\n" + kOneModel,
               "server.admin_listen", 3, "invalid listen address 'localhost'");
  expect_error("server:\n  admin_listen: 127.0.0.1:70000\n" + kOneModel, "server.admin_listen", 2,
               "expected off, host:port");
  // "Off" is not "off": only the exact spelling disables the listener.
  expect_error("server:\n  admin_listen: \"Off\"\n" + kOneModel, "server.admin_listen", 2,
               "invalid listen address 'Off'");
}

TEST(ObservabilityConfigErrors, AdminListenSameAsListen) {
  expect_error("server:\n  listen: 127.0.0.1:7000\n  admin_listen: 127.0.0.1:7000\n" + kOneModel,
               "server.admin_listen", 3, "must differ from server.listen");
  expect_error("server:\n  threads: 1\n  listen: 127.0.0.1:9090\n" + kOneModel, "server.listen", 3,
               "collides with the admin listener");
}

TEST(ObservabilityConfigErrors, AdminKeyFromMissingVariable) {
  expect_error("server:\n  admin_key: ${ADMIN_KEY}\n" + kOneModel, "server.admin_key", 2,
               "environment variable ADMIN_KEY is not set");
}

TEST(ObservabilityConfigErrors, AdminKeyWithLineBreak) {
  expect_error("server:\n  admin_key: ${ADMIN_KEY}\n" + kOneModel, "server.admin_key", 2,
               "must not contain line breaks", fake_env({{"ADMIN_KEY", "abc\ndef"}}));
}

TEST(ObservabilityConfigErrors, BadDrainTimeout) {
  expect_error("server:\n  drain_timeout: 0s\n" + kOneModel, "server.drain_timeout", 2,
               "must be greater than zero");
  expect_error("server:\n  drain_timeout: 30\n" + kOneModel, "server.drain_timeout", 2,
               "needs a unit");
}

TEST(ObservabilityConfigErrors, MemoryReleaseAfterOutOfRange) {
  expect_error("server:\n  memory_release_after: 500ms\n" + kOneModel,
               "server.memory_release_after", 2, "must be between 1s and 1h");
  expect_error("server:\n  memory_release_after: 2h\n" + kOneModel, "server.memory_release_after",
               2, "must be between 1s and 1h");
}

TEST(ObservabilityConfigErrors, BadLogFormat) {
  expect_error("log:\n  level: info\n  format: xml\n" + kOneModel, "log.format", 3,
               "invalid value 'xml' (allowed: json, text)");
}

TEST(ObservabilityConfigErrors, EmptyAccessLog) {
  expect_error("log:\n  access_log: \"\"\n" + kOneModel, "log.access_log", 2, "must not be empty");
}

TEST(ObservabilityConfigErrors, UnknownKeyInLog) {
  expect_error("log:\n  acces_log: off\n" + kOneModel, "log.acces_log", 2,
               "unknown key 'acces_log' (allowed: level, format, access_log)");
}

TEST(ObservabilityConfigErrors, BadBudgets) {
  expect_error("budgets:\n  gateway: 1ms\n  total: 0ms\n" + kOneModel, "budgets.total", 3,
               "must be greater than zero");
  expect_error("budgets:\n  upstream_ttfb: -1s\n" + kOneModel, "budgets.upstream_ttfb", 2,
               "must not be negative");
  expect_error("budgets:\n  gateway: fast\n" + kOneModel, "budgets.gateway", 2,
               "invalid duration 'fast'");
}

TEST(ObservabilityConfigErrors, UnknownKeyUnderBudgets) {
  expect_error("budgets:\n  gateway: 1ms\n  ttfb: 800ms\n" + kOneModel, "budgets.ttfb", 3,
               "unknown key 'ttfb' (allowed: gateway, upstream_ttfb, total)");
}

TEST(ObservabilityConfigErrors, BudgetsMustBeAMapping) {
  expect_error("budgets: 30s\n" + kOneModel, "budgets", 1, "expected a mapping, got a scalar");
}

TEST(ObservabilityConfigErrors, RootListsBudgets) {
  std::string message = load_error(kOneModel + "budget:\n  total: 1s\n");
  EXPECT_THAT(message, StartsWith("budget: unknown key 'budget'"));
  EXPECT_THAT(message, HasSubstr("allowed: server, upstream, router, log, models, auth, budgets"));
  EXPECT_THAT(message, EndsWith("(line 5)"));
}

}  // namespace
}  // namespace sluice::config

// Loading and validating whole config documents. Error tests check the exact
// YAML path and line, since those are what make a start-up failure fixable.

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <unistd.h>

namespace sluice::config {
namespace {

using std::chrono::milliseconds;
using testing::EndsWith;
using testing::HasSubstr;
using testing::StartsWith;

unsigned expected_default_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

// ---------------------------------------------------------------------------
// Successful loads

const std::string kFullConfig = R"(server:
  listen: "[::1]:9090"
  threads: 3
  busy_poll_us: 50
  max_body_bytes: 1048576
  max_header_bytes: 8192
  header_timeout: 5s
  body_timeout: 1.5s
  keepalive_timeout: 1m
  write_timeout: 20s
  max_connections: 500
upstream:
  max_idle_per_origin: 8
  idle_expiry: 45s
  dns_ttl: 250ms
router:
  window: 50
  latency_buffer: 0.25
  retries: 4
  backoff: {base: 50ms, max: 2s}
  cooldown: {fails: 5, within: 2m, for: 10s}
  hedge: {after: 800ms}
log:
  level: debug
models:
  - name: gpt-4o-mini
    strategy: weighted
    fallbacks: [gpt-4o]
    context_window_fallbacks: [gpt-4o-long]
    deployments:
      - id: openai-1
        base_url: https://api.openai.com/v1/
        api_key: ${OPENAI_API_KEY}
        model: gpt-4o-mini-2024-07-18
        headers: {OpenAI-Organization: org-1, X-Trace: "on"}
        timeouts: {connect: 1s, ttft: 5s, idle: 20s, total: 300s}
        tls_verify: false
        ca_file: ${CA_FILE}
        weight: 3
        max_parallel: 16
        rpm: 600
      - base_url: http://localhost:8000
  - name: gpt-4o
    strategy: priority
    deployments:
      - id: azure-east
        base_url: https://East.openai.azure.com/openai/deployments/gpt-4o
        api_key: os.environ/AZURE_KEY
  - name: gpt-4o-long
    strategy: least_busy
    deployments:
      - base_url: https://api.openai.com/v1
  - name: rr
    strategy: round_robin
    deployments:
      - base_url: https://api.openai.com/v1
  - name: lat
    strategy: latency
    deployments:
      - base_url: https://api.openai.com/v1
)";

// Loading only checks that a CA file exists; any file of the checkout will do.
std::string existing_ca_file() { return (repository_root() / "config" / "demo.yaml").string(); }

EnvLookup full_config_env() {
  return fake_env(
      {{"OPENAI_API_KEY", "sk-openai"}, {"AZURE_KEY", "az-key"}, {"CA_FILE", existing_ca_file()}});
}

TEST(LoadString, FullConfigServerSection) {
  ConfigPtr config = load_string(kFullConfig, full_config_env());
  const Server& server = config->server;
  EXPECT_EQ(server.listen_host, "::1");
  EXPECT_EQ(server.listen_port, 9090);
  EXPECT_EQ(server.threads, 3u);
  EXPECT_EQ(server.busy_poll, std::chrono::microseconds(50));
  EXPECT_EQ(server.max_body_bytes, 1048576u);
  EXPECT_EQ(server.max_header_bytes, 8192u);
  EXPECT_EQ(server.header_timeout, milliseconds(5000));
  EXPECT_EQ(server.body_timeout, milliseconds(1500));
  EXPECT_EQ(server.keepalive_timeout, milliseconds(60000));
  EXPECT_EQ(server.write_timeout, milliseconds(20000));
  EXPECT_EQ(server.max_connections, 500u);
}

TEST(LoadString, FullConfigUpstreamRouterAndLog) {
  ConfigPtr config = load_string(kFullConfig, full_config_env());
  EXPECT_EQ(config->upstream.max_idle_per_origin, 8u);
  EXPECT_EQ(config->upstream.idle_expiry, milliseconds(45000));
  EXPECT_EQ(config->upstream.dns_ttl, milliseconds(250));

  const Router& router = config->router;
  EXPECT_EQ(router.window, 50u);
  EXPECT_DOUBLE_EQ(router.latency_buffer, 0.25);
  EXPECT_EQ(router.retries, 4u);
  EXPECT_EQ(router.backoff.base, milliseconds(50));
  EXPECT_EQ(router.backoff.max, milliseconds(2000));
  EXPECT_EQ(router.cooldown.fails, 5u);
  EXPECT_EQ(router.cooldown.within, milliseconds(120000));
  EXPECT_EQ(router.cooldown.duration, milliseconds(10000));
  EXPECT_EQ(router.hedge.mode, Hedge::Mode::fixed);
  EXPECT_EQ(router.hedge.after, milliseconds(800));

  EXPECT_EQ(config->log.level, "debug");
}

TEST(LoadString, FullConfigModels) {
  ConfigPtr config = load_string(kFullConfig, full_config_env());
  ASSERT_EQ(config->models.size(), 5u);

  const Model& mini = config->models[0];
  EXPECT_EQ(mini.name, "gpt-4o-mini");
  EXPECT_EQ(mini.strategy, Strategy::weighted);
  EXPECT_EQ(mini.fallbacks, std::vector<std::string>{"gpt-4o"});
  EXPECT_EQ(mini.context_window_fallbacks, std::vector<std::string>{"gpt-4o-long"});
  ASSERT_EQ(mini.deployments.size(), 2u);

  EXPECT_EQ(config->models[1].strategy, Strategy::priority);
  EXPECT_EQ(config->models[2].strategy, Strategy::least_busy);
  EXPECT_EQ(config->models[3].strategy, Strategy::round_robin);
  EXPECT_EQ(config->models[4].strategy, Strategy::latency);
  EXPECT_TRUE(config->models[1].fallbacks.empty());
  EXPECT_TRUE(config->models[1].context_window_fallbacks.empty());
}

TEST(LoadString, FullConfigExplicitDeployment) {
  ConfigPtr config = load_string(kFullConfig, full_config_env());
  const Deployment& openai = config->models[0].deployments[0];
  EXPECT_EQ(openai.id, "openai-1");
  EXPECT_EQ(openai.base_url.scheme, "https");
  EXPECT_EQ(openai.base_url.host, "api.openai.com");
  EXPECT_EQ(openai.base_url.port, 443);
  EXPECT_EQ(openai.base_url.path_prefix, "/v1");
  EXPECT_EQ(openai.api_key, "sk-openai");
  EXPECT_EQ(openai.upstream_model, "gpt-4o-mini-2024-07-18");
  using Header = std::pair<std::string, std::string>;
  EXPECT_EQ(openai.headers,
            (std::vector<Header>{{"OpenAI-Organization", "org-1"}, {"X-Trace", "on"}}));
  EXPECT_EQ(openai.timeouts.connect, milliseconds(1000));
  EXPECT_EQ(openai.timeouts.ttft, milliseconds(5000));
  EXPECT_EQ(openai.timeouts.idle, milliseconds(20000));
  EXPECT_EQ(openai.timeouts.total, milliseconds(300000));
  EXPECT_FALSE(openai.tls_verify);
  EXPECT_EQ(openai.ca_file, existing_ca_file());
  EXPECT_EQ(openai.weight, 3u);
  EXPECT_EQ(openai.max_parallel, 16u);
  EXPECT_EQ(openai.rpm, 600u);

  const Deployment& azure = config->models[1].deployments[0];
  EXPECT_EQ(azure.id, "azure-east");
  EXPECT_EQ(azure.api_key, "az-key");
  EXPECT_EQ(azure.base_url.host, "east.openai.azure.com");
  EXPECT_EQ(azure.base_url.path_prefix, "/openai/deployments/gpt-4o");
}

TEST(LoadString, FullConfigDefaultedDeployment) {
  ConfigPtr config = load_string(kFullConfig, full_config_env());
  const Deployment& local = config->models[0].deployments[1];
  EXPECT_EQ(local.id, "gpt-4o-mini-1");
  EXPECT_EQ(local.upstream_model, "gpt-4o-mini");
  EXPECT_EQ(local.base_url.scheme, "http");
  EXPECT_EQ(local.base_url.host, "localhost");
  EXPECT_EQ(local.base_url.port, 8000);
  EXPECT_EQ(local.base_url.path_prefix, "");
  EXPECT_EQ(local.api_key, "");
  EXPECT_TRUE(local.headers.empty());
  EXPECT_EQ(local.timeouts.connect, milliseconds(2000));
  EXPECT_EQ(local.timeouts.ttft, milliseconds(10000));
  EXPECT_EQ(local.timeouts.idle, milliseconds(30000));
  EXPECT_EQ(local.timeouts.total, milliseconds(600000));
  EXPECT_TRUE(local.tls_verify);
  EXPECT_EQ(local.ca_file, "");
  EXPECT_EQ(local.weight, 1u);
  EXPECT_EQ(local.max_parallel, 0u);
  EXPECT_EQ(local.rpm, 0u);
  EXPECT_EQ(config->models[2].deployments[0].id, "gpt-4o-long-0");
}

TEST(LoadString, FullConfigModelIndex) {
  ConfigPtr config = load_string(kFullConfig, full_config_env());
  EXPECT_EQ(config->model_index.size(), 5u);
  ASSERT_NE(config->find_model("gpt-4o"), nullptr);
  EXPECT_EQ(config->find_model("gpt-4o")->name, "gpt-4o");
  EXPECT_EQ(config->find_model("gpt-4o-mini"), &config->models[0]);
  EXPECT_EQ(config->find_model("lat"), &config->models[4]);
  EXPECT_EQ(config->find_model("unknown"), nullptr);
}

TEST(LoadString, MinimalConfigUsesDefaults) {
  ConfigPtr config = load_string(kOneModel, kNoEnv);
  const Config defaults;
  EXPECT_EQ(config->server.listen_host, "0.0.0.0");
  EXPECT_EQ(config->server.listen_port, 8080);
  EXPECT_EQ(config->server.threads, expected_default_threads());
  EXPECT_GE(config->server.threads, 1u);
  EXPECT_EQ(config->server.busy_poll, std::chrono::microseconds(0));
  EXPECT_EQ(config->server.max_body_bytes, 8u * 1024 * 1024);
  EXPECT_EQ(config->server.max_header_bytes, 16u * 1024);
  EXPECT_EQ(config->server.header_timeout, milliseconds(10000));
  EXPECT_EQ(config->server.body_timeout, milliseconds(30000));
  EXPECT_EQ(config->server.keepalive_timeout, milliseconds(75000));
  EXPECT_EQ(config->server.write_timeout, milliseconds(30000));
  EXPECT_EQ(config->server.max_connections, 10000u);
  EXPECT_EQ(config->upstream.max_idle_per_origin, 1024u);
  EXPECT_EQ(config->upstream.idle_expiry, milliseconds(60000));
  EXPECT_EQ(config->upstream.dns_ttl, milliseconds(30000));
  EXPECT_EQ(config->router.window, 20u);
  EXPECT_DOUBLE_EQ(config->router.latency_buffer, 0.10);
  EXPECT_EQ(config->router.retries, 2u);
  EXPECT_EQ(config->router.backoff.base, milliseconds(100));
  EXPECT_EQ(config->router.backoff.max, milliseconds(4000));
  EXPECT_EQ(config->router.cooldown.fails, 3u);
  EXPECT_EQ(config->router.cooldown.within, milliseconds(60000));
  EXPECT_EQ(config->router.cooldown.duration, milliseconds(30000));
  EXPECT_EQ(config->router.hedge.mode, Hedge::Mode::off);
  EXPECT_EQ(config->log.level, "info");

  ASSERT_EQ(config->models.size(), 1u);
  const Model& model = config->models[0];
  EXPECT_EQ(model.strategy, Strategy::latency);
  EXPECT_TRUE(model.fallbacks.empty());
  const Deployment& deployment = model.deployments[0];
  EXPECT_EQ(deployment.id, "m-0");
  EXPECT_EQ(deployment.upstream_model, "m");
  EXPECT_EQ(deployment.base_url.port, 8000);
  EXPECT_EQ(deployment.weight, 1u);
}

TEST(LoadString, ThreadsZeroResolvesToHardwareConcurrency) {
  ConfigPtr config = load_string("server:\n  threads: 0\n" + kOneModel, kNoEnv);
  EXPECT_EQ(config->server.threads, expected_default_threads());
  EXPECT_GE(config->server.threads, 1u);
}

TEST(LoadString, ListenPortZeroIsAllowed) {
  ConfigPtr config = load_string("server:\n  listen: 127.0.0.1:0\n" + kOneModel, kNoEnv);
  EXPECT_EQ(config->server.listen_host, "127.0.0.1");
  EXPECT_EQ(config->server.listen_port, 0);
}

TEST(LoadString, HedgeModes) {
  auto hedge_of = [](const std::string& after) {
    return load_string("router:\n  hedge: {after: " + after + "}\n" + kOneModel, kNoEnv)
        ->router.hedge;
  };
  EXPECT_EQ(hedge_of("off").mode, Hedge::Mode::off);
  EXPECT_EQ(hedge_of("p95").mode, Hedge::Mode::p95);
  Hedge fixed = hedge_of("1.5s");
  EXPECT_EQ(fixed.mode, Hedge::Mode::fixed);
  EXPECT_EQ(fixed.after, milliseconds(1500));
}

TEST(LoadString, NullValuesKeepDefaults) {
  ConfigPtr config = load_string(
      "server:\nupstream: ~\nrouter:\n  window:\nlog: {level: ~}\n"
      "models:\n  - name: m\n    fallbacks:\n    deployments:\n"
      "      - base_url: http://h\n        id:\n        api_key:\n",
      kNoEnv);
  EXPECT_EQ(config->server.listen_port, 8080);
  EXPECT_EQ(config->router.window, 20u);
  EXPECT_EQ(config->log.level, "info");
  EXPECT_EQ(config->models[0].deployments[0].id, "m-0");
  EXPECT_EQ(config->models[0].deployments[0].api_key, "");
}

TEST(LoadString, QuotedNumbersAndMultipleFallbacks) {
  ConfigPtr config = load_string(R"(router:
  window: "7"
  latency_buffer: 0
models:
  - name: a
    fallbacks: [b, c]
    deployments: [{base_url: "http://h"}]
  - name: b
    fallbacks: [a]
    deployments: [{base_url: "http://h"}]
  - name: c
    deployments: [{base_url: "http://h"}]
)",
                                 kNoEnv);
  EXPECT_EQ(config->router.window, 7u);
  EXPECT_DOUBLE_EQ(config->router.latency_buffer, 0.0);
  EXPECT_EQ(config->models[0].fallbacks, (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(config->models[1].fallbacks, std::vector<std::string>{"a"});
}

// ---------------------------------------------------------------------------
// Environment substitution

const std::string kDeploymentWith =
    "models:\n"
    "  - name: m\n"
    "    deployments:\n"
    "      - base_url: http://h\n";

TEST(EnvSubstitution, WholeVariable) {
  ConfigPtr config =
      load_string(kDeploymentWith + "        api_key: ${KEY}\n", fake_env({{"KEY", "sk-123"}}));
  EXPECT_EQ(config->models[0].deployments[0].api_key, "sk-123");
}

TEST(EnvSubstitution, SeveralVariablesInOneString) {
  ConfigPtr config =
      load_string(kDeploymentWith + "        headers: {Authorization: \"Bearer ${A}-${B}!\"}\n",
                  fake_env({{"A", "first"}, {"B", "second"}}));
  EXPECT_EQ(config->models[0].deployments[0].headers[0].second, "Bearer first-second!");
}

TEST(EnvSubstitution, OsEnvironForm) {
  ConfigPtr config = load_string(kDeploymentWith + "        api_key: os.environ/AZURE_API_KEY\n",
                                 fake_env({{"AZURE_API_KEY", "az"}}));
  EXPECT_EQ(config->models[0].deployments[0].api_key, "az");
}

TEST(EnvSubstitution, OsEnvironOnlyAsAWholeValue) {
  ConfigPtr config = load_string(kDeploymentWith + "        api_key: x-os.environ/KEY\n", kNoEnv);
  EXPECT_EQ(config->models[0].deployments[0].api_key, "x-os.environ/KEY");
}

TEST(EnvSubstitution, DoubleDollarIsALiteral) {
  ConfigPtr config = load_string(kDeploymentWith + "        api_key: \"$${KEY} $$ $x ${KEY}\"\n",
                                 fake_env({{"KEY", "v"}}));
  EXPECT_EQ(config->models[0].deployments[0].api_key, "${KEY} $$ $x v");
}

TEST(EnvSubstitution, SubstitutedValuesAreNotExpandedAgain) {
  ConfigPtr config =
      load_string(kDeploymentWith + "        api_key: ${KEY}\n", fake_env({{"KEY", "a${OTHER}b"}}));
  EXPECT_EQ(config->models[0].deployments[0].api_key, "a${OTHER}b");
}

TEST(EnvSubstitution, EmptyValueIsAllowed) {
  ConfigPtr config =
      load_string(kDeploymentWith + "        api_key: ${KEY}\n", fake_env({{"KEY", ""}}));
  EXPECT_EQ(config->models[0].deployments[0].api_key, "");
}

TEST(EnvSubstitution, AppliesToEveryScalar) {
  ConfigPtr config = load_string(R"(server:
  listen: ${HOST}:${PORT}
  header_timeout: ${TIMEOUT}
log:
  level: ${LEVEL}
models:
  - name: ${MODEL}
    strategy: os.environ/STRATEGY
    deployments:
      - base_url: https://${UPSTREAM}/v1
        model: ${UPSTREAM_MODEL}
        weight: ${WEIGHT}
        tls_verify: ${VERIFY}
)",
                                 fake_env({{"HOST", "127.0.0.1"},
                                           {"PORT", "9000"},
                                           {"TIMEOUT", "3s"},
                                           {"LEVEL", "warn"},
                                           {"MODEL", "chat"},
                                           {"STRATEGY", "weighted"},
                                           {"UPSTREAM", "api.example.com"},
                                           {"UPSTREAM_MODEL", "real-chat"},
                                           {"WEIGHT", "4"},
                                           {"VERIFY", "false"}}));
  EXPECT_EQ(config->server.listen_host, "127.0.0.1");
  EXPECT_EQ(config->server.listen_port, 9000);
  EXPECT_EQ(config->server.header_timeout, milliseconds(3000));
  EXPECT_EQ(config->log.level, "warn");
  const Model& model = config->models[0];
  EXPECT_EQ(model.name, "chat");
  EXPECT_EQ(model.strategy, Strategy::weighted);
  EXPECT_EQ(model.deployments[0].id, "chat-0");
  EXPECT_EQ(model.deployments[0].base_url.host, "api.example.com");
  EXPECT_EQ(model.deployments[0].upstream_model, "real-chat");
  EXPECT_EQ(model.deployments[0].weight, 4u);
  EXPECT_FALSE(model.deployments[0].tls_verify);
}

TEST(EnvSubstitution, ProcessEnvReadsTheRealEnvironment) {
  ASSERT_EQ(setenv("SLUICE_CONFIG_TEST_VARIABLE", "from-process", 1), 0);
  EXPECT_EQ(process_env("SLUICE_CONFIG_TEST_VARIABLE"), "from-process");
  ConfigPtr config =
      load_string(kDeploymentWith + "        api_key: ${SLUICE_CONFIG_TEST_VARIABLE}\n");
  EXPECT_EQ(config->models[0].deployments[0].api_key, "from-process");
  unsetenv("SLUICE_CONFIG_TEST_VARIABLE");
  EXPECT_EQ(process_env("SLUICE_CONFIG_TEST_VARIABLE"), std::nullopt);
}

TEST(EnvSubstitution, MissingVariableNamesIt) {
  expect_error(kDeploymentWith + "        api_key: ${OPENAI_API_KEY}\n",
               "models[0].deployments[0].api_key", 5, "OPENAI_API_KEY is not set");
}

TEST(EnvSubstitution, MissingVariableInOsEnvironForm) {
  expect_error(kDeploymentWith + "        api_key: os.environ/AZURE_KEY\n",
               "models[0].deployments[0].api_key", 5, "AZURE_KEY is not set");
}

TEST(EnvSubstitution, SecondOfTwoVariablesMissing) {
  expect_error(kDeploymentWith + "        headers: {X-Key: \"${A}${B}\"}\n",
               "models[0].deployments[0].headers.X-Key", 5, "B is not set", fake_env({{"A", "a"}}));
}

TEST(EnvSubstitution, MissingVariableInANumber) {
  expect_error("router:\n  retries: ${RETRIES}\n" + kOneModel, "router.retries", 2,
               "RETRIES is not set");
}

TEST(EnvSubstitution, MalformedReferences) {
  expect_error(kDeploymentWith + "        api_key: \"${KEY\"\n", "models[0].deployments[0].api_key",
               5, "unterminated");
  expect_error(kDeploymentWith + "        api_key: \"${}\"\n", "models[0].deployments[0].api_key",
               5, "invalid environment variable name ''");
  expect_error(kDeploymentWith + "        api_key: \"${A-B}\"\n",
               "models[0].deployments[0].api_key", 5, "invalid environment variable name 'A-B'");
  expect_error(kDeploymentWith + "        api_key: os.environ/\n",
               "models[0].deployments[0].api_key", 5, "invalid environment variable name");
}

// ---------------------------------------------------------------------------
// Errors: one test per kind, each checking the path and the line.

TEST(ConfigErrors, YamlSyntaxInString) {
  expect_error("server:\n  listen: [1, 2\nmodels: []\n", "(root)", 3, "invalid YAML");
}

TEST(ConfigErrors, EmptyDocument) {
  expect_error("", "(root)", 1, "empty");
  expect_error("# only a comment\n", "(root)", 1, "empty");
}

TEST(ConfigErrors, SeveralDocuments) {
  expect_error(kOneModel + "---\n" + kOneModel, "(root)", 6, "single YAML document");
  expect_error(kOneModel + "---\n---\n" + kOneModel, "(root)", 6, "single YAML document");
}

// yaml-cpp 0.7 keeps reporting the same empty document for these, forever.
TEST(ConfigErrors, StrayCommaIsAnErrorNotAHang) {
  expect_error(",\n]", "(root)", 1, "invalid YAML");
  expect_error("# sluice\n\n,{\n]\n", "(root)", 3, "invalid YAML");
}

// A control byte quoted from the config would cut the message short at a NUL
// or reach the terminal as an escape sequence.
TEST(ConfigErrors, ControlBytesInMessagesAreEscaped) {
  std::string yaml = "models:\n  - name: \"a\\";
  yaml += '\0';
  yaml += "b\"\n";
  const std::string message = load_error(yaml);
  EXPECT_THAT(message, HasSubstr("\\x00"));
  EXPECT_THAT(message, EndsWith("(line 2)"));
  EXPECT_EQ(message.find('\0'), std::string::npos);
}

TEST(ConfigErrors, RootIsNotAMapping) {
  expect_error("- a\n- b\n", "(root)", 1, "expected a mapping, got a sequence");
  expect_error("just text\n", "(root)", 1, "expected a mapping, got a scalar");
}

TEST(ConfigErrors, UnknownKeyAtTheRoot) {
  std::string message = load_error(kOneModel + "servers:\n  threads: 1\n");
  EXPECT_THAT(message, StartsWith("servers: unknown key 'servers'"));
  EXPECT_THAT(message, HasSubstr("allowed: server, upstream, router, log, models"));
  EXPECT_THAT(message, EndsWith("(line 5)"));
}

TEST(ConfigErrors, UnknownKeyInServer) {
  expect_error("server:\n  threads: 2\n  lisen: 0.0.0.0:1\n" + kOneModel, "server.lisen", 3,
               "unknown key 'lisen' (allowed: listen, threads, max_body_bytes");
}

TEST(ConfigErrors, UnknownKeyInNestedSections) {
  expect_error("router:\n  backoff: {base: 1s, maximum: 2s}\n" + kOneModel,
               "router.backoff.maximum", 2, "allowed: base, max");
  expect_error("router:\n  cooldown:\n    duration: 1s\n" + kOneModel, "router.cooldown.duration",
               3, "allowed: fails, within, for");
  expect_error("router:\n  hedge: {after: off, at: 1s}\n" + kOneModel, "router.hedge.at", 2,
               "allowed: after");
  expect_error("upstream:\n  pool: 3\n" + kOneModel, "upstream.pool", 2, "unknown key 'pool'");
  expect_error("log:\n  colour: json\n" + kOneModel, "log.colour", 2,
               "allowed: level, format, access_log");
}

TEST(ConfigErrors, UnknownKeyInModelAndDeployment) {
  expect_error("models:\n  - name: m\n    fallback: [x]\n    deployments: [{base_url: http://h}]\n",
               "models[0].fallback", 3, "allowed: name, strategy, fallbacks");
  expect_error(kDeploymentWith + "        api_base: http://h\n",
               "models[0].deployments[0].api_base", 5,
               "allowed: id, base_url, api_key, model, headers, timeouts, tls_verify, ca_file");
  expect_error(kDeploymentWith + "        timeouts: {connect: 1s, read: 2s}\n",
               "models[0].deployments[0].timeouts.read", 5, "allowed: connect, ttft, idle, total");
}

TEST(ConfigErrors, DuplicateKey) {
  expect_error("server:\n  threads: 2\n  threads: 3\n" + kOneModel, "server.threads", 3,
               "duplicate key 'threads' (first given at line 2)");
}

TEST(ConfigErrors, ExpectedAMapping) {
  expect_error("server: 8080\n" + kOneModel, "server", 1, "expected a mapping, got a scalar");
  expect_error("router:\n  backoff: [1s]\n" + kOneModel, "router.backoff", 2,
               "expected a mapping, got a sequence");
  expect_error("models:\n  - gpt-4o\n", "models[0]", 2, "expected a mapping, got a scalar");
  expect_error("models:\n  - name: m\n    deployments:\n      - http://h\n",
               "models[0].deployments[0]", 4, "expected a mapping");
  expect_error(kDeploymentWith + "        headers: [a, b]\n", "models[0].deployments[0].headers", 5,
               "expected a mapping, got a sequence");
}

TEST(ConfigErrors, ExpectedASequence) {
  expect_error("models:\n  name: m\n", "models", 2, "expected a sequence, got a mapping");
  expect_error(
      "models:\n  - name: m\n    fallbacks: other\n    deployments: [{base_url: http://h}]\n",
      "models[0].fallbacks", 3, "expected a sequence, got a scalar");
}

TEST(ConfigErrors, ExpectedANumber) {
  expect_error("server:\n  threads: many\n" + kOneModel, "server.threads", 2,
               "expected a whole number, got 'many'");
  expect_error("server:\n  max_connections: [1]\n" + kOneModel, "server.max_connections", 2,
               "expected a number, got a sequence");
  expect_error("router:\n  latency_buffer: lots\n" + kOneModel, "router.latency_buffer", 2,
               "expected a number");
}

TEST(ConfigErrors, NonIntegerWhereUnsignedIsExpected) {
  expect_error("router:\n  retries: 1.5\n" + kOneModel, "router.retries", 2,
               "expected a whole number, got '1.5'");
  expect_error("server:\n  max_body_bytes: 1e6\n" + kOneModel, "server.max_body_bytes", 2,
               "expected a whole number");
}

TEST(ConfigErrors, NegativeNumbers) {
  expect_error("router:\n  retries: -1\n" + kOneModel, "router.retries", 2, "must not be negative");
  expect_error(kDeploymentWith + "        rpm: -60\n", "models[0].deployments[0].rpm", 5,
               "must not be negative");
  expect_error("router:\n  latency_buffer: -0.1\n" + kOneModel, "router.latency_buffer", 2,
               "at least 0");
}

TEST(ConfigErrors, ExpectedABoolean) {
  expect_error(kDeploymentWith + "        tls_verify: yes\n", "models[0].deployments[0].tls_verify",
               5, "expected true or false, got 'yes'");
}

TEST(ConfigErrors, ExpectedAString) {
  expect_error("models:\n  - name: [a]\n    deployments: [{base_url: http://h}]\n",
               "models[0].name", 2, "expected a string, got a sequence");
  expect_error(kDeploymentWith + "        api_key: {a: b}\n", "models[0].deployments[0].api_key", 5,
               "expected a string, got a mapping");
}

TEST(ConfigErrors, OutOfRangeNumbers) {
  expect_error("router:\n  window: 0\n" + kOneModel, "router.window", 2,
               "out of range: must be at least 1");
  expect_error(kDeploymentWith + "        weight: 0\n", "models[0].deployments[0].weight", 5,
               "at least 1");
  expect_error("server:\n  threads: 5000\n" + kOneModel, "server.threads", 2, "at most 1024");
  expect_error("server:\n  busy_poll_us: 1000001\n" + kOneModel, "server.busy_poll_us", 2,
               "at most 1000000");
  expect_error("server:\n  busy_poll_us: 50us\n" + kOneModel, "server.busy_poll_us", 2,
               "expected a whole number, got '50us'");
  expect_error("server:\n  max_connections: 0\n" + kOneModel, "server.max_connections", 2,
               "at least 1");
  expect_error("router:\n  cooldown: {fails: 0}\n" + kOneModel, "router.cooldown.fails", 2,
               "at least 1");
  expect_error("router:\n  retries: 4294967296\n" + kOneModel, "router.retries", 2,
               "at most 4294967295");
  expect_error("server:\n  max_body_bytes: 99999999999999999999999\n" + kOneModel,
               "server.max_body_bytes", 2, "out of range");
}

TEST(ConfigErrors, BadListenAddress) {
  expect_error("server:\n  listen: 0.0.0.0:70000\n" + kOneModel, "server.listen", 2,
               "invalid listen address '0.0.0.0:70000'");
  expect_error("server:\n  listen: \"::1:8080\"\n" + kOneModel, "server.listen", 2,
               "invalid listen address");
}

TEST(ConfigErrors, MissingModels) {
  expect_error("server:\n  threads: 1\n", "models", 1, "missing required key");
  expect_error("server:\n  threads: 1\nmodels: []\n", "models", 3, "at least one model");
  expect_error("server:\n  threads: 1\nmodels:\n", "models", 1, "missing required key");
}

TEST(ConfigErrors, MissingModelName) {
  expect_error("models:\n  - strategy: latency\n    deployments: [{base_url: http://h}]\n",
               "models[0].name", 2, "missing required key");
  expect_error("models:\n  - name: \"\"\n    deployments: [{base_url: http://h}]\n",
               "models[0].name", 2, "must not be empty");
}

TEST(ConfigErrors, MissingDeployments) {
  expect_error(kOneModel + "  - name: second\n", "models[1].deployments", 5,
               "missing required key");
  expect_error(kOneModel + "  - name: second\n    deployments: []\n", "models[1].deployments", 6,
               "at least one deployment");
}

TEST(ConfigErrors, MissingBaseUrl) {
  expect_error("models:\n  - name: m\n    deployments:\n      - id: a\n        api_key: k\n",
               "models[0].deployments[0].base_url", 4, "missing required key");
}

TEST(ConfigErrors, DuplicateModelNames) {
  expect_error(kOneModel + "  - name: m\n    deployments: [{base_url: http://h}]\n",
               "models[1].name", 5, "duplicate model name 'm' (already defined at models[0])");
}

TEST(Config, DefaultModelsServeTheEndpointsTheyAreNamedFor) {
  ConfigPtr config = load_string(kOneModel +
                                     "  - name: moderation\n"
                                     "    default_for: [/v1/moderations, /v1/images/generations]\n"
                                     "    deployments: [{base_url: http://h}]\n",
                                 kNoEnv);
  ASSERT_NE(config->default_model_for("/moderations"), nullptr);
  EXPECT_EQ(config->default_model_for("/moderations")->name, "moderation");
  EXPECT_EQ(config->default_model_for("/images/generations")->name, "moderation");
  EXPECT_EQ(config->default_model_for("/chat/completions"), nullptr);
  EXPECT_TRUE(config->find_model("m")->default_for.empty());
}

TEST(ConfigErrors, DefaultForNamesAProxiedEndpointOnce) {
  expect_error(kOneModel +
                   "  - name: d\n    default_for: [/moderations]\n"
                   "    deployments: [{base_url: http://h}]\n",
               "models[1].default_for[0]", 6,
               "'/moderations' is not an endpoint sluice proxies (/v1/chat/completions, ");
  expect_error(kOneModel +
                   "  - name: d\n    default_for: [/v1/models]\n"
                   "    deployments: [{base_url: http://h}]\n",
               "models[1].default_for[0]", 6, "'/v1/models' is not an endpoint");
  expect_error(R"(models:
  - name: a
    default_for: [/v1/moderations]
    deployments: [{base_url: "http://h"}]
  - name: b
    default_for: [/v1/audio/speech, /v1/moderations]
    deployments: [{base_url: "http://h"}]
)",
               "models[1].default_for[1]", 6,
               "'/v1/moderations' already has a default model (at models[0].default_for[0])");
}

TEST(ConfigErrors, DuplicateDeploymentIds) {
  expect_error(R"(models:
  - name: a
    deployments:
      - {id: shared, base_url: "http://h"}
  - name: b
    deployments:
      - base_url: http://h
      - base_url: http://h
        id: shared
)",
               "models[1].deployments[1].id", 9,
               "duplicate deployment id 'shared' (already used by models[0].deployments[0])");
}

TEST(ConfigErrors, ExplicitIdCollidesWithADefaultedOne) {
  expect_error(R"(models:
  - name: a
    deployments:
      - {id: a-1, base_url: "http://h"}
      - base_url: http://h
)",
               "models[0].deployments[1].id", 5, "duplicate deployment id 'a-1'");
}

TEST(ConfigErrors, BadUrls) {
  const std::string prefix = "models:\n  - name: m\n    deployments:\n      - base_url: http://h\n";
  auto expect_url_error = [&](const std::string& url, const std::string& why) {
    expect_error(prefix + "      - base_url: \"" + url + "\"\n",
                 "models[0].deployments[1].base_url", 5, why);
  };
  expect_url_error("ftp://h/v1", "invalid URL: unsupported scheme 'ftp'");
  expect_url_error("api.openai.com/v1", "missing scheme");
  expect_url_error("https:///v1", "empty host");
  expect_url_error("https://h:99999/v1", "invalid port '99999'");
  expect_url_error("https://h/v1?api-version=2024-02-01", "query string");
  expect_url_error("https://h/v1#x", "fragment");
  expect_url_error("https://me:secret@h/v1", "credentials");
}

TEST(ConfigErrors, BadDurations) {
  expect_error("server:\n  header_timeout: -5s\n" + kOneModel, "server.header_timeout", 2,
               "must not be negative");
  expect_error("server:\n  body_timeout: 30\n" + kOneModel, "server.body_timeout", 2,
               "needs a unit");
  expect_error("upstream:\n  dns_ttl: 3d\n" + kOneModel, "upstream.dns_ttl", 2,
               "invalid duration '3d'");
  expect_error(kDeploymentWith + "        timeouts:\n          ttft: soon\n",
               "models[0].deployments[0].timeouts.ttft", 6, "invalid duration 'soon'");
  expect_error("router:\n  cooldown: {for: [1s]}\n" + kOneModel, "router.cooldown.for", 2,
               "expected a duration, got a sequence");
}

TEST(ConfigErrors, ZeroTimeouts) {
  expect_error(kDeploymentWith + "        timeouts: {connect: 0}\n",
               "models[0].deployments[0].timeouts.connect", 5, "greater than zero");
  expect_error("server:\n  keepalive_timeout: 0s\n" + kOneModel, "server.keepalive_timeout", 2,
               "greater than zero");
  expect_error("server:\n  write_timeout: 0ms\n" + kOneModel, "server.write_timeout", 2,
               "greater than zero");
  expect_error("router:\n  hedge: {after: 0ms}\n" + kOneModel, "router.hedge.after", 2,
               "greater than zero");
}

TEST(ConfigErrors, BackoffMaxBelowBase) {
  expect_error("router:\n  backoff:\n    base: 2s\n    max: 1s\n" + kOneModel, "router.backoff.max",
               4, "must not be smaller than backoff.base");
  expect_error("router:\n  backoff:\n    base: 10s\n" + kOneModel, "router.backoff.base", 3,
               "must not exceed backoff.max");
}

TEST(ConfigErrors, BadEnums) {
  expect_error(
      "models:\n  - name: m\n    strategy: fastest\n    deployments: [{base_url: http://h}]\n",
      "models[0].strategy", 3,
      "invalid value 'fastest' (allowed: latency, round_robin, weighted, least_busy, "
      "priority)");
  expect_error("log:\n  level: verbose\n" + kOneModel, "log.level", 2,
               "allowed: trace, debug, info, warn, error, off");
  expect_error("router:\n  hedge: {after: p99}\n" + kOneModel, "router.hedge.after", 2,
               "expected off, p95 or a duration");
}

TEST(ConfigErrors, FallbackToUnknownModel) {
  expect_error(
      "models:\n  - name: m\n    fallbacks:\n      - m2\n    deployments: [{base_url: http://h}]\n",
      "models[0].fallbacks[0]", 4, "unknown model 'm2'");
  expect_error(kOneModel +
                   "  - name: n\n    context_window_fallbacks: [m, big]\n"
                   "    deployments: [{base_url: http://h}]\n",
               "models[1].context_window_fallbacks[1]", 6, "unknown model 'big'");
}

TEST(ConfigErrors, FallbackToItself) {
  expect_error(
      "models:\n  - name: m\n    fallbacks: [m]\n    deployments: [{base_url: http://h}]\n",
      "models[0].fallbacks[0]", 3, "cannot fall back to itself");
  expect_error(
      "models:\n  - name: m\n    context_window_fallbacks: [m]\n"
      "    deployments: [{base_url: http://h}]\n",
      "models[0].context_window_fallbacks[0]", 3, "cannot fall back to itself");
}

TEST(ConfigErrors, FallbackListedTwice) {
  expect_error(
      kOneModel + "  - name: n\n    fallbacks: [m, m]\n    deployments: [{base_url: http://h}]\n",
      "models[1].fallbacks[1]", 6, "listed twice");
}

// ---------------------------------------------------------------------------
// Shaping and rules

const std::string kShapingAndRules = R"(models:
  - name: chat-mini
    shaping:
      defaults: {max_tokens: 512, reasoning_effort: low}
      caps: {max_tokens: 2048}
      trim_history: {max_messages: 20, max_prompt_tokens: 6000, keep_system: false}
    deployments: [{base_url: http://h}]
  - name: chat-reasoning
    deployments: [{base_url: http://h}]
  - name: auto
    shaping:
      trim_history: {max_messages: 4}
    rules:
      - {when: {prompt_tokens_below: 200, no_tools: true}, model: chat-mini}
      - {when: {contains_any: ["Prove", "step by step"]}, model: chat-reasoning}
      - {model: chat-mini}
)";

TEST(ShapingConfig, LoadsEveryKey) {
  ConfigPtr config = load_string(kShapingAndRules, kNoEnv);
  const Model& mini = *config->find_model("chat-mini");
  ASSERT_TRUE(mini.shaping);
  EXPECT_EQ(mini.shaping->defaults.max_tokens, 512u);
  EXPECT_EQ(mini.shaping->defaults.reasoning_effort, "low");
  EXPECT_EQ(mini.shaping->caps.max_tokens, 2048u);
  ASSERT_TRUE(mini.shaping->trim_history);
  EXPECT_EQ(mini.shaping->trim_history->max_messages, 20u);
  EXPECT_EQ(mini.shaping->trim_history->max_prompt_tokens, 6000u);
  EXPECT_FALSE(mini.shaping->trim_history->keep_system);
  EXPECT_TRUE(mini.rules.empty());
  EXPECT_FALSE(config->find_model("chat-reasoning")->shaping);

  const Model& router = *config->find_model("auto");
  EXPECT_TRUE(router.deployments.empty());
  ASSERT_TRUE(router.shaping);
  EXPECT_FALSE(router.shaping->defaults.max_tokens);
  EXPECT_FALSE(router.shaping->caps.max_tokens);
  EXPECT_EQ(router.shaping->trim_history->max_messages, 4u);
  EXPECT_EQ(router.shaping->trim_history->max_prompt_tokens, 0u);  // no limit
  EXPECT_TRUE(router.shaping->trim_history->keep_system);          // the default
  ASSERT_EQ(router.rules.size(), 3u);
  ASSERT_TRUE(router.rules[0].when);
  EXPECT_EQ(router.rules[0].when->prompt_tokens_below, 200u);
  EXPECT_EQ(router.rules[0].when->no_tools, true);
  EXPECT_TRUE(router.rules[0].when->contains_any.empty());
  EXPECT_EQ(router.rules[0].model, "chat-mini");
  // Phrases are lower-cased once, for a case-insensitive match.
  EXPECT_EQ(router.rules[1].when->contains_any,
            (std::vector<std::string>{"prove", "step by step"}));
  EXPECT_FALSE(router.rules[1].when->prompt_tokens_below);
  EXPECT_FALSE(router.rules[1].when->no_tools);
  EXPECT_FALSE(router.rules[2].when);
  EXPECT_EQ(router.rules[2].model, "chat-mini");
}

TEST(ShapingConfig, OffUnlessSet) {
  ConfigPtr config = load_string(kOneModel, kNoEnv);
  EXPECT_FALSE(config->models[0].shaping);
  EXPECT_TRUE(config->models[0].rules.empty());
}

const std::string kTwoModels =
    "models:\n"
    "  - name: a\n"
    "    deployments: [{base_url: http://h}]\n"
    "  - name: r\n";

TEST(ShapingConfigErrors, EitherDeploymentsOrRules) {
  expect_error(kTwoModels + "    rules: [{model: a}]\n    deployments: [{base_url: http://h}]\n",
               "models[1].deployments", 6, "either deployments or rules, not both");
  expect_error(kTwoModels + "    shaping: {caps: {max_tokens: 5}}\n", "models[1].deployments", 4,
               "missing required key: give deployments, or rules");
  expect_error(kTwoModels + "    rules: []\n", "models[1].rules", 5, "at least one rule");
}

TEST(ShapingConfigErrors, RuleModelsHaveNoRouterKeysOfTheirOwn) {
  expect_error(kTwoModels + "    fallbacks: [a]\n    rules: [{model: a}]\n", "models[1].fallbacks",
               5, "not allowed on a model with rules");
  expect_error(kTwoModels + "    strategy: priority\n    rules: [{model: a}]\n",
               "models[1].strategy", 5, "not allowed on a model with rules");
}

TEST(ShapingConfigErrors, RuleTargets) {
  expect_error(kTwoModels + "    rules:\n      - model: nope\n", "models[1].rules[0].model", 6,
               "unknown model 'nope'");
  expect_error(kTwoModels + "    rules: [{model: r}]\n", "models[1].rules[0].model", 5,
               "routes by rules itself");
  expect_error(kTwoModels + "    rules: [{model: a}]\n  - name: r2\n    rules: [{model: r}]\n",
               "models[2].rules[0].model", 7, "routes by rules itself");
  expect_error(kTwoModels + "    rules: [{when: {no_tools: true}}]\n", "models[1].rules[0].model",
               5, "missing required key");
}

TEST(ShapingConfigErrors, FallbacksCannotNameARuleModel) {
  expect_error(
      "models:\n  - name: a\n    fallbacks: [r]\n    deployments: [{base_url: http://h}]\n"
      "  - name: r\n    rules: [{model: a}]\n",
      "models[0].fallbacks[0]", 3, "routes by rules and has no deployments");
}

TEST(ShapingConfigErrors, OnlyTheLastRuleMayMatchEverything) {
  expect_error(kTwoModels +
                   "    rules:\n      - model: a\n      - when: {no_tools: true}\n"
                   "        model: a\n",
               "models[1].rules[0]", 6, "only the last rule may leave out 'when'");
  expect_error(kTwoModels + "    rules: [{when: {}, model: a}]\n", "models[1].rules[0].when", 5,
               "set at least one condition");
}

TEST(ShapingConfigErrors, RuleConditions) {
  expect_error(kTwoModels + "    rules: [{when: {tokens_below: 5}, model: a}]\n",
               "models[1].rules[0].when.tokens_below", 5,
               "allowed: prompt_tokens_below, no_tools, contains_any");
  expect_error(kTwoModels + "    rules: [{when: {prompt_tokens_below: 0}, model: a}]\n",
               "models[1].rules[0].when.prompt_tokens_below", 5, "at least 1");
  expect_error(kTwoModels + "    rules: [{when: {no_tools: yes}, model: a}]\n",
               "models[1].rules[0].when.no_tools", 5, "expected true or false");
  expect_error(kTwoModels + "    rules: [{when: {contains_any: []}, model: a}]\n",
               "models[1].rules[0].when.contains_any", 5, "at least one phrase");
  expect_error(kTwoModels + "    rules: [{when: {contains_any: [\"\"]}, model: a}]\n",
               "models[1].rules[0].when.contains_any[0]", 5, "must not be empty");
  expect_error(kTwoModels + "    rules: [{when: {contains_any: prove}, model: a}]\n",
               "models[1].rules[0].when.contains_any", 5, "expected a sequence");
}

TEST(ShapingConfigErrors, ShapingKeys) {
  const std::string model = "models:\n  - name: a\n    deployments: [{base_url: http://h}]\n";
  expect_error(model + "    shaping: {trim: {}}\n", "models[0].shaping.trim", 4,
               "allowed: defaults, caps, trim_history");
  expect_error(model + "    shaping:\n      defaults: {temperature: 0}\n",
               "models[0].shaping.defaults.temperature", 5,
               "allowed: max_tokens, reasoning_effort");
  expect_error(model + "    shaping:\n      caps: {n: 1}\n", "models[0].shaping.caps.n", 5,
               "allowed: max_tokens");
  expect_error(model + "    shaping:\n      trim_history: {max_turns: 3}\n",
               "models[0].shaping.trim_history.max_turns", 5,
               "allowed: max_messages, max_prompt_tokens, keep_system");
}

TEST(ShapingConfigErrors, ShapingValues) {
  const std::string model = "models:\n  - name: a\n    deployments: [{base_url: http://h}]\n";
  expect_error(model + "    shaping:\n      defaults: {max_tokens: 0}\n",
               "models[0].shaping.defaults.max_tokens", 5, "at least 1");
  expect_error(model + "    shaping:\n      caps: {max_tokens: -5}\n",
               "models[0].shaping.caps.max_tokens", 5, "must not be negative");
  expect_error(model + "    shaping:\n      defaults: {reasoning_effort: extreme}\n",
               "models[0].shaping.defaults.reasoning_effort", 5, "invalid value 'extreme'");
  expect_error(model +
                   "    shaping:\n      defaults: {max_tokens: 4096}\n"
                   "      caps: {max_tokens: 1024}\n",
               "models[0].shaping.defaults.max_tokens", 5,
               "must not exceed caps.max_tokens (1024)");
  expect_error(model + "    shaping:\n      trim_history: {max_messages: 0}\n",
               "models[0].shaping.trim_history.max_messages", 5, "at least 1");
  expect_error(model + "    shaping:\n      trim_history: {max_prompt_tokens: 0}\n",
               "models[0].shaping.trim_history.max_prompt_tokens", 5, "at least 1");
  expect_error(model + "    shaping:\n      trim_history: {keep_system: true}\n",
               "models[0].shaping.trim_history", 5, "set max_messages, max_prompt_tokens or both");
}

TEST(ConfigErrors, MissingCaFile) {
  expect_error(kDeploymentWith + "        ca_file: /nonexistent/sluice-ca.pem\n",
               "models[0].deployments[0].ca_file", 5, "does not exist");
  expect_error(kDeploymentWith + "        ca_file: /\n", "models[0].deployments[0].ca_file", 5,
               "not a regular file");
}

TEST(ConfigErrors, BadHeaders) {
  expect_error(kDeploymentWith + "        headers: {\"Bad Name\": x}\n",
               "models[0].deployments[0].headers.Bad Name", 5, "invalid header name");
  expect_error(kDeploymentWith + "        headers:\n          Content-Length: \"5\"\n",
               "models[0].deployments[0].headers.Content-Length", 6, "set by the gateway");
  expect_error(kDeploymentWith + "        headers:\n          X-A: a\n          x-a: b\n",
               "models[0].deployments[0].headers.x-a", 7, "duplicate header 'x-a'");
  expect_error(kDeploymentWith + "        headers:\n          X-A: ${INJECT}\n",
               "models[0].deployments[0].headers.X-A", 6, "line breaks",
               fake_env({{"INJECT", "a\r\nX-Evil: 1"}}));
}

TEST(ConfigErrors, ApiKeyWithLineBreak) {
  expect_error(kDeploymentWith + "        api_key: ${KEY}\n", "models[0].deployments[0].api_key", 5,
               "line breaks", fake_env({{"KEY", "sk\n"}}));
}

// ---------------------------------------------------------------------------
// load_file

std::filesystem::path write_temp_file(const std::string& name, const std::string& contents) {
  auto path = std::filesystem::temp_directory_path() /
              ("sluice-config-test-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream(path) << contents;
  return path;
}

TEST(LoadFile, ReadsAFile) {
  auto path = write_temp_file("ok.yaml", kOneModel);
  ConfigPtr config = load_file(path.string(), kNoEnv);
  EXPECT_EQ(config->models[0].name, "m");
  std::filesystem::remove(path);
}

TEST(LoadFile, MissingFile) {
  try {
    load_file("/nonexistent/sluice.yaml", kNoEnv);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_STREQ(error.what(), "/nonexistent/sluice.yaml: cannot read file");
  }
}

TEST(LoadFile, DirectoryIsNotAFile) {
  auto directory = std::filesystem::temp_directory_path().string();
  try {
    load_file(directory, kNoEnv);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), directory + ": cannot read file");
  }
}

TEST(LoadFile, SyntaxErrorNamesTheFile) {
  auto path = write_temp_file("broken.yaml", "server:\n  threads: 1\n models: [\n");
  try {
    load_file(path.string(), kNoEnv);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_THAT(error.what(), StartsWith(path.string() + ": invalid YAML"));
    EXPECT_THAT(error.what(), EndsWith("(line 3)"));
  }
  std::filesystem::remove(path);
}

TEST(LoadFile, OtherErrorsAreNotPrefixedWithTheFile) {
  auto path = write_temp_file("bad-window.yaml", "router:\n  window: 0\n" + kOneModel);
  try {
    load_file(path.string(), kNoEnv);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_THAT(error.what(), StartsWith("router.window: "));
    EXPECT_THAT(error.what(), EndsWith("(line 2)"));
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sluice::config

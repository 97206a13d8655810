// The response cache and warm-connection keys of a model and its
// deployments: defaults, values, and errors with their YAML path and line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/config/config.hpp"
#include "support/config_loading.hpp"

namespace sluice::config {
namespace {

using namespace std::chrono_literals;
using testing::EndsWith;
using testing::HasSubstr;
using testing::StartsWith;

std::string with_cache(const std::string& cache_lines) {
  return "models:\n"
         "  - name: chat\n" +
         cache_lines +
         "    deployments:\n"
         "      - base_url: http://127.0.0.1:8000\n"
         "  - name: embed\n"
         "    deployments:\n"
         "      - base_url: http://127.0.0.1:8000\n";
}

TEST(CacheConfig, OffByDefaultWithDocumentedDefaults) {
  auto config = load_string(with_cache(""), kNoEnv);
  const auto& cache = config->find_model("chat")->cache;
  EXPECT_EQ(cache.mode, Cache::Mode::off);
  EXPECT_EQ(cache.ttl, 10min);
  EXPECT_EQ(cache.max_entries, 10000u);
  EXPECT_DOUBLE_EQ(cache.threshold, 0.95);
  EXPECT_EQ(config->find_model("chat")->deployments[0].warm_connections, 1u);
}

TEST(CacheConfig, ReadsEveryKey) {
  auto config =
      load_string(with_cache("    cache:\n"
                             "      mode: semantic\n"
                             "      ttl: 90s\n"
                             "      max_entries: 42\n"
                             "      semantic: {embedding_model: embed, threshold: 0.9}\n"),
                  kNoEnv);
  const auto& cache = config->find_model("chat")->cache;
  EXPECT_EQ(cache.mode, Cache::Mode::semantic);
  EXPECT_EQ(cache.ttl, 90s);
  EXPECT_EQ(cache.max_entries, 42u);
  EXPECT_EQ(cache.embedding_model, "embed");
  EXPECT_DOUBLE_EQ(cache.threshold, 0.9);

  auto exact = load_string(with_cache("    cache: {mode: exact}\n"), kNoEnv);
  EXPECT_EQ(exact->find_model("chat")->cache.mode, Cache::Mode::exact);
}

TEST(CacheConfig, Errors) {
  expect_error(with_cache("    cache: {mode: fuzzy}\n"), "models[0].cache.mode", 3,
               "allowed: off, exact, semantic");
  expect_error(with_cache("    cache: {mode: exact, ttl: 0s}\n"), "models[0].cache.ttl", 3,
               "greater than zero");
  expect_error(with_cache("    cache: {mode: exact, max_entries: 0}\n"),
               "models[0].cache.max_entries", 3, "at least 1");
  expect_error(with_cache("    cache: {mode: exact, size: 3}\n"), "models[0].cache.size", 3,
               "unknown key 'size'");
  expect_error(with_cache("    cache:\n      mode: semantic\n"),
               "models[0].cache.semantic.embedding_model", 4, "missing required key");
  expect_error(with_cache("    cache:\n      mode: semantic\n      semantic: {threshold: 0.9}\n"),
               "models[0].cache.semantic.embedding_model", 5, "missing required key");
  expect_error(with_cache("    cache:\n      mode: semantic\n"
                          "      semantic: {embedding_model: nope}\n"),
               "models[0].cache.semantic.embedding_model", 5, "unknown model 'nope'");
  expect_error(with_cache("    cache:\n      mode: semantic\n"
                          "      semantic: {embedding_model: chat}\n"),
               "models[0].cache.semantic.embedding_model", 5, "cannot embed its own");
  expect_error(with_cache("    cache:\n      semantic: {embedding_model: embed, threshold: 0}\n"),
               "models[0].cache.semantic.threshold", 4, "greater than 0 and at most 1");
  expect_error(with_cache("    cache:\n      semantic: {embedding_model: embed, threshold: 1.5}\n"),
               "models[0].cache.semantic.threshold", 4, "greater than 0 and at most 1");
}

TEST(WarmConnectionsConfig, ReadsAndBoundsTheCount) {
  auto config = load_string(
      "models:\n  - name: m\n    deployments:\n"
      "      - base_url: http://127.0.0.1:8000\n"
      "        warm_connections: 0\n"
      "      - base_url: http://127.0.0.1:8001\n"
      "        warm_connections: 4\n",
      kNoEnv);
  EXPECT_EQ(config->models[0].deployments[0].warm_connections, 0u);
  EXPECT_EQ(config->models[0].deployments[1].warm_connections, 4u);
  expect_error(
      "models:\n  - name: m\n    deployments:\n"
      "      - base_url: http://127.0.0.1:8000\n"
      "        warm_connections: 5000\n",
      "models[0].deployments[0].warm_connections", 5, "at most 1024");
}

}  // namespace
}  // namespace sluice::config

// The per-model answer store: LRU order, time to live, the entry bound,
// nearest-vector lookups, and what a reload keeps.
#include "sluice/cache/response_cache.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "sluice/config/config.hpp"

namespace sluice::cache {
namespace {

using namespace std::chrono_literals;

Digest digest(unsigned char tag) {
  Digest value{};
  value.fill(tag);
  return value;
}

std::shared_ptr<const CachedResponse> response(const std::string& body) {
  return std::make_shared<const CachedResponse>(CachedResponse{Endpoint::chat, body});
}

const TimePoint kStart = TimePoint{} + 1h;

TEST(ResponseCache, FindsWhatWasStoredUnderItsKeyOnly) {
  ResponseCache cache(10, 1min);
  cache.store(digest(1), response("one"), kStart);
  auto found = cache.find(digest(1), kStart);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->body, "one");
  EXPECT_EQ(cache.find(digest(2), kStart), nullptr);
}

TEST(ResponseCache, EntriesExpireAfterTheirTtl) {
  ResponseCache cache(10, 200ms);
  cache.store(digest(1), response("one"), kStart);
  EXPECT_NE(cache.find(digest(1), kStart + 199ms), nullptr);
  EXPECT_EQ(cache.find(digest(1), kStart + 200ms), nullptr);
  EXPECT_EQ(cache.size(), 0u) << "an expired entry is dropped when found";
}

TEST(ResponseCache, StoringAgainReplacesAndRestartsTheTtl) {
  ResponseCache cache(10, 200ms);
  cache.store(digest(1), response("old"), kStart);
  cache.store(digest(1), response("new"), kStart + 150ms);
  auto found = cache.find(digest(1), kStart + 300ms);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->body, "new");
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ResponseCache, StaysWithinMaxEntriesEvictingTheLeastRecentlyUsed) {
  ResponseCache cache(3, 1min);
  cache.store(digest(1), response("1"), kStart);
  cache.store(digest(2), response("2"), kStart);
  cache.store(digest(3), response("3"), kStart);
  // Using 1 makes 2 the least recently used.
  ASSERT_NE(cache.find(digest(1), kStart), nullptr);
  cache.store(digest(4), response("4"), kStart);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.find(digest(2), kStart), nullptr);
  EXPECT_NE(cache.find(digest(1), kStart), nullptr);
  EXPECT_NE(cache.find(digest(3), kStart), nullptr);
  EXPECT_NE(cache.find(digest(4), kStart), nullptr);
  for (unsigned char i = 10; i < 100; ++i) cache.store(digest(i), response("x"), kStart);
  EXPECT_EQ(cache.size(), 3u);
}

TEST(ResponseCache, FindSimilarHonoursTheThresholdAndTheScope) {
  ResponseCache cache(10, 1min);
  // Two unit vectors at a known angle: cos = 0.8.
  std::vector<float> stored = {1.0f, 0.0f};
  std::vector<float> query = {0.8f, 0.6f};
  cache.store(digest(1), response("near"), kStart, digest(7), stored);

  auto hit = cache.find_similar(digest(7), query, 0.79, kStart);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->response->body, "near");
  EXPECT_NEAR(hit->similarity, 0.8, 1e-6);
  EXPECT_FALSE(cache.find_similar(digest(7), query, 0.81, kStart).has_value());
  EXPECT_FALSE(cache.find_similar(digest(8), query, 0.5, kStart).has_value())
      << "another conversation or other parameters never match";
  EXPECT_FALSE(cache.find_similar(digest(7), query, 0.5, kStart + 1min).has_value())
      << "expired entries never match";
}

TEST(ResponseCache, FindSimilarPicksTheClosestEntry) {
  ResponseCache cache(10, 1min);
  cache.store(digest(1), response("far"), kStart, digest(7), {0.6f, 0.8f});
  cache.store(digest(2), response("close"), kStart, digest(7), {0.8f, 0.6f});
  cache.store(digest(3), response("no vector"), kStart, digest(7));
  auto hit = cache.find_similar(digest(7), std::vector<float>{1.0f, 0.0f}, 0.5, kStart);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->response->body, "close");
}

TEST(ResponseCache, AnIdenticalVectorMatchesAtThresholdOne) {
  ResponseCache cache(10, 1min);
  auto vector = unit_vector(std::vector<float>{0.3f, 0.7f, 0.1f});
  cache.store(digest(1), response("same"), kStart, digest(7), vector);
  EXPECT_TRUE(cache.find_similar(digest(7), vector, 1.0, kStart).has_value());
}

TEST(UnitVector, ScalesToLengthOneAndRejectsZero) {
  auto unit = unit_vector(std::vector<float>{3.0f, 4.0f});
  ASSERT_EQ(unit.size(), 2u);
  EXPECT_FLOAT_EQ(unit[0], 0.6f);
  EXPECT_FLOAT_EQ(unit[1], 0.8f);
  EXPECT_TRUE(unit_vector(std::vector<float>{0.0f, 0.0f}).empty());
  EXPECT_TRUE(unit_vector(std::vector<float>{NAN, 1.0f}).empty());
  EXPECT_DOUBLE_EQ(cosine_similarity(unit, std::vector<float>{1.0f}), 0.0);
}

config::ConfigPtr config_with(const std::string& cache_yaml, const std::string& upstream_model) {
  return config::load_string(
      "models:\n"
      "  - name: chat\n" +
      cache_yaml +
      "    deployments:\n"
      "      - base_url: http://127.0.0.1:9/v1\n"
      "        model: " +
      upstream_model +
      "\n"
      "  - name: plain\n"
      "    deployments:\n"
      "      - base_url: http://127.0.0.1:9/v1\n");
}

TEST(Caches, OnlyModelsWithACacheHaveOne) {
  auto config = config_with("    cache: {mode: exact, max_entries: 5, ttl: 2s}\n", "m");
  Caches caches(*config);
  auto* chat = caches.find("chat");
  ASSERT_NE(chat, nullptr);
  EXPECT_EQ(chat->max_entries(), 5u);
  EXPECT_EQ(chat->ttl(), 2s);
  EXPECT_EQ(caches.find("plain"), nullptr);
  EXPECT_EQ(caches.find("unknown"), nullptr);
}

TEST(Caches, AReloadKeepsTheCacheOfAnUnchangedModelOnly) {
  const std::string settings = "    cache: {mode: exact}\n";
  Caches first(*config_with(settings, "m"));
  first.find("chat")->store(digest(1), response("kept"), Clock::now());

  Caches same(*config_with(settings, "m"), &first);
  ASSERT_NE(same.find("chat"), nullptr);
  EXPECT_NE(same.find("chat")->find(digest(1), Clock::now()), nullptr);

  Caches other_upstream(*config_with(settings, "another-model"), &same);
  EXPECT_EQ(other_upstream.find("chat")->find(digest(1), Clock::now()), nullptr);

  Caches other_settings(*config_with("    cache: {mode: exact, ttl: 1m}\n", "m"), &same);
  EXPECT_EQ(other_settings.find("chat")->find(digest(1), Clock::now()), nullptr);
}

}  // namespace
}  // namespace sluice::cache

#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "sluice/cache/request_key.hpp"
#include "sluice/common/clock.hpp"
#include "sluice/config/config.hpp"

namespace sluice::cache {

// A complete, successful answer in the non-streaming form (a
// `chat.completion` or `text_completion` JSON object), whichever way the
// client that filled the entry asked for it; a hit is rendered from it as
// JSON or as a stream.
struct CachedResponse {
  Endpoint endpoint = Endpoint::chat;
  std::string body;
};

struct SimilarMatch {
  std::shared_ptr<const CachedResponse> response;
  double similarity = 0;
};

// The answers of one model: LRU over at most max_entries, each valid for
// ttl. Every call takes `now`, so tests drive time by hand.
//
// One cache per model, shared by all worker threads and guarded by a mutex:
// per-thread shards would divide the hit rate by the number of threads and
// multiply the memory. Each call holds the lock for a map lookup and a list
// splice (a semantic lookup: one pass over the model's vectors), never across
// an await, and hands out shared pointers so a response is written to the
// client without the lock.
class ResponseCache {
 public:
  ResponseCache(std::size_t max_entries, std::chrono::milliseconds ttl);
  ResponseCache(const ResponseCache&) = delete;
  ResponseCache& operator=(const ResponseCache&) = delete;

  // The fresh entry stored under `key`, marked as most recently used.
  std::shared_ptr<const CachedResponse> find(const Digest& key, TimePoint now);

  // The fresh entry of the same `scope` whose vector is closest to
  // `unit_vector` by cosine similarity, if that is at least `threshold`.
  std::optional<SimilarMatch> find_similar(const Digest& scope, std::span<const float> unit_vector,
                                           double threshold, TimePoint now);

  // Stores (or replaces) the entry under `key`, evicting the least recently
  // used beyond max_entries. `unit_vector` (may be empty) and `scope` make it
  // findable by find_similar.
  void store(const Digest& key, std::shared_ptr<const CachedResponse> response, TimePoint now,
             const Digest& scope = {}, std::vector<float> unit_vector = {});

  std::size_t size() const;
  std::size_t max_entries() const { return max_entries_; }
  std::chrono::milliseconds ttl() const { return ttl_; }

 private:
  struct Entry {
    Digest key;
    std::shared_ptr<const CachedResponse> response;
    TimePoint expires_at;
    Digest scope;
    std::vector<float> unit_vector;
  };
  struct DigestHash {
    std::size_t operator()(const Digest& digest) const;
  };
  using Entries = std::list<Entry>;  // most recently used first

  void erase(Entries::iterator entry);

  const std::size_t max_entries_;
  const std::chrono::milliseconds ttl_;
  mutable std::mutex mutex_;
  Entries entries_;
  std::unordered_map<Digest, Entries::iterator, DigestHash> index_;
};

// The caches of one config snapshot, by public model name. On reload a
// model keeps its cache when its cache settings and deployments are
// unchanged; any other model starts empty.
class Caches {
 public:
  explicit Caches(const config::Config& config, const Caches* previous = nullptr);

  // Null when the model has no cache (or is unknown).
  ResponseCache* find(const std::string& model) const;

 private:
  struct Slot {
    config::Cache settings;
    std::vector<std::string> deployment_signatures;
    std::shared_ptr<ResponseCache> cache;
  };
  std::unordered_map<std::string, Slot> slots_;
};

// `vector` scaled to length 1; empty when it is empty, all zero or not finite.
std::vector<float> unit_vector(std::span<const float> vector);

// Dot product of two unit vectors of equal length; 0 when the lengths differ.
double cosine_similarity(std::span<const float> a, std::span<const float> b);

}  // namespace sluice::cache

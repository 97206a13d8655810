#pragma once

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cache/request_key.hpp"
#include "sluice/cache/response_cache.hpp"
#include "sluice/config/config.hpp"
#include "sluice/server/request_context.hpp"

// The cache lookup phase, between shape and forward: answers a hit, and
// keeps a cacheable miss's response once it has been relayed.
namespace sluice::server {

// Responses larger than this are relayed but never cached.
inline constexpr std::size_t kMaxCachedResponseBytes = 1024 * 1024;

// One request's dealings with its model's cache.
struct CacheStep {
  // Set when the request missed and a complete answer should be stored.
  cache::ResponseCache* cache = nullptr;
  cache::Endpoint endpoint = cache::Endpoint::chat;
  cache::RequestKey key;
  std::vector<float> unit_vector;  // semantic mode: the query's embedding

  // Filled by the proxy while it relays the answer: the upstream body as read.
  std::string captured;

  // Exact mode with the shared state backend up: the entry lives in Redis
  // under `shared_key` instead, for the model's ttl.
  WorkerState* shared = nullptr;
  std::unique_ptr<std::string> shared_key;  // only ever made with the redis backend
  std::chrono::milliseconds ttl{0};
};

// Whether the model has a cache: only then does the lookup run (a
// coroutine, whose frame the others never allocate).
inline bool has_cache(const config::Model& model) {
  return model.cache.mode != config::Cache::Mode::off;
}

// Stores the answer of a cacheable miss; the caller has seen it was a 200,
// read to its end with nothing dropped from the capture.
void remember_response(CacheStep& step, bool event_stream);

}  // namespace sluice::server

#pragma once

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cache/request_key.hpp"
#include "sluice/cache/response_cache.hpp"
#include "sluice/openai/request_body.hpp"
#include "sluice/server/pipeline.hpp"

// The cache stage between auth and the router: answers a hit, and keeps a
// cacheable miss's response once it has been relayed.
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
};

// Looks the request up when its model has a cache (the caller checks the
// mode first, so models without one pay nothing) and the request may be
// cached (`temperature: 0` or `cache: true`, no `Cache-Control: no-cache`).
// A hit is answered here and the result says whether the connection may be
// kept; nullopt means go on upstream.
boost::asio::awaitable<std::optional<bool>> answer_from_cache(RequestContext& context,
                                                              std::string_view endpoint,
                                                              const RequestBody& inspected,
                                                              CacheStep& step);

// Stores the answer of a cacheable miss; the caller has seen it was a 200,
// read to its end with nothing dropped from the capture.
void remember_response(CacheStep& step, bool event_stream);

}  // namespace sluice::server

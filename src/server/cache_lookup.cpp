#include "sluice/server/cache_lookup.hpp"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "sluice/cache/replay.hpp"
#include "sluice/common/json_scan.hpp"
#include "sluice/http/http_head.hpp"
#include "sluice/server/forward.hpp"
#include "sluice/server/phases.hpp"
#include "sluice/server/respond.hpp"

namespace sluice::server {

namespace net = boost::asio;

namespace {

// `Cache-Control: no-cache` (or `no-store`) on the request: neither look up
// nor store.
bool opts_out(const ClientRequest& request) {
  bool opted_out = false;
  request.for_each_value("cache-control", [&](std::string_view value) {
    std::size_t start = 0;
    while (!opted_out && start <= value.size()) {
      auto end = std::min(value.find(',', start), value.size());
      auto directive = value.substr(start, end - start);
      while (!directive.empty() && directive.front() == ' ') directive.remove_prefix(1);
      while (!directive.empty() && directive.back() == ' ') directive.remove_suffix(1);
      opted_out = iequals(directive, "no-cache") || iequals(directive, "no-store");
      start = end + 1;
    }
  });
  return opted_out;
}

// The query's embedding from the configured embeddings model; empty when
// that call fails, which makes the request an ordinary miss.
net::awaitable<std::vector<float>> embed_query(RequestContext& context,
                                               const config::Model& embedder,
                                               std::string_view text) {
  std::string body_after_model = R"(,"input":)";
  append_json_string(body_after_model, text);
  body_after_model += '}';
  auto answer = co_await internal_post(context, embedder, "/embeddings", body_after_model);
  if (!answer) {
    spdlog::debug("request {}: no embedding for the semantic cache: {}", context.request_id,
                  answer.error().message);
    co_return std::vector<float>{};
  }
  auto vector = cache::embedding_from_body(answer.value());
  if (vector.empty()) {
    spdlog::debug("request {}: the embeddings answer of {} holds no vector", context.request_id,
                  embedder.name);
  }
  co_return vector;
}

// Exact mode's entries in Redis: one byte for the endpoint, then the body.
// Redis enforces the TTL, and its maxmemory policy bounds the size.
std::string shared_cache_key(const WorkerState& shared, const std::string& model,
                             const cache::Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string key = shared.settings().redis.key_prefix;
  key.append("cache:").append(model).append(":");
  for (unsigned char byte : digest) {
    key += kDigits[byte >> 4];
    key += kDigits[byte & 0xf];
  }
  return key;
}

net::awaitable<std::shared_ptr<const cache::CachedResponse>> find_shared(WorkerState& shared,
                                                                         const std::string& key) {
  std::array<std::string_view, 2> get{"GET", key};
  auto reply = co_await shared.redis().command(get);
  if (!reply || reply->type != state::Reply::Type::string || reply->text.empty()) {
    co_return nullptr;
  }
  auto response = std::make_shared<cache::CachedResponse>();
  response->endpoint = reply->text[0] == 'c' ? cache::Endpoint::completions : cache::Endpoint::chat;
  response->body.assign(reply->text, 1);
  co_return response;
}

}  // namespace

// A request may be cached when it says so (`cache: true`), or by default
// with `temperature: 0`, and carries no `Cache-Control: no-cache`.
net::awaitable<std::optional<bool>> look_up_cache(RequestContext& context, RequestJob& job) {
  const auto endpoint = job.route.endpoint;
  const auto& inspected = job.resolution.inspected;
  auto& step = job.cache_step;
  auto* cache = context.snapshot->caches->find(context.model->name);
  if (!cache) co_return std::nullopt;
  auto cached_endpoint = cache::cached_endpoint(endpoint);
  bool cacheable = inspected.cache.value_or(inspected.zero_temperature);
  if (!cached_endpoint || !cacheable) co_return std::nullopt;
  if (opts_out(context.request)) {
    context.record.cache = "bypass";
    context.response_fields.append("x-sluice-cache: bypass\r\n");
    co_return std::nullopt;
  }

  const auto& settings = context.model->cache;
  bool semantic = settings.mode == config::Cache::Mode::semantic;
  auto parsed = nlohmann::json::parse(context.request.body(), nullptr, /*allow_exceptions=*/false);
  step.endpoint = *cached_endpoint;
  step.key = cache::request_key(std::move(parsed), context.model->name, step.endpoint, semantic);

  std::shared_ptr<const cache::CachedResponse> hit;
  WorkerState* shared = context.worker.shared_state();
  if (!semantic && shared != nullptr && shared->redis().up()) {
    step.shared = shared;
    step.shared_key = std::make_unique<std::string>(
        shared_cache_key(*shared, context.model->name, step.key.exact));
    step.ttl = settings.ttl;
    hit = co_await find_shared(*shared, *step.shared_key);
  } else {
    hit = cache->find(step.key.exact, Clock::now());
  }
  std::optional<double> similarity;
  if (!hit && semantic && !step.key.has_tools && !step.key.query_text.empty()) {
    // Validated at load: the embedding model is one of this config's.
    if (const auto* embedder = context.snapshot->config->find_model(settings.embedding_model)) {
      step.unit_vector = co_await embed_query(context, *embedder, step.key.query_text);
      auto match =
          cache->find_similar(step.key.scope, step.unit_vector, settings.threshold, Clock::now());
      if (match) {
        hit = std::move(match->response);
        similarity = match->similarity;
      }
    }
  }

  std::optional<std::string> replay;
  if (hit && context.stream) {
    replay = cache::render_event_stream(*hit, inspected.include_usage);
    if (!replay) hit = nullptr;  // an entry that cannot be replayed is replaced
  }
  if (!hit) {
    step.cache = cache;
    context.record.cache = "miss";
    context.response_fields.append("x-sluice-cache: miss\r\n");
    co_return std::nullopt;
  }
  // Nothing was spent upstream: the request counts against rpm, its tokens
  // are not charged.
  job.answered_by = AnsweredBy::cache;
  std::string fields = "x-sluice-cache: hit\r\n";
  context.record.cache = "hit";
  if (similarity) {
    context.record.cache = "semantic_hit";
    char text[16];
    std::snprintf(text, sizeof text, "%.4f", *similarity);
    fields.append("x-sluice-cache-similarity: ").append(text).append("\r\n");
  }
  if (replay) {
    co_return co_await respond_body(context, 200, "text/event-stream", *replay, fields);
  }
  co_return co_await respond_body(context, 200, "application/json", hit->body, fields);
}

void remember_response(CacheStep& step, bool event_stream) {
  if (!step.cache) return;
  auto response = event_stream ? cache::from_event_stream(step.captured, step.endpoint)
                               : cache::from_json_body(step.captured, step.endpoint);
  if (!response) return;
  if (step.shared != nullptr) {
    if (response->body.size() > kMaxCachedResponseBytes) return;
    std::string value(1, response->endpoint == cache::Endpoint::completions ? 'c' : 'h');
    value += response->body;
    auto ttl = std::to_string(step.ttl.count());
    std::array<std::string_view, 5> set{"SET", *step.shared_key, value, "PX", ttl};
    step.shared->redis().send(set);
    return;
  }
  step.cache->store(step.key.exact,
                    std::make_shared<const cache::CachedResponse>(std::move(*response)),
                    Clock::now(), step.key.scope, std::move(step.unit_vector));
}

}  // namespace sluice::server

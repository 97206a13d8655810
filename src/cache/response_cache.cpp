#include "sluice/cache/response_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sluice::cache {

std::size_t ResponseCache::DigestHash::operator()(const Digest& digest) const {
  // A SHA-256 is uniformly distributed already: its first bytes are a hash.
  std::size_t value;
  std::memcpy(&value, digest.data(), sizeof value);
  return value;
}

ResponseCache::ResponseCache(std::size_t max_entries, std::chrono::milliseconds ttl)
    : max_entries_(std::max<std::size_t>(1, max_entries)), ttl_(ttl) {}

void ResponseCache::erase(Entries::iterator entry) {
  index_.erase(entry->key);
  entries_.erase(entry);
}

std::shared_ptr<const CachedResponse> ResponseCache::find(const Digest& key, TimePoint now) {
  std::lock_guard lock(mutex_);
  auto found = index_.find(key);
  if (found == index_.end()) return nullptr;
  auto entry = found->second;
  if (now >= entry->expires_at) {
    erase(entry);
    return nullptr;
  }
  entries_.splice(entries_.begin(), entries_, entry);
  return entry->response;
}

std::optional<SimilarMatch> ResponseCache::find_similar(const Digest& scope,
                                                        std::span<const float> unit_vector,
                                                        double threshold, TimePoint now) {
  if (unit_vector.empty()) return std::nullopt;
  std::lock_guard lock(mutex_);
  auto best = entries_.end();
  // Unit vectors stored as floats: the same text may come out a hair under 1.
  constexpr double kRounding = 1e-6;
  double best_similarity = threshold - kRounding;
  for (auto entry = entries_.begin(); entry != entries_.end();) {
    if (now >= entry->expires_at) {
      auto expired = entry++;
      erase(expired);
      continue;
    }
    if (entry->scope == scope && entry->unit_vector.size() == unit_vector.size()) {
      double similarity = cosine_similarity(entry->unit_vector, unit_vector);
      if (similarity >= best_similarity) {
        best = entry;
        best_similarity = similarity;
      }
    }
    ++entry;
  }
  if (best == entries_.end()) return std::nullopt;
  entries_.splice(entries_.begin(), entries_, best);
  return SimilarMatch{best->response, std::min(1.0, best_similarity)};
}

void ResponseCache::store(const Digest& key, std::shared_ptr<const CachedResponse> response,
                          TimePoint now, const Digest& scope, std::vector<float> unit_vector) {
  std::lock_guard lock(mutex_);
  if (auto found = index_.find(key); found != index_.end()) erase(found->second);
  entries_.push_front(Entry{key, std::move(response), now + ttl_, scope, std::move(unit_vector)});
  index_.emplace(key, entries_.begin());
  while (entries_.size() > max_entries_) erase(std::prev(entries_.end()));
}

std::size_t ResponseCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

namespace {

// What decides which answers a model gives: where its requests go.
std::vector<std::string> deployment_signatures(const config::Model& model) {
  std::vector<std::string> signatures;
  for (const auto& deployment : model.deployments) {
    const auto& url = deployment.base_url;
    signatures.push_back(deployment.id + " " + url.scheme + "://" + url.host + ":" +
                         std::to_string(url.port) + url.path_prefix + " " +
                         deployment.upstream_model);
  }
  return signatures;
}

}  // namespace

Caches::Caches(const config::Config& config, const Caches* previous) {
  for (const auto& model : config.models) {
    if (model.cache.mode == config::Cache::Mode::off) continue;
    Slot slot{model.cache, deployment_signatures(model), nullptr};
    if (previous != nullptr) {
      auto old = previous->slots_.find(model.name);
      if (old != previous->slots_.end() && old->second.settings == slot.settings &&
          old->second.deployment_signatures == slot.deployment_signatures) {
        slot.cache = old->second.cache;
      }
    }
    if (!slot.cache) {
      slot.cache = std::make_shared<ResponseCache>(model.cache.max_entries, model.cache.ttl);
    }
    slots_.emplace(model.name, std::move(slot));
  }
}

ResponseCache* Caches::find(const std::string& model) const {
  auto found = slots_.find(model);
  return found == slots_.end() ? nullptr : found->second.cache.get();
}

std::vector<float> unit_vector(std::span<const float> vector) {
  double norm_squared = 0;
  for (float component : vector) norm_squared += double(component) * component;
  if (!(norm_squared > 0) || !std::isfinite(norm_squared)) return {};
  const double scale = 1.0 / std::sqrt(norm_squared);
  std::vector<float> unit(vector.size());
  for (std::size_t i = 0; i < vector.size(); ++i) {
    unit[i] = static_cast<float>(vector[i] * scale);
  }
  return unit;
}

double cosine_similarity(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return 0;
  double dot = 0;
  for (std::size_t i = 0; i < a.size(); ++i) dot += double(a[i]) * b[i];
  return dot;
}

}  // namespace sluice::cache

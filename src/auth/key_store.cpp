#include "sluice/auth/key_store.hpp"

#include <openssl/crypto.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "sluice/common/ascii.hpp"

namespace sluice::auth {
namespace {

bool digest_less(const std::pair<Sha256, std::size_t>& entry, const Sha256& digest) {
  return std::memcmp(entry.first.data(), digest.data(), digest.size()) < 0;
}

std::string_view trim_spaces(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::uint64_t next_store_id() {
  static std::atomic<std::uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace

KeyStore::KeyStore() : id_(next_store_id()) {}

KeyStore::KeyStore(const config::Auth& auth) : id_(next_store_id()) {
  keys_.reserve(auth.keys.size());
  by_digest_.reserve(auth.keys.size());
  for (const config::ApiKey& key : auth.keys) {
    by_digest_.emplace_back(key.key_sha256, keys_.size());
    keys_.push_back({key.name, key.key_sha256, key.models, key.limits});
  }
  std::sort(by_digest_.begin(), by_digest_.end(), [](const auto& a, const auto& b) {
    return std::memcmp(a.first.data(), b.first.data(), a.first.size()) < 0;
  });
}

const KeyPolicy* KeyStore::authenticate(std::string_view presented) const {
  if (presented.empty() || by_digest_.empty()) return nullptr;
  Sha256 digest = sha256(presented);
  auto candidate = std::lower_bound(by_digest_.begin(), by_digest_.end(), digest, digest_less);
  if (candidate == by_digest_.end()) return nullptr;
  if (CRYPTO_memcmp(candidate->first.data(), digest.data(), digest.size()) != 0) return nullptr;
  return &keys_[candidate->second];
}

const KeyPolicy* KeyMemo::authenticate(const KeyStore& store, std::string_view presented) {
  if (store_id_ == store.id() && !presented.empty() && presented.size() == secret_.size() &&
      CRYPTO_memcmp(presented.data(), secret_.data(), presented.size()) == 0) {
    return key_;
  }
  const KeyPolicy* key = store.authenticate(presented);
  forget();
  if (presented.size() <= kLongestSecret) {
    secret_.assign(presented);
    store_id_ = store.id();
    key_ = key;
  }
  return key;
}

void KeyMemo::forget() {
  if (!secret_.empty()) OPENSSL_cleanse(secret_.data(), secret_.size());
  secret_.clear();
  store_id_ = 0;
  key_ = nullptr;
}

bool glob_match(std::string_view pattern, std::string_view text) {
  // Greedy matching with one backtrack point: on a mismatch, let the most
  // recent * swallow one more character. Linear in practice, and at worst
  // pattern.size() * text.size() steps.
  std::size_t p = 0;
  std::size_t t = 0;
  std::size_t star = std::string_view::npos;
  std::size_t star_text = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_text = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++star_text;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool allows_model(const KeyPolicy& key, std::string_view model) {
  if (key.models.empty()) return true;
  return std::any_of(key.models.begin(), key.models.end(),
                     [model](const std::string& pattern) { return glob_match(pattern, model); });
}

std::optional<std::string_view> bearer_token(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer";
  authorization = trim_spaces(authorization);
  if (authorization.size() <= kScheme.size()) return std::nullopt;
  if (!iequals(authorization.substr(0, kScheme.size()), kScheme)) {
    return std::nullopt;
  }
  std::string_view rest = authorization.substr(kScheme.size());
  // "Bearerabc" is a different scheme, not "Bearer abc".
  if (rest.front() != ' ' && rest.front() != '\t') return std::nullopt;
  return plain_key(rest);
}

std::optional<std::string_view> plain_key(std::string_view header_value) {
  std::string_view key = trim_spaces(header_value);
  if (key.empty()) return std::nullopt;
  return key;
}

}  // namespace sluice::auth

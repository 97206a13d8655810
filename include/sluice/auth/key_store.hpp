#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/common/sha256.hpp"
#include "sluice/config/config.hpp"

// Who is calling and what they may ask for. Pure lookups over an immutable
// snapshot: safe from any thread, no locks, no sockets.
namespace sluice::auth {

struct KeyPolicy {
  std::string name;  // what logs and metrics show; never the secret
  Sha256 digest{};
  std::vector<std::string> models;  // globs with * and ?; empty = every model
  config::ApiKeyLimits limits;
};

// The client keys of one config snapshot.
class KeyStore {
 public:
  KeyStore();
  explicit KeyStore(const config::Auth& auth);

  // The key whose secret is `presented`, or nullptr. Hashes the presented
  // secret and looks the digest up; the lookup may take time that depends on
  // the digest (which tells an attacker nothing about any secret), the final
  // equality check is constant-time. An empty secret never matches.
  const KeyPolicy* authenticate(std::string_view presented) const;

  // In config order, so an index into this is stable for one snapshot.
  const std::vector<KeyPolicy>& keys() const { return keys_; }

  // Unique in the process, so that a KeyMemo tells this store from one
  // built later at the same address.
  std::uint64_t id() const { return id_; }

 private:
  std::uint64_t id_;
  std::vector<KeyPolicy> keys_;
  // (digest, index into keys_) sorted by digest, for a binary search.
  std::vector<std::pair<Sha256, std::size_t>> by_digest_;
};

// The secret a client connection presented last and what it was found to
// be, so that the connection's next requests with the same secret skip
// hashing it: SHA-256 is most of what authenticating a request costs. One
// per connection, used on its thread only. The secret stays in memory as
// long as the connection (it came in every request's head anyway) and is
// wiped when replaced or forgotten.
class KeyMemo {
 public:
  // Longer secrets are not remembered.
  static constexpr std::size_t kLongestSecret = 512;

  KeyMemo() = default;
  KeyMemo(const KeyMemo&) = delete;
  KeyMemo& operator=(const KeyMemo&) = delete;
  ~KeyMemo() { forget(); }

  // What store.authenticate(presented) answers. The secret is compared in
  // constant time; a store other than the one remembered (a reload) hashes
  // it again.
  const KeyPolicy* authenticate(const KeyStore& store, std::string_view presented);

  void forget();

 private:
  std::uint64_t store_id_ = 0;  // none
  std::string secret_;
  const KeyPolicy* key_ = nullptr;
};

// Whether `text` matches `pattern`, where * stands for any run of
// characters (also none) and ? for exactly one. Case-sensitive, like model
// names everywhere else. Allocates nothing.
bool glob_match(std::string_view pattern, std::string_view text);

// Whether the key may use the public model name `model`.
bool allows_model(const KeyPolicy& key, std::string_view model);

// The secret a client sent, from the first of these that holds one:
// "Authorization: Bearer <key>" (scheme case-insensitive), "api-key" (the
// Azure SDKs), "x-api-key". Surrounding spaces and tabs are trimmed. An
// Authorization header with another scheme or no token counts as absent,
// so the next header is tried.
std::optional<std::string_view> bearer_token(std::string_view authorization);
std::optional<std::string_view> plain_key(std::string_view header_value);

// `header(name)` returns the value of the named request header, or an empty
// view when there is none; names are passed lower-case. Any callable works,
// so this does not depend on the HTTP library. The returned view points into
// whatever `header` returned.
template <typename HeaderLookup>
requires std::invocable<HeaderLookup&, std::string_view> &&
    std::convertible_to<std::invoke_result_t<HeaderLookup&, std::string_view>, std::string_view>
        std::optional<std::string_view> extract_presented_key(HeaderLookup&& header) {
  if (auto key = bearer_token(header(std::string_view("authorization")))) return key;
  if (auto key = plain_key(header(std::string_view("api-key")))) return key;
  return plain_key(header(std::string_view("x-api-key")));
}

}  // namespace sluice::auth

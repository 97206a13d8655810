#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/sha256.hpp"

// What identifies a cacheable request. Pure functions over the parsed body:
// no sockets, no clock.
namespace sluice::cache {

using Digest = Sha256;

// The endpoints whose answers are cached: complete completions only.
enum class Endpoint { chat, completions };

// "/chat/completions" or "/completions"; nullopt for any other endpoint.
std::optional<Endpoint> cached_endpoint(std::string_view path);

// Fields that never change the answer and so never split the cache: how it
// is delivered (stream, stream_options), who asked (user), and sluice's own
// `cache` flag.
inline constexpr std::string_view kIgnoredFields[] = {"stream", "stream_options", "user", "cache"};

struct RequestKey {
  // The whole normalised request: an exact hit needs this to match.
  Digest exact{};
  // Semantic lookups only: everything but the text of the last user message
  // (earlier turns, system prompt, sampling parameters), so a near question
  // matches only an entry asked in the same conversation with the same
  // parameters.
  Digest scope{};
  // The last user message (chat) or the prompt (completions); "" when the
  // request has none that is text.
  std::string query_text;
  bool has_tools = false;  // tools or functions offered: never answered semantically
};

// Digests of `body` (a parsed JSON object, consumed) for the public model
// `model`. Keys are sorted and whole-number floats written as integers before
// hashing, so `"temperature":0.0` and `"temperature":0` are one request.
// `scope`, `query_text` and `has_tools` are filled only when `semantic`.
RequestKey request_key(nlohmann::json body, std::string_view model, Endpoint endpoint,
                       bool semantic);

}  // namespace sluice::cache

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/errors.hpp"
#include "sluice/common/result.hpp"

namespace sluice {

// What the gateway needs to know of a request body, found in one validating
// pass without building a document: the body is forwarded as it came.
struct RequestBody {
  std::string model;
  bool stream = false;
  std::optional<std::uint64_t> max_tokens;  // max_tokens, max_completion_tokens or max_output_tokens
  bool include_usage = false;               // stream_options.include_usage
  bool has_stream_options = false;
  bool zero_temperature = false;  // temperature is the number 0
  // sluice's own `cache` field, which is never forwarded: present at all,
  // and its value when it is a boolean.
  bool has_cache_field = false;
  std::optional<bool> cache;
};

// Nesting deeper than this is refused: nothing OpenAI accepts comes close,
// and it bounds the work an abusive body can cause.
inline constexpr int kMaxJsonDepth = 64;

// Validates the body (JSON, UTF-8, an object, a string `model`, nesting depth)
// and extracts the fields above; the error is ready to send.
Result<RequestBody, ApiError> inspect_request_body(std::string_view body,
                                                   int max_depth = kMaxJsonDepth);

}  // namespace sluice

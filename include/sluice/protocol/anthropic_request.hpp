#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/result.hpp"
#include "sluice/openai/api_error.hpp"

// OpenAI chat completion requests as Anthropic Messages requests: pure
// functions, so each mapping is testable without a socket.
namespace sluice::protocol::anthropic {

// The Messages API version sent when the deployment names none.
inline constexpr std::string_view kDefaultVersion = "2023-06-01";

// Anthropic requires max_tokens; OpenAI clients often leave it out.
inline constexpr std::uint64_t kDefaultMaxTokens = 4096;

// The thinking budget for an OpenAI `reasoning_effort`: minimal and low
// 1024 (Anthropic's smallest budget), medium 4096, high 16384; nullopt for
// "none" (no thinking). Other efforts are refused by the translation.
std::optional<std::uint64_t> thinking_budget(std::string_view effort);

// The Messages body for an OpenAI chat completion body (whose `model` is
// already the upstream's name). A field or value Anthropic cannot honour is
// refused with a 400 that names it (`param`), rather than dropped: the
// client would otherwise get an answer to a different question.
Result<std::string, ApiError> translate_chat_request(std::string_view openai_body);

}  // namespace sluice::protocol::anthropic

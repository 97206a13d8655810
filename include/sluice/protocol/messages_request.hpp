#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/common/result.hpp"
#include "sluice/openai/api_error.hpp"

// Anthropic Messages requests (POST /v1/messages, from the Anthropic SDK or
// Claude Code) as OpenAI chat completion requests, for a deployment that
// speaks OpenAI's API: pure functions, so each mapping is testable without
// a socket. The reverse of protocol::anthropic's translate_chat_request.
namespace sluice::protocol::messages {

// The reasoning_effort for a thinking budget: up to 1024 tokens "low", up
// to 8192 "medium", more "high". OpenAI has efforts, not budgets; these
// bounds put anthropic::thinking_budget's budgets (1024, 4096, 16384) back
// on the effort they came from.
std::string_view reasoning_effort(std::uint64_t budget_tokens);

// The chat completion body for a Messages body. `model` is copied as it is
// (the gateway puts the upstream's name in later).
//
// Translated: system (a string or text blocks, joined by a blank line) as a
// leading system message; messages, their text, image (base64 or URL),
// tool_use and tool_result blocks (tool results become `tool` messages,
// placed before the rest of their user message); max_tokens (required, as
// Anthropic requires it; sent as max_completion_tokens when thinking asks
// for a reasoning_effort, since OpenAI's reasoning models take no
// max_tokens); stop_sequences as stop; temperature and top_p as they are;
// metadata.user_id as user; thinking as reasoning_effort (see above;
// disabled is no effort); stream, with usage asked for (the answer's
// message_delta carries it); tools, tool_choice and
// disable_parallel_tool_use as parallel_tool_calls false.
//
// Dropped, as changing no answer: cache_control anywhere (OpenAI caches
// prompts by itself), citations of earlier text blocks, and thinking and
// redacted_thinking blocks of earlier assistant turns (OpenAI takes no
// reasoning back, and their signatures mean nothing to it).
//
// Refused with a 400 naming the field (`param`), rather than dropped: a
// field or value OpenAI cannot honour (top_k, server tools, document
// blocks, images in tool results, file image sources, service_tier,
// container, mcp_servers, context_management and any other field not listed
// above). The client would otherwise get an answer to a different question.
// Nothing is copied unread.
Result<std::string, ApiError> translate_messages_request(std::string_view anthropic_body);

}  // namespace sluice::protocol::messages

#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cache/response_cache.hpp"

// Turning upstream answers into cache entries and entries back into answers.
// Pure text in, text out.
namespace sluice::cache {

// A non-streamed 200 body worth keeping: a JSON object with `choices`.
std::optional<CachedResponse> from_json_body(std::string_view body, Endpoint endpoint);

// Assembles a complete SSE stream (chat.completion.chunk or text_completion
// events ending in `data: [DONE]`) into the non-streamed form: content and
// refusal concatenated, tool calls merged by index, role, finish_reason,
// usage, id, model and created kept. nullopt for a stream that broke off,
// carried an error event, or has logprobs (which the merged form would lose).
std::optional<CachedResponse> from_event_stream(std::string_view sse, Endpoint endpoint);

// The entry as a streamed answer: per choice one chunk with the role and the
// whole content (and tool calls), one with the finish_reason, then a usage
// chunk when `include_usage` and the entry has usage, then `data: [DONE]`.
// nullopt when the entry holds a field of a type no answer has.
std::optional<std::string> render_event_stream(const CachedResponse& response, bool include_usage);

// `data[0].embedding` of an embeddings response, scaled to length 1; empty
// when the body has none.
std::vector<float> embedding_from_body(std::string_view body);

}  // namespace sluice::cache

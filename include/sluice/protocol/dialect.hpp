#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/openai/api_error.hpp"
#include "sluice/stream/sse_events.hpp"

// The API a client speaks, told by the endpoint it calls: OpenAI's, or
// Anthropic's Messages API (`/v1/messages`, for Anthropic's SDKs and the
// tools built on them). The gateway words its own answers (errors, a broken
// stream's last event) in the client's dialect, whatever its deployments
// speak.
namespace sluice::protocol {

enum class Dialect : std::uint8_t { openai, anthropic };

// Anthropic's endpoints sluice serves, as they follow "/v1".
inline constexpr std::string_view kMessagesEndpoint = "/messages";
inline constexpr std::string_view kCountTokensEndpoint = "/messages/count_tokens";

// The Messages endpoint a client's path ("/v1/...", no query) asks for.
inline std::optional<std::string_view> messages_endpoint(std::string_view path) {
  if (!path.starts_with("/v1")) return std::nullopt;
  const auto rest = path.substr(3);
  if (rest == kMessagesEndpoint) return kMessagesEndpoint;
  if (rest == kCountTokensEndpoint) return kCountTokensEndpoint;
  return std::nullopt;
}

// The dialect of an endpoint under /v1.
inline Dialect dialect_of(std::string_view endpoint) {
  return endpoint == kMessagesEndpoint || endpoint == kCountTokensEndpoint ? Dialect::anthropic
                                                                           : Dialect::openai;
}

// An error of the gateway's as a body in the client's dialect: OpenAI's
// {"error":{"message","type","param","code"}}, or Anthropic's
// {"type":"error","error":{"type","message"}}.
std::string error_json(Dialect dialect, const ApiError& error);

// How a broken stream's last event is worded for the client.
stream::StreamErrorEvent stream_error_event(Dialect dialect);

}  // namespace sluice::protocol

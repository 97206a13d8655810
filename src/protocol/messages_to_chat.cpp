#include "sluice/protocol/messages_to_chat.hpp"

#include "sluice/protocol/dialect.hpp"
#include "sluice/protocol/messages_request.hpp"

namespace sluice::protocol {

std::optional<ApiError> messages_to_chat(std::string_view provider, upstream::Request& request,
                                         std::string& storage) {
  if (request.target[1] != kMessagesEndpoint) {
    return ApiError::invalid_request("Provider " + std::string(provider) + " does not serve /v1" +
                                         std::string(request.target[1]) +
                                         ": only deployments of provider anthropic do.",
                                     "model", "unsupported_endpoint");
  }
  std::string messages_body;
  for (auto piece : request.body) messages_body.append(piece);
  auto translated = messages::translate_messages_request(messages_body);
  if (!translated) return std::move(translated.error());
  storage = std::move(translated.value());
  request.body = {std::string_view(storage)};
  request.target[1] = "/chat/completions";
  return std::nullopt;
}

}  // namespace sluice::protocol

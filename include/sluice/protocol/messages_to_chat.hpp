#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "sluice/openai/api_error.hpp"
#include "sluice/upstream/exchange.hpp"

namespace sluice::protocol {

// A Messages client's request for an upstream that speaks OpenAI's chat
// completions (provider openai or azure): its body translated into
// `storage`, which the request's body then views, and its endpoint made
// /chat/completions. count_tokens has no OpenAI counterpart: refused with a
// 400 naming `provider`, as is a body that cannot be translated.
std::optional<ApiError> messages_to_chat(std::string_view provider, upstream::Request& request,
                                         std::string& storage);

}  // namespace sluice::protocol

#pragma once

#include <memory>

#include "sluice/config/config.hpp"
#include "sluice/protocol/adapter.hpp"

namespace sluice::protocol {

// `provider: anthropic`: OpenAI chat completions to an upstream that speaks
// Anthropic's Messages API (base_url + /v1/messages), and its answers back.
std::unique_ptr<Adapter> make_anthropic_adapter(const config::Deployment& deployment);

}  // namespace sluice::protocol

#pragma once

#include <memory>

#include "sluice/config/config.hpp"
#include "sluice/protocol/adapter.hpp"

namespace sluice::protocol {

// The identity adapter: requests and answers pass as they are.
std::unique_ptr<Adapter> make_openai_adapter(const config::Deployment& deployment);

}  // namespace sluice::protocol

#pragma once

#include <memory>

#include "sluice/config/config.hpp"
#include "sluice/protocol/adapter.hpp"

namespace sluice::protocol {

// Azure OpenAI's classic deployment API (`provider: azure`): OpenAI's
// requests and answers, sent to
//   base_url/openai/deployments/{model}{endpoint}?api-version={api_version}
// with the key in an `api-key` field instead of `Authorization`. Only the
// request's target and header lines change: the body goes as it is (the
// deployment in the path picks the model), and the answer is spliced
// through untouched.
std::unique_ptr<Adapter> make_azure_adapter(const config::Deployment& deployment);

}  // namespace sluice::protocol

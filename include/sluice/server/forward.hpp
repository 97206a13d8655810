#pragma once

#include <boost/asio/awaitable.hpp>
#include <string>
#include <string_view>

#include "sluice/common/result.hpp"
#include "sluice/config/config.hpp"
#include "sluice/openai/api_error.hpp"
#include "sluice/server/request_context.hpp"

namespace sluice::server {

// A request of sluice's own to `model` (e.g. an embedding for the semantic
// cache), run through the same attempts as a client's (routing, retries,
// failover, cooldowns) over the worker's pool, without hedging. The body is
// `{"model":<upstream name>` followed by `body_after_model`; the answer is
// the 2xx body read whole.
boost::asio::awaitable<Result<std::string, ApiError>> internal_post(
    RequestContext& context, const config::Model& model, std::string_view endpoint,
    std::string_view body_after_model);

}  // namespace sluice::server

#pragma once

#include <boost/asio/awaitable.hpp>
#include <optional>

#include "sluice/server/request_context.hpp"
#include "sluice/server/request_job.hpp"

// The phases of a request, in the order Pipeline::Request runs them, each
// defined in the file of its name. The first three are plain code and write
// nothing to the client: what they turn away or answer themselves, respond
// writes.
namespace sluice::server {

// Path → route, body → model, the model's rules and shaping (resolve.cpp).
Next resolve(RequestContext& context, RequestJob& job);

// The key, its allow-list and its limits; the model lists, which need only
// a key (authorize.cpp).
Next authorize(RequestContext& context, RequestJob& job);

// The key's limits in the shared state backend, when authorize left them
// pending (state.backend redis); the local limits or a 503 while it is away
// (shared_limits.cpp). Returns `next`, or answer_here for a refusal.
boost::asio::awaitable<Next> take_shared_limits(RequestContext& context, RequestJob& job,
                                                Next next);

// The model the rules chose and what shaping changed, made known to the
// client (shape.cpp).
Next shape(RequestContext& context, RequestJob& job);

// A hit in the model's cache, answered; nullopt goes on upstream
// (cache_lookup.cpp). Only for a model with a cache.
boost::asio::awaitable<std::optional<bool>> look_up_cache(RequestContext& context, RequestJob& job);

// The forwarded request, the plan, its attempts and the relay of the
// winner's answer (forward.cpp, attempts.cpp).
boost::asio::awaitable<bool> forward(RequestContext& context, RequestJob& job);

// The gateway's own answers: refusals, /health, the model lists
// (respond.cpp).
boost::asio::awaitable<bool> respond_here(RequestContext& context, RequestJob& job);

// What account settles in the shared backend: the tokens the request
// really spent, and its max_parallel permit (shared_limits.cpp).
void settle_shared_limits(RequestContext& context, RequestJob& job,
                          std::optional<std::uint64_t> tokens_spent);

// Settles the admission, and counts the request in the metrics and the
// access log (account.cpp).
void account(RequestContext& context, RequestJob& job, bool keep);

}  // namespace sluice::server

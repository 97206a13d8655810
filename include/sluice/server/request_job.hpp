#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/auth/stage.hpp"
#include "sluice/server/cache_lookup.hpp"
#include "sluice/server/forwarded_request.hpp"
#include "sluice/server/resolve.hpp"
#include "sluice/server/shared_state.hpp"

// What one request carries from phase to phase, from resolve to account.
namespace sluice::server {

// Whether the request goes on to the next phase, or the gateway answers it
// itself (RequestJob::local_answer says how).
enum class Next { go_on, answer_here };

// An answer of the gateway's own, decided before anything is written.
struct LocalAnswer {
  enum class Kind { refusal, health, model_list, one_model };
  Kind kind = Kind::refusal;
  std::optional<Refusal> refusal;
  std::string model_id;  // one_model: the model described
};

// How the request was answered, for account to settle its admission.
enum class AnsweredBy { gateway, cache, upstream };

struct RequestJob {
  std::optional<std::string_view> presented_key;
  Route route;
  Resolution resolution;  // a proxied request's body, once resolved
  auth::Admission admission;
  // With state.backend redis: the request was admitted by the shared
  // limits (so account settles there), and the permit it holds, if any.
  bool shared_admitted = false;
  std::unique_ptr<SharedLease> shared_lease;  // only ever made with the redis backend
  CacheStep cache_step;
  ForwardingStorage forwarding_storage;
  ForwardedRequest forwarded;
  AnsweredBy answered_by = AnsweredBy::gateway;
  // On the heap: rare, and large for the frame every request allocates.
  std::unique_ptr<LocalAnswer> local_answer;
  std::string with_default_model;  // the body, when it named no model

  Next answer_here(LocalAnswer::Kind kind) {
    local_answer = std::make_unique<LocalAnswer>();
    local_answer->kind = kind;
    return Next::answer_here;
  }
  Next refuse(ApiError error, std::string_view fields = {}) {
    answer_here(LocalAnswer::Kind::refusal);
    local_answer->refusal = Refusal{std::move(error), fields};
    return Next::answer_here;
  }
  Next refuse(Refusal refusal) {
    answer_here(LocalAnswer::Kind::refusal);
    local_answer->refusal = std::move(refusal);
    return Next::answer_here;
  }
};

}  // namespace sluice::server

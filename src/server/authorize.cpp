#include "sluice/server/authorize.hpp"

#include "sluice/server/phases.hpp"

namespace sluice::server {

std::uint64_t tokens_to_reserve(const Resolution& resolution) {
  if (!resolution.goes_upstream()) return 0;
  return auth::estimate_tokens(resolution.text_bytes, resolution.max_tokens);
}

namespace {

// Admits the request as one for `model_name`, and makes the outcome known:
// the rate headers every answer carries, and the key in the access log (a
// 429 is worth little to an operator without knowing whose).
bool admit(RequestContext& context, RequestJob& job, std::string_view model_name,
           std::uint64_t tokens) {
  job.admission = context.snapshot->auth->admit(
      {job.presented_key.value_or(""), model_name, tokens, context.body_read, &context.key_memo});
  job.admission.append_headers(context.response_fields);
  context.key = job.admission.key;
  return job.admission.allowed();
}

}  // namespace

Next authorize(RequestContext& context, RequestJob& job) {
  const auto& route = job.route;
  if (route.kind == Route::Kind::model_list) {
    if (!admit(context, job, {}, 0)) return job.refuse(*job.admission.error);
    return job.answer_here(LocalAnswer::Kind::model_list);
  }
  if (route.kind == Route::Kind::one_model) {
    // One model is admitted as a request for it: a key that may not use it
    // is told the model does not exist, as it is on the proxied paths.
    context.record.model = route.model_id;
    if (!admit(context, job, route.model_id, 0)) return job.refuse(*job.admission.error);
    if (!context.snapshot->config->find_model(route.model_id)) {
      return job.refuse(ApiError::model_not_found(route.model_id));
    }
    job.answer_here(LocalAnswer::Kind::one_model);
    job.local_answer->model_id = route.model_id;
    return Next::answer_here;
  }

  // The key's model check is on the name the client asked for, whatever
  // its rules choose.
  const auto& resolution = job.resolution;
  const auto& model_name = resolution.inspected.model;
  context.record.model = model_name;
  const bool admitted = admit(context, job, model_name, tokens_to_reserve(resolution));
  if (!admitted) return job.refuse(*job.admission.error);
  if (!resolution.requested) return job.refuse(ApiError::model_not_found(model_name));
  context.stream = resolution.inspected.stream;
  return Next::go_on;
}

}  // namespace sluice::server

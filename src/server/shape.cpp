#include "sluice/server/phases.hpp"

namespace sluice::server {

Next shape(RequestContext& context, RequestJob& job) {
  const auto& shaped = job.resolution.shaped;
  if (!shaped) return Next::go_on;
  if (!shaped->target) {
    return job.refuse(ApiError::invalid_request(
        "No rule of model `" + job.resolution.inspected.model + "` matches this request.", "model",
        "no_matching_rule"));
  }
  context.model = shaped->target;
  if (shaped->routed) {
    context.record.routed_to = shaped->target->name;
    context.response_fields.append("x-sluice-model: ").append(shaped->target->name).append("\r\n");
  }
  if (shaped->report.changed()) {
    context.record.shaped = shaped->report.joined();
    context.response_fields.append("x-sluice-shaped: ")
        .append(context.record.shaped)
        .append("\r\n");
  }
  return Next::go_on;
}

}  // namespace sluice::server

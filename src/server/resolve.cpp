#include "sluice/server/resolve.hpp"

#include "sluice/openai/endpoints.hpp"
#include "sluice/openai/multipart_body.hpp"
#include "sluice/server/model_list.hpp"
#include "sluice/server/phases.hpp"

namespace sluice::server {

namespace http = boost::beast::http;
using namespace std::string_view_literals;

namespace {

bool is_get_or_head(http::verb method) {
  return method == http::verb::get || method == http::verb::head;
}

std::optional<Refusal> method_not_allowed(const RequestLine& line, std::string_view path,
                                          std::string_view allowed) {
  return Refusal{ApiError::method_not_allowed(line.method_name, path), allowed};
}

}  // namespace

std::optional<Refusal> route_request(const RequestLine& line, Route& route) {
  const auto query_start = line.target.find('?');
  route.path = line.target.substr(0, query_start);
  if (query_start != std::string_view::npos) route.query = line.target.substr(query_start);
  const auto path = route.path;

  if (path == "/health") {
    if (!is_get_or_head(line.method)) return method_not_allowed(line, path, "Allow: GET, HEAD\r\n");
    route.kind = Route::Kind::health;
    return std::nullopt;
  }
  // GET /v1/models lists the models, GET /v1/models/{model} describes one.
  constexpr std::string_view kModelsPath = "/v1/models";
  if (path.starts_with(kModelsPath) &&
      (path.size() == kModelsPath.size() || path[kModelsPath.size()] == '/')) {
    if (!is_get_or_head(line.method)) return method_not_allowed(line, path, "Allow: GET, HEAD\r\n");
    route.kind = Route::Kind::model_list;
    if (path.size() > kModelsPath.size()) {
      auto name = model_name_from_path(path.substr(kModelsPath.size() + 1));
      if (!name) return Refusal{ApiError::unknown_path(path), {}};
      route.kind = Route::Kind::one_model;
      route.model_id = std::move(*name);
    }
    return std::nullopt;
  }
  auto endpoint = proxied_endpoint(path);
  if (!endpoint) {
    endpoint = protocol::messages_endpoint(path);
    if (!endpoint) return Refusal{ApiError::unknown_path(path), {}};
    route.dialect = protocol::Dialect::anthropic;
  }
  if (line.method != http::verb::post) return method_not_allowed(line, path, "Allow: POST\r\n");
  route.kind = Route::Kind::proxied;
  route.endpoint = *endpoint;
  return std::nullopt;
}

std::optional<ApiError> resolve_body(const config::Config& config, std::string_view endpoint,
                                     std::string_view body, std::string_view content_type,
                                     std::string& storage, Resolution& resolution) {
  const auto form_boundary = form_data_boundary(content_type);
  auto inspect = [&] {
    return form_boundary ? inspect_multipart_body(body, *form_boundary)
                         : inspect_request_body(body);
  };
  auto inspected = inspect();
  if (!inspected && inspected.error().code == "missing_required_parameter" &&
      inspected.error().param == "model") {
    // A body that names no model goes to the endpoint's default model, if
    // one is configured, as if it had named it.
    if (const auto* fallback = config.default_model_for(endpoint)) {
      storage = form_boundary ? with_model_field(body, *form_boundary, fallback->name)
                              : with_model_member(body, fallback->name);
      body = storage;
      inspected = inspect();
    }
  }
  if (!inspected) return std::move(inspected.error());

  resolution.requested = config.find_model(inspected->model);
  resolution.max_tokens = inspected->max_tokens;
  if (resolution.requested && shaping::shapes(*resolution.requested)) {
    // Rules read a JSON request; a form's fields are not read, so its rules
    // see an empty request (no messages, no tools), and nothing is shaped.
    resolution.shaped = shaping::shape_request(config, *resolution.requested, endpoint,
                                               inspected->form_data ? "{}"sv : body);
    if (!resolution.shaped->body.empty()) resolution.max_tokens = resolution.shaped->max_tokens;
  }
  resolution.inspected_body = body;
  resolution.text_bytes =
      inspected->form_data ? inspected->form_text_bytes : resolution.body().size();
  resolution.inspected = std::move(*inspected);
  return std::nullopt;
}

// The phase, as the pipeline runs it.
Next resolve(RequestContext& context, RequestJob& job) {
  const auto& request = context.request;
  if (auto refusal =
          route_request({request.method(), request.method_string(), request.target()}, job.route)) {
    return job.refuse(std::move(*refusal));
  }
  context.dialect = job.route.dialect;
  job.presented_key =
      auth::extract_presented_key([&](std::string_view name) { return request[name]; });
  switch (job.route.kind) {
    case Route::Kind::health:
      return job.answer_here(LocalAnswer::Kind::health);
    case Route::Kind::model_list:
    case Route::Kind::one_model:
      return Next::go_on;
    case Route::Kind::proxied:
      break;
  }
  // A missing key is refused before the body is looked at; an unknown one
  // by authorize.
  const auto& auth = *context.snapshot->auth;
  if (auth.enabled() && !job.presented_key) {
    return job.refuse(*auth.admit({"", "", 0, Clock::now()}).error);
  }
  if (auto refusal = resolve_body(*context.snapshot->config, job.route.endpoint, request.body(),
                                  request.content_type(), job.with_default_model, job.resolution)) {
    return job.refuse(std::move(*refusal));
  }
  context.model = job.resolution.requested;
  return Next::go_on;
}

}  // namespace sluice::server

#include "sluice/openai/api_error.hpp"

#include <nlohmann/json.hpp>

namespace sluice {

std::string ApiError::to_json() const {
  nlohmann::json error = {{"message", message},
                          {"type", type},
                          {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
                          {"code", code.empty() ? nlohmann::json() : nlohmann::json(code)}};
  // A message may quote what the client sent (a path, a model name), which
  // need not be valid UTF-8: such bytes are replaced, never a reason to throw.
  return nlohmann::json{{"error", std::move(error)}}.dump(-1, ' ', false,
                                                          nlohmann::json::error_handler_t::replace);
}

ApiError ApiError::invalid_request(std::string message, std::string param, std::string code) {
  return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

ApiError ApiError::missing_model() {
  return invalid_request("You must provide a model parameter.", "model",
                         "missing_required_parameter");
}

ApiError ApiError::model_not_found(std::string_view model) {
  return {404,
          "The model `" + std::string(model) + "` does not exist or you do not have access to it.",
          "invalid_request_error", "model", "model_not_found"};
}

ApiError ApiError::unknown_path(std::string_view path) {
  return {404, "Unknown request URL: " + std::string(path) + ".", "invalid_request_error", "",
          "unknown_url"};
}

ApiError ApiError::method_not_allowed(std::string_view method, std::string_view path) {
  return {405, "Method " + std::string(method) + " is not allowed for " + std::string(path) + ".",
          "invalid_request_error", "", "method_not_allowed"};
}

ApiError ApiError::body_too_large(std::size_t limit) {
  return {413, "Request body is larger than the limit of " + std::to_string(limit) + " bytes.",
          "invalid_request_error", "", "request_too_large"};
}

ApiError ApiError::headers_too_large() {
  return {431, "Request line or headers are larger than the limit.", "invalid_request_error", "",
          "headers_too_large"};
}

ApiError ApiError::upstream_unreachable(std::string message) {
  return {502, std::move(message), "upstream_error", "", "upstream_unreachable"};
}

ApiError ApiError::upstream_timeout(std::string message) {
  return {504, std::move(message), "upstream_error", "", "upstream_timeout"};
}

ApiError ApiError::overloaded(std::string message) {
  return {503, std::move(message), "server_error", "", "overloaded"};
}

}  // namespace sluice

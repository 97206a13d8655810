#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sluice {

// An error the gateway itself answers with, in OpenAI's shape:
// {"error":{"message":...,"type":...,"param":...,"code":...}}
struct ApiError {
  unsigned status = 500;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null

  std::string to_json() const;

  static ApiError invalid_request(std::string message, std::string param = {},
                                  std::string code = {});
  static ApiError missing_model();
  static ApiError model_not_found(std::string_view model);
  static ApiError unknown_path(std::string_view path);
  static ApiError method_not_allowed(std::string_view method, std::string_view path);
  static ApiError body_too_large(std::size_t limit);
  static ApiError headers_too_large();
  static ApiError upstream_unreachable(std::string message);
  static ApiError upstream_timeout(std::string message);
  static ApiError overloaded(std::string message);
};

}  // namespace sluice

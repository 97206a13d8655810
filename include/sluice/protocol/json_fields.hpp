#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "sluice/openai/api_error.hpp"

// What the protocol translations share: reading fields of a parsed body or
// answer that may be of any shape, writing JSON that never throws, and the
// 400s that refuse a request by naming the field.
namespace sluice::protocol::json_fields {

// The field's value, or null when `object` is no object, or the field is
// absent or null (which both APIs treat as absent).
inline const nlohmann::json* field(const nlohmann::json& object, std::string_view name) {
  if (!object.is_object()) return nullptr;
  auto found = object.find(name);
  if (found == object.end() || found->is_null()) return nullptr;
  return &*found;
}

// A string field's text; "" when it is absent or no string.
inline std::string_view text_field(const nlohmann::json& object, std::string_view name) {
  const auto* value = field(object, name);
  return value && value->is_string() ? std::string_view(value->get_ref<const std::string&>())
                                     : std::string_view();
}

// A count field's value; 0 when it is absent or no unsigned integer.
inline std::uint64_t count_field(const nlohmann::json& object, std::string_view name) {
  const auto* value = field(object, name);
  return value && value->is_number_unsigned() ? value->get<std::uint64_t>() : 0;
}

// Compact JSON that never throws, even for text that is not UTF-8 (parsed
// text always is; text cut from an answer's bytes need not be).
inline std::string dump(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Refuses a request with `param` named: it asks for something the upstream
// cannot do. The message says why.
inline ApiError refused(std::string param, std::string why) {
  return ApiError::invalid_request("`" + param + "` " + why, param, "unsupported_parameter");
}

// Refuses a request whose `param` has a value of the wrong shape.
inline ApiError invalid(std::string param, std::string what) {
  return ApiError::invalid_request("`" + param + "` " + what, param, "invalid_value");
}

}  // namespace sluice::protocol::json_fields

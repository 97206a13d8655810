#pragma once

#include <optional>
#include <string_view>

#include "sluice/common/result.hpp"
#include "sluice/openai/api_error.hpp"
#include "sluice/openai/request_body.hpp"

namespace sluice {

// For a `multipart/form-data` Content-Type (RFC 7578), the boundary it names,
// unquoted, or an empty view when it names no usable one (missing, over 70
// characters); nullopt for any other type.
std::optional<std::string_view> form_data_boundary(std::string_view content_type);

// Validates the framing of a multipart/form-data body (delimiters, one
// form-data Content-Disposition with a field name per part, the closing
// delimiter) and extracts what the gateway needs, as inspect_request_body
// does for JSON: `model` (exactly one such field; a second is refused, since
// the upstream might read the other), its place as `model_value` (the value's
// bytes, nothing around them), `stream` (the field's text is `true`) and
// `form_text_bytes`. The parts' contents, files included, are not looked at: the
// body is forwarded as it came but for the model's value. An empty
// `boundary` (form_data_boundary found none) is refused.
Result<RequestBody, ApiError> inspect_multipart_body(std::string_view body,
                                                     std::string_view boundary);

// `body`, a form inspect_multipart_body refused only for naming no model,
// with a `model` field holding `model` before its first part; the rest as it
// came.
std::string with_model_field(std::string_view body, std::string_view boundary,
                             std::string_view model);

}  // namespace sluice

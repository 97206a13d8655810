#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/json_scan.hpp"
#include "sluice/common/result.hpp"
#include "sluice/openai/api_error.hpp"

namespace sluice {

// What the gateway needs to know of a request body, found in one validating
// pass without building a document: the body is forwarded as it came.
struct RequestBody {
  std::string model;
  bool stream = false;
  std::optional<std::uint64_t>
      max_tokens;              // max_tokens, max_completion_tokens or max_output_tokens
  bool include_usage = false;  // stream_options.include_usage
  bool has_stream_options = false;
  bool zero_temperature = false;  // temperature is the number 0
  // sluice's own `cache` field, which is never forwarded: present at all,
  // and its value when it is a boolean.
  bool has_cache_field = false;
  std::optional<bool> cache;
  // Where the `model` string literal stands in the body (quotes included),
  // for splice_model; absent when the body cannot be spliced in place. For a
  // multipart/form-data body, the field's value, unquoted.
  std::optional<ValueSpan> model_value;
  // multipart/form-data (inspect_multipart_body), not JSON; its bytes that
  // are not files, from which its tokens are estimated.
  bool form_data = false;
  std::size_t form_text_bytes = 0;
};

// Nesting deeper than this is refused: nothing OpenAI accepts comes close,
// and it bounds the work an abusive body can cause.
inline constexpr int kMaxJsonDepth = 64;

// Validates the body (JSON, UTF-8, an object, a string `model`, nesting depth)
// and extracts the fields above; the error is ready to send.
Result<RequestBody, ApiError> inspect_request_body(std::string_view body,
                                                   int max_depth = kMaxJsonDepth);

// `body`, an object inspect_request_body refused only for naming no model,
// with `"model":<model>` as its first member; the rest as it came.
std::string with_model_member(std::string_view body, std::string_view model);

// Whether `text` is one JSON value, by the same checks inspect_request_body
// makes (a strict parser's verdicts: grammar, UTF-8, escapes, numbers) and
// nested at most `max_depth` deep. Builds nothing.
bool is_valid_json(std::string_view text, int max_depth = kMaxJsonDepth);

namespace detail {
// The two ways long strings are read, exposed so that tests and the fuzzer
// can hold each to the same verdicts: sixteen bytes at a time (any x86-64,
// else eight), and sixty-four, used where the processor has AVX2.
enum class StringScan : std::uint8_t { sse2, avx2 };
StringScan best_string_scan();
Result<RequestBody, ApiError> inspect_request_body(std::string_view body, int max_depth,
                                                   StringScan strings);
bool is_valid_json(std::string_view text, int max_depth, StringScan strings);
}  // namespace detail

// A body as forwarded upstream: before_model + the upstream model literal +
// after_model + closing. Members may be added between after_model and closing
// (which starts at the top-level object's closing brace).
struct ModelSplice {
  std::string_view before_model;
  std::string_view after_model;
  std::string_view closing;
};

// Splits a body accepted by inspect_request_body around its `model` value, so
// only that value changes on the way upstream instead of re-serialising a large
// body. When the text cannot be split in place (it starts with a byte order
// mark) the body is parsed and re-serialised into `storage`, which the views
// then point into. `model_value` is RequestBody::model_value when `body` is
// the inspected text itself, which spares a second pass over it.
ModelSplice splice_model(std::string_view body, std::string& storage,
                         std::optional<ValueSpan> model_value = std::nullopt);

}  // namespace sluice

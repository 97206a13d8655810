// libFuzzer entry point for the request body path of the pipeline:
// inspect_request_body, then splice_model with an upstream model put in.
//
// Checked for every body inspect accepts: it is a JSON object whose `model`
// is the string inspect reported; the body forwarded upstream (with and
// without the include_usage member the gateway may add) parses, names the
// upstream model and carries every other member unchanged. A body inspect
// refuses must be one a JSON parser refuses too, or one that breaks the
// gateway's own rules (not an object, no string model, nested too deep).
// Since inspect is a validator of its own, this compares its verdicts with
// nlohmann::json's parser on every input, and those of its two ways of
// reading strings with each other.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/json_scan.hpp"
#include "sluice/openai/request_body.hpp"

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "request body invariant broken: %s\n", what);
  std::abort();
}

void check(bool condition, const char* what) {
  if (!condition) fail(what);
}

// Deeper than kMaxJsonDepth is refused by inspect; the DOM parser below has
// no limit of its own, so measure before handing it a body.
int nesting_depth(const json& value) {
  int deepest = 0;
  if (value.is_structured()) {
    for (const auto& child : value) deepest = std::max(deepest, nesting_depth(child));
    return deepest + 1;
  }
  return 0;
}

// nlohmann stops at a NUL byte as if the input ended there; a raw NUL is
// never valid JSON.
json parse_or_discard(std::string_view text) {
  if (text.find('\0') != std::string_view::npos) return json(json::value_t::discarded);
  return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

void check_forwarded(std::string_view body, const json& document, std::string_view upstream_model,
                     std::optional<sluice::ValueSpan> model_value) {
  std::string storage;
  const auto splice = sluice::splice_model(body, storage, model_value);
  std::string literal;
  sluice::append_json_string(literal, upstream_model);

  json expected = document;
  expected["model"] = upstream_model;
  for (std::string_view addition :
       {std::string_view{}, std::string_view{R"(,"stream_options":{"include_usage":true})"}}) {
    std::string forwarded;
    forwarded.append(splice.before_model).append(literal).append(splice.after_model);
    forwarded.append(addition).append(splice.closing);
    const auto sent = parse_or_discard(forwarded);
    check(!sent.is_discarded(), "the forwarded body is not JSON");
    check(sent.is_object(), "the forwarded body is not an object");
    auto with_addition = expected;
    if (!addition.empty()) with_addition["stream_options"] = {{"include_usage", true}};
    check(sent == with_addition, "the forwarded body differs from the client's but for model");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto inspected = sluice::inspect_request_body(body);
  const auto document = parse_or_discard(body);

  // The sixteen-byte string scan, which processors without AVX2 use, reaches
  // the same verdict and finds the same model where it stands.
  auto narrow = sluice::detail::inspect_request_body(body, sluice::kMaxJsonDepth,
                                                     sluice::detail::StringScan::sse2);
  check(narrow.ok() == inspected.ok(), "the two string scans disagree on a body");
  if (narrow.ok()) {
    check(narrow->model == inspected->model, "the two string scans read another model");
    check(
        narrow->model_value.has_value() == inspected->model_value.has_value() &&
            (!narrow->model_value || (narrow->model_value->begin == inspected->model_value->begin &&
                                      narrow->model_value->end == inspected->model_value->end)),
        "the two string scans place the model differently");
  } else {
    check(narrow.error().code == inspected.error().code,
          "the two string scans refuse a body for different reasons");
  }

  if (!inspected.ok()) {
    check(inspected.error().status == 400, "a refused body must be a 400");
    const auto code = inspected.error().code;
    if (code == "invalid_json") {
      check(document.is_discarded() || nesting_depth(document) > sluice::kMaxJsonDepth,
            "valid JSON within the depth limit refused as invalid_json");
    } else {
      check(!document.is_discarded(), "invalid JSON refused for another reason than invalid_json");
      const auto model = document.is_object() ? document.find("model") : document.end();
      const bool usable = document.is_object() && model != document.end() && model->is_string();
      check(!usable, "an object with a string model was refused");
    }
    return 0;
  }

  check(!document.is_discarded(), "inspect accepted a body a JSON parser refuses");
  check(document.is_object(), "inspect accepted something other than an object");
  check(nesting_depth(document) <= sluice::kMaxJsonDepth,
        "inspect accepted a body nested too deep");
  const auto model = document.find("model");
  check(model != document.end() && model->is_string(), "inspect accepted a body without a model");
  check(model->get_ref<const std::string&>() == inspected->model, "inspect reported another model");
  const auto stream = document.find("stream");
  const bool streams = stream != document.end() && stream->is_boolean() && stream->get<bool>();
  check(inspected->stream == streams, "inspect got `stream` wrong");
  const auto options = document.find("stream_options");
  const bool has_options = options != document.end() && options->is_object();
  check(inspected->has_stream_options == has_options, "inspect got `stream_options` wrong");
  const bool include_usage =
      has_options && options->contains("include_usage") && (*options)["include_usage"] == true;
  check(inspected->include_usage == include_usage, "inspect got `include_usage` wrong");

  const auto temperature = document.find("temperature");
  check(inspected->zero_temperature ==
            (temperature != document.end() && temperature->is_number() && *temperature == 0),
        "inspect got a zero `temperature` wrong");
  const auto cache = document.find("cache");
  check(inspected->has_cache_field == (cache != document.end()), "inspect missed `cache`");
  check(inspected->cache == (cache != document.end() && cache->is_boolean()
                                 ? std::optional<bool>(cache->get<bool>())
                                 : std::nullopt),
        "inspect got `cache` wrong");

  // Spliced where inspect saw the model, and where a search finds it.
  for (auto model_value : {inspected->model_value, std::optional<sluice::ValueSpan>{}}) {
    check_forwarded(body, document, "gpt-4o-mini", model_value);
    check_forwarded(body, document, "odd \"upstream\\name\"\n", model_value);
  }
  return 0;
}

#include "sluice/common/request_body.hpp"

#include <nlohmann/json.hpp>

#include "sluice/common/json_scan.hpp"

namespace sluice {

namespace {

using json = nlohmann::json;

// A SAX handler: validates while it reads, remembers only top-level fields
// (and stream_options.include_usage), and stops at the first problem.
class BodyInspector : public nlohmann::json_sax<json> {
 public:
  explicit BodyInspector(int max_depth) : max_depth_(max_depth) {}

  bool null() override { return value(Kind::other); }
  bool boolean(bool v) override {
    value(Kind::other);
    if (depth_ == 1 && key_ == "stream") body.stream = v;
    if (depth_ == 1 && key_ == "cache") body.cache = v;
    if (depth_ == 2 && in_stream_options_ && key_ == "include_usage") body.include_usage = v;
    return true;
  }
  bool number_integer(number_integer_t v) override {
    if (v >= 0) note_max_tokens(static_cast<std::uint64_t>(v));
    note_temperature(v == 0);
    return value(Kind::number);
  }
  bool number_unsigned(number_unsigned_t v) override {
    note_max_tokens(v);
    note_temperature(v == 0);
    return value(Kind::number);
  }
  bool number_float(number_float_t v, const string_t&) override {
    note_temperature(v == 0);
    return value(Kind::number);
  }
  bool string(string_t& v) override {
    if (depth_ == 1 && key_ == "model") {
      body.model = std::move(v);
      model_is_string = true;
      return true;
    }
    return value(Kind::other);
  }
  bool binary(binary_t&) override { return value(Kind::other); }

  bool start_object(std::size_t) override {
    if (depth_ == 0) top_is_object = true;
    value(Kind::other);
    if (depth_ == 1 && key_ == "stream_options") {
      in_stream_options_ = true;
      body.has_stream_options = true;
    }
    return enter();
  }
  bool end_object() override {
    if (depth_ == 2) in_stream_options_ = false;
    return leave();
  }
  bool start_array(std::size_t) override {
    value(Kind::other);
    return enter();
  }
  bool end_array() override { return leave(); }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      key_ = k;
      if (k == "model") has_model = true;
      if (k == "cache") {
        body.has_cache_field = true;
        body.cache.reset();  // a repeated key: the last value wins
      }
      if (k == "temperature") body.zero_temperature = false;
    } else if (depth_ == 2 && in_stream_options_) {
      key_ = k;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    syntax_error = true;
    return false;
  }

  RequestBody body;
  bool top_is_object = false;
  bool has_model = false;
  bool model_is_string = false;
  bool too_deep = false;
  bool syntax_error = false;

 private:
  enum class Kind { number, other };

  // With a repeated key the last value wins, as in a parsed document: any
  // value first clears what an earlier one under the same key set.
  bool value(Kind) {
    if (depth_ == 1 && key_ == "model") model_is_string = false;
    if (depth_ == 1 && key_ == "stream") body.stream = false;
    if (depth_ == 1 && key_ == "stream_options") {
      body.has_stream_options = false;
      body.include_usage = false;
    }
    if (depth_ == 2 && in_stream_options_ && key_ == "include_usage") body.include_usage = false;
    return true;
  }
  void note_temperature(bool zero) {
    if (depth_ == 1 && key_ == "temperature") body.zero_temperature = zero;
  }
  void note_max_tokens(std::uint64_t v) {
    if (depth_ == 1 && (key_ == "max_tokens" || key_ == "max_completion_tokens" ||
                        key_ == "max_output_tokens")) {
      body.max_tokens = v;
    }
  }
  bool enter() {
    if (++depth_ > max_depth_) {
      too_deep = true;
      return false;
    }
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }

  int max_depth_;
  int depth_ = 0;
  bool in_stream_options_ = false;
  std::string key_;
};

}  // namespace

Result<RequestBody, ApiError> inspect_request_body(std::string_view body, int max_depth) {
  BodyInspector inspector(max_depth);
  bool ok = json::sax_parse(body, &inspector, json::input_format_t::json, /*strict=*/true);
  if (inspector.too_deep) {
    return ApiError::invalid_request("The JSON body is nested more than " +
                                         std::to_string(max_depth) + " levels deep.",
                                     "", "invalid_json");
  }
  // nlohmann reads a NUL byte as the end of the input, so `{..}\0garbage`
  // would pass; a raw NUL is never valid JSON, inside a string or out.
  if (!ok || inspector.syntax_error || body.find('\0') != std::string_view::npos) {
    return ApiError::invalid_request(
        "We could not parse the JSON body of your request. The body must be valid JSON (UTF-8).",
        "", "invalid_json");
  }
  if (!inspector.top_is_object) {
    return ApiError::invalid_request("The request body must be a JSON object.", "",
                                     "invalid_type");
  }
  if (!inspector.has_model) {
    return ApiError::invalid_request("You must provide a model parameter.", "model",
                                     "missing_required_parameter");
  }
  if (!inspector.model_is_string) {
    return ApiError::invalid_request("The model parameter must be a string.", "model",
                                     "invalid_type");
  }
  return std::move(inspector.body);
}

ModelSplice splice_model(std::string_view body, std::string& storage) {
  std::string_view text = body;
  std::size_t model_begin = 0;
  std::size_t model_end = 0;
  if (auto span = find_top_level_value(body, "model")) {
    model_begin = span->begin;
    model_end = span->end;
  } else {
    auto document = json::parse(body);
    document.erase("model");
    storage = document.dump();
    constexpr std::string_view kModelKey = R"("model":)";
    storage.insert(1, kModelKey);
    model_begin = model_end = 1 + kModelKey.size();
    if (storage.size() > model_end + 1) storage.insert(model_end, ",");
    text = storage;
  }
  auto closing = text.rfind('}');
  if (closing == std::string_view::npos || closing < model_end) closing = text.size();
  return {text.substr(0, model_begin), text.substr(model_end, closing - model_end),
          text.substr(closing)};
}

}  // namespace sluice

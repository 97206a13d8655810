// libFuzzer entry point for multipart/form-data uploads: form_data_boundary
// on the input's first line as a Content-Type, then inspect_multipart_body
// on the rest, with that boundary and with a fixed one the seeds use.
//
// Checked for every body inspect accepts: the model is the text at the place
// it reports, that text holds no delimiter, and the body with another model
// spliced in there (as the gateway forwards it) is accepted again with that
// model and every other reading unchanged. Refusals are 400s with the codes
// the gateway documents. A boundary that is found is 1 to 70 bytes of the
// Content-Type itself, without CR or LF.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>

#include "sluice/openai/multipart_body.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "multipart body invariant broken: %s\n", what);
  std::abort();
}

void check(bool condition, const char* what) {
  if (!condition) fail(what);
}

constexpr std::string_view kSeedBoundary = "XyZ";

void check_boundary(std::string_view content_type) {
  const auto boundary = sluice::form_data_boundary(content_type);
  if (!boundary || boundary->empty()) return;
  check(boundary->size() <= 70, "a boundary over 70 bytes was taken");
  check(boundary->find_first_of("\r\n") == std::string_view::npos, "a boundary holds CR or LF");
  const bool inside = std::less_equal<>()(content_type.data(), boundary->data()) &&
                      std::less_equal<>()(boundary->data() + boundary->size(),
                                          content_type.data() + content_type.size());
  check(inside, "the boundary is not a piece of the Content-Type");
}

void check_body(std::string_view body, std::string_view boundary) {
  auto inspected = sluice::inspect_multipart_body(body, boundary);
  if (!inspected.ok()) {
    const auto& error = inspected.error();
    check(error.status == 400, "a refused form must be a 400");
    check(error.code == "invalid_multipart" || error.code == "missing_required_parameter" ||
              error.code == "duplicate_parameter",
          "a form refused with an undocumented code");
    return;
  }
  check(!boundary.empty(), "a form without a boundary was accepted");
  check(inspected->form_data, "an accepted form is not marked as one");
  check(inspected->model_value.has_value(), "an accepted form has no model place");
  const auto span = *inspected->model_value;
  check(span.begin <= span.end && span.end <= body.size(), "the model place is outside the body");
  const auto model = body.substr(span.begin, span.end - span.begin);
  check(model == inspected->model, "the model is not the text at its place");
  const std::string delimiter = "\r\n--" + std::string(boundary);
  check(model.find(delimiter) == std::string_view::npos, "the model holds a delimiter");
  check(inspected->form_text_bytes <= body.size(), "more text than body");

  // The gateway's splice: only the model's bytes change.
  constexpr std::string_view kUpstreamModel = "upstream/model-1";
  std::string forwarded(body.substr(0, span.begin));
  forwarded.append(kUpstreamModel).append(body.substr(span.end));
  auto again = sluice::inspect_multipart_body(forwarded, boundary);
  check(again.ok(), "the forwarded form is refused");
  check(again->model == kUpstreamModel, "the forwarded form names another model");
  check(again->stream == inspected->stream, "the forwarded form streams differently");
  // The model's bytes count as text unless its part is a file.
  const auto text_bytes = inspected->form_text_bytes;
  check(again->form_text_bytes == text_bytes - model.size() + kUpstreamModel.size() ||
            again->form_text_bytes == text_bytes,
        "the forwarded form holds other text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto line_end = input.find('\n');
  const auto content_type = input.substr(0, line_end);
  const auto body =
      line_end == std::string_view::npos ? std::string_view() : input.substr(line_end + 1);
  check_boundary(content_type);
  if (const auto boundary = sluice::form_data_boundary(content_type)) check_body(body, *boundary);
  check_body(body, kSeedBoundary);
  return 0;
}

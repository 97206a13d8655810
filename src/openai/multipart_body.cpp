#include "sluice/openai/multipart_body.hpp"

#include <cstring>
#include <functional>
#include <string>

#include "sluice/common/ascii.hpp"

namespace sluice {

namespace {

// RFC 2046 §5.1.1: a boundary is 1 to 70 characters.
constexpr std::size_t kMaxBoundary = 70;

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trim_blanks(std::string_view text) {
  while (!text.empty() && is_blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_blank(text.back())) text.remove_suffix(1);
  return text;
}

// A media type or disposition type, and the parameters after it.
struct TypeAndParameters {
  std::string_view type;
  std::string_view parameters;
};

TypeAndParameters split_type(std::string_view value) {
  const auto semicolon = value.find(';');
  if (semicolon == std::string_view::npos) return {trim_blanks(value), {}};
  return {trim_blanks(value.substr(0, semicolon)), value.substr(semicolon + 1)};
}

// Calls visit(name, value) for every `name=value` parameter of a header value
// (RFC 9110 §5.6.6), the value a token or a quoted string, unquoted. The
// value's view lasts for the call only: it is a view of `text` unless the
// quoted string held escapes. False when the text is malformed.
template <class Visit>
bool for_each_parameter(std::string_view text, Visit&& visit) {
  std::string unquoted;
  std::size_t at = 0;
  auto skip_blanks = [&] {
    while (at < text.size() && is_blank(text[at])) ++at;
  };
  for (;;) {
    skip_blanks();
    if (at == text.size()) return true;
    if (text[at] == ';') {
      ++at;
      continue;
    }
    const std::size_t name_begin = at;
    while (at < text.size() && text[at] != '=' && text[at] != ';' && !is_blank(text[at])) ++at;
    const auto name = text.substr(name_begin, at - name_begin);
    skip_blanks();
    if (name.empty() || at == text.size() || text[at] != '=') return false;
    ++at;
    skip_blanks();
    if (at < text.size() && text[at] == '"') {
      ++at;
      const std::size_t value_begin = at;
      unquoted.clear();
      bool closed = false;
      bool escaped = false;
      while (at < text.size()) {
        char c = text[at++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\') {
          if (at == text.size()) return false;
          c = text[at++];
          escaped = true;
        }
        unquoted.push_back(c);
      }
      if (!closed) return false;
      // Without escapes the value is the text between the quotes.
      visit(name,
            escaped ? std::string_view(unquoted) : text.substr(value_begin, at - 1 - value_begin));
    } else {
      const std::size_t value_begin = at;
      while (at < text.size() && text[at] != ';' && !is_blank(text[at])) ++at;
      visit(name, text.substr(value_begin, at - value_begin));
    }
    skip_blanks();
    if (at < text.size() && text[at] != ';') return false;
  }
}

std::size_t find_bytes(std::string_view haystack, std::string_view needle, std::size_t from) {
  // An empty view may have no data at all, which memmem must not be given.
  if (from > haystack.size() || haystack.size() - from < needle.size()) {
    return std::string_view::npos;
  }
  const void* found =
      ::memmem(haystack.data() + from, haystack.size() - from, needle.data(), needle.size());
  if (!found) return std::string_view::npos;
  return static_cast<std::size_t>(static_cast<const char*>(found) - haystack.data());
}

ApiError malformed(std::string_view what) {
  return ApiError::invalid_request(
      "We could not parse the multipart/form-data body of your request: " + std::string(what) + ".",
      "", "invalid_multipart");
}

// What a part's head says about it: the field it holds, and whether that
// is a file.
struct PartHead {
  std::string field;
  bool has_field = false;
  bool is_file = false;
};

// Reads a part's head: field lines, each ending in CRLF.
std::optional<PartHead> read_part_head(std::string_view head) {
  PartHead part;
  bool has_disposition = false;
  while (!head.empty()) {
    const auto line_end = head.find("\r\n");
    const auto line = head.substr(0, line_end);
    head.remove_prefix(line_end + 2);
    const auto colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos) return std::nullopt;
    if (!iequals(line.substr(0, colon), "Content-Disposition")) continue;
    if (has_disposition) return std::nullopt;
    has_disposition = true;
    const auto [type, parameters] = split_type(line.substr(colon + 1));
    if (!iequals(type, "form-data")) return std::nullopt;
    const bool well_formed =
        for_each_parameter(parameters, [&](std::string_view name, std::string_view value) {
          if (iequals(name, "name")) {
            part.field = value;
            part.has_field = true;
          } else if (iequals(name, "filename") || iequals(name, "filename*")) {
            part.is_file = true;
          }
        });
    if (!well_formed) return std::nullopt;
  }
  if (!part.has_field) return std::nullopt;
  return part;
}

}  // namespace

std::optional<std::string_view> form_data_boundary(std::string_view content_type) {
  // Every JSON request asks this: its "application/json" is ruled out by
  // its length.
  constexpr std::string_view kFormData = "multipart/form-data";
  if (content_type.size() < kFormData.size()) return std::nullopt;
  const auto [type, parameters] = split_type(content_type);
  if (!iequals(type, kFormData)) return std::nullopt;
  std::string_view boundary;
  const bool well_formed =
      for_each_parameter(parameters, [&](std::string_view name, std::string_view value) {
        // A boundary that needed escapes (no client writes one) is not taken.
        const bool in_place = std::less_equal<>()(content_type.data(), value.data()) &&
                              std::less_equal<>()(value.data() + value.size(),
                                                  content_type.data() + content_type.size());
        if (iequals(name, "boundary") && boundary.empty() && in_place) boundary = value;
      });
  if (!well_formed || boundary.size() > kMaxBoundary ||
      boundary.find_first_of("\r\n") != std::string_view::npos) {
    return std::string_view();
  }
  return boundary;
}

Result<RequestBody, ApiError> inspect_multipart_body(std::string_view body,
                                                     std::string_view boundary) {
  if (boundary.empty()) return malformed("its Content-Type names no boundary");
  // Every delimiter but a first one at the very start is CRLF "--" boundary.
  std::string delimiter;
  delimiter.reserve(4 + boundary.size());
  delimiter.append("\r\n--").append(boundary);
  const auto dash_boundary = std::string_view(delimiter).substr(2);

  std::size_t at = 0;
  if (body.starts_with(dash_boundary)) {
    at = dash_boundary.size();
  } else {
    at = find_bytes(body, delimiter, 0);
    if (at == std::string_view::npos) {
      return malformed("no part starts with the boundary its Content-Type names");
    }
    at += delimiter.size();
  }

  RequestBody inspected;
  inspected.form_data = true;
  bool has_model = false;
  for (;;) {
    if (body.substr(at).starts_with("--")) break;  // the closing delimiter
    while (at < body.size() && is_blank(body[at])) ++at;
    if (!body.substr(at).starts_with("\r\n")) return malformed("a boundary line does not end");
    at += 2;
    const auto head_end = find_bytes(body, "\r\n\r\n", at);
    if (body.substr(at).starts_with("\r\n") || head_end == std::string_view::npos) {
      return malformed("a part has no head with a Content-Disposition");
    }
    const auto part = read_part_head(body.substr(at, head_end + 2 - at));
    if (!part)
      return malformed("a part's head is not a form-data Content-Disposition naming a field");
    const std::size_t content_begin = head_end + 4;
    const auto content_end = find_bytes(body, delimiter, content_begin);
    if (content_end == std::string_view::npos) {
      return malformed("the body ends before its closing boundary");
    }
    const auto content = body.substr(content_begin, content_end - content_begin);
    if (part->field == "model") {
      if (has_model) {
        return ApiError::invalid_request("The model parameter is given more than once.", "model",
                                         "duplicate_parameter");
      }
      has_model = true;
      inspected.model = content;
      inspected.model_value = ValueSpan{content_begin, content_end};
    } else if (part->field == "stream") {
      inspected.stream = content == "true";
    }
    if (!part->is_file) inspected.form_text_bytes += content.size();
    at = content_end + delimiter.size();
  }
  if (!has_model) return ApiError::missing_model();
  return inspected;
}

std::string with_model_field(std::string_view body, std::string_view boundary,
                             std::string_view model) {
  // The new part goes where the first one starts, after any preamble.
  const std::string dash_boundary = "--" + std::string(boundary);
  const std::size_t first_part =
      body.starts_with(dash_boundary) ? 0 : find_bytes(body, "\r\n" + dash_boundary, 0) + 2;
  std::string text;
  text.reserve(body.size() + dash_boundary.size() + model.size() + 64);
  text.append(body.substr(0, first_part)).append(dash_boundary);
  text.append("\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n");
  text.append(model).append("\r\n").append(body.substr(first_part));
  return text;
}

}  // namespace sluice

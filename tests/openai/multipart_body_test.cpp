// multipart/form-data bodies: the boundary from the Content-Type, the
// framing, and the fields the gateway reads (model, stream, text size).
#include "sluice/openai/multipart_body.hpp"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

using namespace std::string_literals;

constexpr std::string_view kBoundary = "----form7MA4YWxkTrZu0gW";

// A part as clients write it; `filename` makes it a file.
std::string part(std::string_view field, std::string_view content, std::string_view filename = {}) {
  std::string text = "--"s.append(kBoundary) + "\r\nContent-Disposition: form-data; name=\"";
  text.append(field).append("\"");
  if (!filename.empty()) {
    text.append("; filename=\"").append(filename).append("\"\r\nContent-Type: audio/wav");
  }
  text.append("\r\n\r\n").append(content).append("\r\n");
  return text;
}

std::string closing() { return "--"s.append(kBoundary) + "--\r\n"; }

TEST(FormDataBoundary, IsReadFromTheContentType) {
  EXPECT_EQ(form_data_boundary("multipart/form-data; boundary=abc"), "abc");
  EXPECT_EQ(form_data_boundary("Multipart/Form-Data;BOUNDARY=abc"), "abc");
  EXPECT_EQ(form_data_boundary("multipart/form-data; charset=utf-8; boundary=\"a b:c\""), "a b:c");
  EXPECT_EQ(form_data_boundary("multipart/form-data ; boundary=abc ; x=y"), "abc");
}

TEST(FormDataBoundary, OtherTypesAreNotForms) {
  EXPECT_EQ(form_data_boundary("application/json"), std::nullopt);
  EXPECT_EQ(form_data_boundary(""), std::nullopt);
  EXPECT_EQ(form_data_boundary("multipart/mixed; boundary=abc"), std::nullopt);
  EXPECT_EQ(form_data_boundary("multipart/form-datax; boundary=abc"), std::nullopt);
}

TEST(FormDataBoundary, AFormWithoutAUsableBoundaryHasAnEmptyOne) {
  for (std::string_view type :
       {"multipart/form-data", "multipart/form-data; boundary=",
        "multipart/form-data; boundary=\"\"", "multipart/form-data; boundary=\"unclosed",
        "multipart/form-data; boundary", "multipart/form-data; boundary=\"esc\\\"aped\""}) {
    auto boundary = form_data_boundary(type);
    ASSERT_TRUE(boundary.has_value()) << type;
    EXPECT_EQ(*boundary, "") << type;
  }
  const std::string seventy(70, 'b');
  EXPECT_EQ(form_data_boundary("multipart/form-data; boundary=" + seventy), seventy);
  EXPECT_EQ(form_data_boundary("multipart/form-data; boundary=" + seventy + "b"), "");
}

TEST(MultipartBody, ReadsTheModelItsPlaceTheStreamFlagAndTheTextSize) {
  const std::string audio = "RIFF\r\n--not-the-boundary\r\n\0\xff"s;
  const std::string body = part("file", audio, "a.wav") + part("model", "whisper") +
                           part("language", "en") + part("stream", "true") + closing();
  auto inspected = inspect_multipart_body(body, kBoundary);
  ASSERT_TRUE(inspected.ok()) << inspected.error().message;
  EXPECT_TRUE(inspected->form_data);
  EXPECT_EQ(inspected->model, "whisper");
  ASSERT_TRUE(inspected->model_value.has_value());
  const auto span = *inspected->model_value;
  EXPECT_EQ(body.substr(span.begin, span.end - span.begin), "whisper");
  EXPECT_TRUE(inspected->stream);
  // The file's bytes are not text: "whisper", "en", "true".
  EXPECT_EQ(inspected->form_text_bytes, 7u + 2u + 4u);
}

TEST(MultipartBody, StreamIsOnlyTheTextTrue) {
  for (std::string_view value : {"false", "True", "1", ""}) {
    const std::string body = part("model", "m") + part("stream", value) + closing();
    auto inspected = inspect_multipart_body(body, kBoundary);
    ASSERT_TRUE(inspected.ok()) << value;
    EXPECT_FALSE(inspected->stream) << value;
  }
}

TEST(MultipartBody, PreambleTransportPaddingAndEpilogueAreAllowed) {
  std::string body = "This is a preamble.\r\n" + part("model", "m");
  // Blanks between the boundary and the end of its line (RFC 2046).
  body.insert(body.find(kBoundary) + kBoundary.size(), " \t");
  body += closing() + "an epilogue";
  auto inspected = inspect_multipart_body(body, kBoundary);
  ASSERT_TRUE(inspected.ok()) << inspected.error().message;
  EXPECT_EQ(inspected->model, "m");
}

TEST(MultipartBody, AnEmptyModelValueIsKeptInPlace) {
  const std::string body = part("model", "") + closing();
  auto inspected = inspect_multipart_body(body, kBoundary);
  ASSERT_TRUE(inspected.ok());
  EXPECT_EQ(inspected->model, "");
  EXPECT_EQ(inspected->model_value->begin, inspected->model_value->end);
  EXPECT_EQ(body.substr(inspected->model_value->end, 2), "\r\n");
}

TEST(MultipartBody, FilenameStarMarksAFileToo) {
  std::string file_part = part("prompt_file", "long text");
  file_part.insert(file_part.find("\r\n\r\n"), "; filename*=UTF-8''a.txt");
  auto inspected = inspect_multipart_body(part("model", "m") + file_part + closing(), kBoundary);
  ASSERT_TRUE(inspected.ok()) << inspected.error().message;
  EXPECT_EQ(inspected->form_text_bytes, 1u);
}

TEST(MultipartBody, FieldNamesAreQuotedStringsAndCaseMatters) {
  std::string escaped = part("x", "m");
  escaped.replace(escaped.find("name=\"x\""), 8, "name=\"mo\\del\"");
  auto inspected = inspect_multipart_body(escaped + closing(), kBoundary);
  ASSERT_TRUE(inspected.ok()) << inspected.error().message;
  EXPECT_EQ(inspected->model, "m");

  auto upper = inspect_multipart_body(part("Model", "m") + closing(), kBoundary);
  ASSERT_FALSE(upper.ok());
  EXPECT_EQ(upper.error().code, "missing_required_parameter");
}

TEST(MultipartBody, AModelGivenTwiceIsRefused) {
  // The upstream might read the other one than the gateway routed by.
  auto inspected = inspect_multipart_body(
      part("model", "allowed") + part("file", "x", "a.wav") + part("model", "other") + closing(),
      kBoundary);
  ASSERT_FALSE(inspected.ok());
  EXPECT_EQ(inspected.error().status, 400u);
  EXPECT_EQ(inspected.error().param, "model");
  EXPECT_EQ(inspected.error().code, "duplicate_parameter");
}

TEST(MultipartBody, NoModelIsTheMissingParameterError) {
  auto inspected = inspect_multipart_body(part("file", "x", "a.wav") + closing(), kBoundary);
  ASSERT_FALSE(inspected.ok());
  EXPECT_EQ(inspected.error().code, "missing_required_parameter");
  EXPECT_EQ(inspected.error().param, "model");
}

TEST(MultipartBody, BrokenFramingIsRefusedAsInvalidMultipart) {
  const std::string whole = part("model", "m") + closing();
  const std::string no_disposition =
      "--"s.append(kBoundary) + "\r\nContent-Type: text/plain\r\n\r\nm\r\n" + closing();
  const std::string no_head = "--"s.append(kBoundary) + "\r\n\r\nm\r\n" + closing();
  std::string not_form_data = whole;
  not_form_data.replace(not_form_data.find("form-data"), 9, "attachment");
  std::string no_name = whole;
  no_name.replace(no_name.find("name=\"model\""), 12, "x=\"model\"");
  std::string two_dispositions = whole;
  two_dispositions.insert(two_dispositions.find("\r\n\r\n"),
                          "\r\nContent-Disposition: form-data; name=\"model\"");
  std::string not_a_field_line = whole;
  not_a_field_line.insert(not_a_field_line.find("\r\n\r\n"), "\r\nno colon here");
  std::string unclosed_quote = whole;
  unclosed_quote.replace(unclosed_quote.find("\"model\""), 7, "\"model");
  std::string boundary_line_goes_on = whole;
  boundary_line_goes_on.insert(kBoundary.size() + 2, "x");

  const std::pair<std::string, std::string> cases[] = {
      {"", "empty"},
      {"no boundary anywhere", "no boundary"},
      {whole.substr(0, whole.size() - closing().size()), "no closing delimiter"},
      {whole.substr(0, whole.find("\r\n\r\n") + 2), "head does not end"},
      {no_disposition, "no Content-Disposition"},
      {no_head, "no head"},
      {not_form_data, "not form-data"},
      {no_name, "no field name"},
      {two_dispositions, "two dispositions"},
      {not_a_field_line, "a head line without a colon"},
      {unclosed_quote, "an unclosed quoted string"},
      {boundary_line_goes_on, "a boundary line that goes on"},
  };
  for (const auto& [body, what] : cases) {
    auto inspected = inspect_multipart_body(body, kBoundary);
    ASSERT_FALSE(inspected.ok()) << what;
    EXPECT_EQ(inspected.error().status, 400u) << what;
    EXPECT_EQ(inspected.error().code, "invalid_multipart") << what;
    EXPECT_NE(inspected.error().message.find("multipart/form-data"), std::string::npos) << what;
  }
  auto no_boundary = inspect_multipart_body(whole, "");
  ASSERT_FALSE(no_boundary.ok());
  EXPECT_EQ(no_boundary.error().code, "invalid_multipart");
  EXPECT_NE(no_boundary.error().message.find("no boundary"), std::string::npos);
}

TEST(MultipartBody, TheBoundaryCountsOnlyAtTheStartOfALine) {
  // A delimiter is CRLF "--" boundary: the same text inside a line is content.
  const std::string inside = "a --"s.append(kBoundary) + " b";
  auto inspected = inspect_multipart_body(part("model", inside) + closing(), kBoundary);
  ASSERT_TRUE(inspected.ok()) << inspected.error().message;
  EXPECT_EQ(inspected->model, inside);
}

TEST(MultipartBody, AModelFieldIsAddedBeforeTheFirstPart) {
  const std::string file = part("file", "RIFF\r\n\0", "a.wav");
  for (const std::string preamble : {"", "a preamble\r\n"}) {
    const std::string body = preamble + file + closing();
    const std::string added = with_model_field(body, kBoundary, "whisper-default");
    EXPECT_EQ(added, preamble + part("model", "whisper-default") + file + closing());
    auto inspected = inspect_multipart_body(added, kBoundary);
    ASSERT_TRUE(inspected.ok()) << inspected.error().message;
    EXPECT_EQ(inspected->model, "whisper-default");
  }
}

}  // namespace
}  // namespace sluice

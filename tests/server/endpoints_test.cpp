// The OpenAI endpoints beyond text generation, through the gateway to
// sluice-mock: moderations, images and audio, with JSON bodies and with
// multipart/form-data uploads.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "support/gateway_fixture.hpp"
#include "support/http_client.hpp"

namespace sluice::testing {
namespace {

using nlohmann::json;
using namespace std::string_literals;

constexpr std::string_view kBoundary = "sluice-test-boundary-0123456789";

std::string form_content_type() { return "multipart/form-data; boundary="s.append(kBoundary); }

// Audio bytes that hold what a careless parser would trip on: CR, LF, NUL,
// bytes over 0x7f, and the boundary itself, though not after a CRLF.
std::string awkward_audio(std::size_t size) {
  std::string bytes = "RIFF\r\n\0\xff--"s.append(kBoundary) + "\r\n\r\n";
  for (std::size_t i = 0; bytes.size() < size; ++i) bytes.push_back(static_cast<char>(i * 131));
  return bytes;
}

// A form as the SDKs send one: the file first, then the text fields.
std::string form(const std::string& model, const std::string& audio,
                 const std::string& extra_field = "language") {
  const std::string delimiter = "--"s.append(kBoundary) + "\r\n";
  std::string body = delimiter;
  body += "Content-Disposition: form-data; name=\"file\"; filename=\"speech.wav\"\r\n";
  body += "Content-Type: audio/wav\r\n\r\n" + audio + "\r\n";
  body += delimiter + "Content-Disposition: form-data; name=\"model\"\r\n\r\n" + model + "\r\n";
  body += delimiter + "Content-Disposition: form-data; name=\"" + extra_field + "\"\r\n\r\nen\r\n";
  body += "--"s.append(kBoundary) + "--\r\n";
  return body;
}

// The same with a `stream` field of "true" instead of the language.
std::string streaming_form(const std::string& model, const std::string& audio) {
  std::string body = form(model, audio, "stream");
  constexpr std::string_view kValue = "\r\n\r\nen\r\n";
  return body.replace(body.rfind(kValue), kValue.size(), "\r\n\r\ntrue\r\n");
}

Headers form_headers(Headers headers = {}) {
  headers.emplace_back("Content-Type", form_content_type());
  return headers;
}

std::string models_yaml(const std::string& base_url) {
  return "models:\n  - name: whisper\n    deployments:\n" + deployment_yaml("w1", base_url) +
         "  - name: studio\n    deployments:\n" + deployment_yaml("s1", base_url);
}

class Endpoints : public ::testing::Test {
 protected:
  void SetUp() override { upstream_ = start_mock(); }
  std::unique_ptr<mock::MockServer> upstream_;
};

TEST_F(Endpoints, JsonBodiesAreProxiedWithTheirModelRewritten) {
  TestGateway gateway(models_yaml(upstream_->base_url()));
  const std::pair<std::string, std::string> requests[] = {
      {"/v1/moderations", R"({"model":"studio","input":"is this fine?"})"},
      {"/v1/images/generations", R"({"model":"studio","prompt":"a lighthouse","n":1})"},
  };
  for (const auto& [path, body] : requests) {
    auto response = http_request(gateway.port(), "POST", path, body);
    ASSERT_EQ(response.status, 200u) << path << ": " << response.body;
    EXPECT_EQ(response.header("x-sluice-deployment"), "s1") << path;
    const auto sent = upstream_->recent_requests().back();
    EXPECT_EQ(sent.target, path) << path;
    auto forwarded = json::parse(sent.body);
    EXPECT_EQ(forwarded["model"], "mock-model") << path;
    forwarded["model"] = "studio";
    EXPECT_EQ(forwarded, json::parse(body)) << path;
  }
  auto moderation = json::parse(
      http_request(gateway.port(), "POST", "/v1/moderations", R"({"model":"studio","input":"x"})")
          .body);
  EXPECT_EQ(moderation["results"][0]["flagged"], false);
}

TEST_F(Endpoints, SpeechComesBackAsTheUpstreamsAudioBytes) {
  TestGateway gateway(models_yaml(upstream_->base_url()));
  auto response = http_request(gateway.port(), "POST", "/v1/audio/speech",
                               R"({"model":"studio","input":"Hello","voice":"alloy"})");
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("content-type"), "audio/mpeg");
  // The mock's audio: 64 bytes per token (8 by default), "ID3" first, then
  // every byte value in turn, CR, LF and NUL among them.
  ASSERT_EQ(response.body.size(), 512u);
  EXPECT_EQ(response.body.substr(0, 3), "ID3");
  EXPECT_EQ(response.header("content-length"), "512");
  EXPECT_NE(response.body.find('\0'), std::string::npos);
}

TEST_F(Endpoints, AFormIsForwardedByteForByteButForItsModel) {
  TestGateway gateway(models_yaml(upstream_->base_url()));
  const std::string audio = awkward_audio(std::size_t{200} * 1024);
  const std::string body = form("whisper", audio);
  for (std::string path : {"/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/edits",
                           "/v1/images/variations"}) {
    auto response = http_request(gateway.port(), "POST", path, body, form_headers());
    ASSERT_EQ(response.status, 200u) << path << ": " << response.body;
    EXPECT_EQ(response.header("x-sluice-deployment"), "w1") << path;
    const auto sent = upstream_->recent_requests().back();
    EXPECT_EQ(sent.target, path);
    EXPECT_EQ(sent.header("content-type"), form_content_type()) << path;
    EXPECT_EQ(sent.body, form("mock-model", audio)) << path;
  }
  auto transcript = json::parse(
      http_request(gateway.port(), "POST", "/v1/audio/transcriptions", body, form_headers()).body);
  EXPECT_EQ(transcript["text"].get<std::string>().substr(0, 10), "tok0 tok1 ");
}

TEST_F(Endpoints, AStreamedTranscriptionIsRelayedEventByEvent) {
  TestGateway gateway(models_yaml(upstream_->base_url()));
  auto response = http_request(gateway.port(), "POST", "/v1/audio/transcriptions",
                               form("whisper", awkward_audio(1024), "stream"), form_headers());
  // form() sets the extra field to "en": not a stream.
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("content-type"), "application/json");

  const std::string streamed = streaming_form("whisper", awkward_audio(1024));
  response =
      http_request(gateway.port(), "POST", "/v1/audio/transcriptions", streamed, form_headers());
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("content-type").substr(0, 17), "text/event-stream");
  EXPECT_EQ(response.header("transfer-encoding"), "chunked");
  const auto events = sse_data(response.body);
  ASSERT_EQ(events.size(), 9u);  // 8 deltas, then the whole text
  EXPECT_EQ(json::parse(events[0])["delta"], "tok0 ");
  const auto done = json::parse(events.back());
  EXPECT_EQ(done["type"], "transcript.text.done");
  EXPECT_EQ(done["text"].get<std::string>().substr(0, 10), "tok0 tok1 ");
  EXPECT_EQ(done["usage"]["type"], "tokens");
  EXPECT_EQ(done["usage"]["output_tokens"], 8);
}

TEST_F(Endpoints, AStreamedTranscriptionCutUpstreamEndsWithAnErrorEvent) {
  mock::Behaviour cut;
  cut.fail = "reset-mid";
  auto broken = start_mock(cut);
  TestGateway gateway("models:\n  - name: whisper\n    deployments:\n" +
                      deployment_yaml("w1", broken->base_url()));
  const std::string streamed = streaming_form("whisper", awkward_audio(1024));
  auto response =
      http_request(gateway.port(), "POST", "/v1/audio/transcriptions", streamed, form_headers());
  ASSERT_EQ(response.status, 200u) << response.body;
  const auto events = sse_data(response.body);
  ASSERT_FALSE(events.empty());
  // Never a clean end: the last event is the gateway's error.
  const auto last = json::parse(events.back());
  ASSERT_TRUE(last.contains("error")) << events.back();
  EXPECT_EQ(last["error"]["code"], "stream_interrupted");
}

TEST_F(Endpoints, AFailedAttemptSendsTheSameFormToTheNextDeployment) {
  mock::Behaviour failing;
  failing.fail = "500";
  auto broken = start_mock(failing);
  TestGateway gateway(
      "router:\n  retries: 1\n  backoff: {base: 1ms, max: 1ms}\n"
      "models:\n  - name: whisper\n    strategy: priority\n    deployments:\n" +
      deployment_yaml("broken", broken->base_url()) +
      deployment_yaml("healthy", upstream_->base_url()));
  const std::string audio = awkward_audio(std::size_t{64} * 1024);
  auto response = http_request(gateway.port(), "POST", "/v1/audio/transcriptions",
                               form("whisper", audio), form_headers());
  ASSERT_EQ(response.status, 200u) << response.body;
  EXPECT_EQ(response.header("x-sluice-deployment"), "healthy");
  EXPECT_EQ(response.header("x-sluice-attempts"), "2");
  ASSERT_EQ(broken->recent_requests().size(), 1u);
  EXPECT_EQ(broken->recent_requests().back().body, form("mock-model", audio));
  EXPECT_EQ(upstream_->recent_requests().back().body, form("mock-model", audio));
}

TEST_F(Endpoints, AFormsFilesDoNotCountAgainstAKeysTokens) {
  constexpr std::string_view kKey = "sk-endpoints-team-0123456789";
  TestGateway gateway("auth:\n  keys:\n    - name: team\n      key: "s.append(kKey) +
                      "\n      tpm: 1000\n" + models_yaml(upstream_->base_url()));
  // A request is admitted while the key owes less than a minute's tokens,
  // and charged its estimate: a token per four bytes of text, plus the
  // completion's. 64 KiB of text is 16k tokens; 64 KiB of file is none.
  const Headers key = bearer(std::string(kKey));
  const std::string file_form = form("whisper", awkward_audio(std::size_t{64} * 1024));
  for (int i = 0; i < 3; ++i) {
    auto as_file = http_request(gateway.port(), "POST", "/v1/audio/transcriptions", file_form,
                                form_headers(key));
    ASSERT_EQ(as_file.status, 200u) << i << ": " << as_file.body;
  }
  const std::string large_text(std::size_t{64} * 1024, 'a');
  auto as_text = http_request(gateway.port(), "POST", "/v1/moderations",
                              R"({"model":"studio","input":")" + large_text + "\"}", key);
  ASSERT_EQ(as_text.status, 200u) << as_text.body;
  auto after_text = http_request(gateway.port(), "POST", "/v1/audio/transcriptions", file_form,
                                 form_headers(key));
  EXPECT_EQ(after_text.status, 429u) << after_text.body;
}

TEST_F(Endpoints, ShapingIsForTextGenerationOnly) {
  TestGateway gateway(
      "models:\n  - name: studio\n    shaping:\n      defaults: {max_tokens: 77}\n"
      "    deployments:\n" +
      deployment_yaml("s1", upstream_->base_url()));
  auto image = http_request(gateway.port(), "POST", "/v1/images/generations",
                            R"({"model":"studio","prompt":"a lighthouse"})");
  ASSERT_EQ(image.status, 200u) << image.body;
  EXPECT_FALSE(image.has_header("x-sluice-shaped"));
  EXPECT_FALSE(json::parse(upstream_->recent_requests().back().body).contains("max_tokens"));
  auto chat =
      http_request(gateway.port(), "POST", "/v1/chat/completions", chat_body("studio", false));
  ASSERT_EQ(chat.status, 200u) << chat.body;
  EXPECT_EQ(json::parse(upstream_->recent_requests().back().body)["max_tokens"], 77);
}

TEST_F(Endpoints, RulesSeeAFormAsARequestWithoutMessages) {
  auto other = start_mock();
  TestGateway gateway("models:\n  - name: small\n    deployments:\n" +
                      deployment_yaml("small-1", other->base_url()) +
                      "  - name: whisper\n    deployments:\n" +
                      deployment_yaml("w1", upstream_->base_url()) +
                      "  - name: auto\n    rules:\n"
                      "      - {when: {contains_any: [en]}, model: small}\n"
                      "      - {model: whisper}\n");
  auto response = http_request(gateway.port(), "POST", "/v1/audio/transcriptions",
                               form("auto", awkward_audio(1024)), form_headers());
  ASSERT_EQ(response.status, 200u) << response.body;
  // The form's "en" is not a message: the last rule takes it.
  EXPECT_EQ(response.header("x-sluice-model"), "whisper");
  EXPECT_EQ(response.header("x-sluice-deployment"), "w1");
  EXPECT_EQ(other->stats().requests, 0u);
}

// A form without a model field: the file, then the language.
std::string form_without_model(const std::string& audio) {
  std::string body = form("unused", audio);
  const auto model_part =
      body.find("--"s.append(kBoundary) + "\r\nContent-Disposition: form-data; name=\"model\"");
  const auto next_part = body.find("--"s.append(kBoundary), model_part + 2);
  return body.erase(model_part, next_part - model_part);
}

TEST_F(Endpoints, ARequestWithoutAModelGoesToItsEndpointsDefault) {
  auto other = start_mock();
  constexpr std::string_view kKey = "sk-endpoints-whisper-only-0123";
  TestGateway gateway(
      "auth:\n  keys:\n    - name: open\n      key: sk-endpoints-open-0123456789\n"
      "    - name: whisper-only\n      key: "s.append(kKey) +
      "\n      models: [whisper]\n"
      "models:\n  - name: whisper\n    deployments:\n" +
      deployment_yaml("w1", other->base_url()) +
      "  - name: studio\n    default_for: [/v1/moderations, /v1/images/edits]\n"
      "    deployments:\n" +
      deployment_yaml("s1", upstream_->base_url()));
  const Headers key = bearer("sk-endpoints-open-0123456789");

  auto moderation =
      http_request(gateway.port(), "POST", "/v1/moderations", R"({"input":"is this fine?"})", key);
  ASSERT_EQ(moderation.status, 200u) << moderation.body;
  EXPECT_EQ(moderation.header("x-sluice-deployment"), "s1");
  EXPECT_EQ(upstream_->recent_requests().back().body,
            R"({"model":"mock-model","input":"is this fine?"})");

  const std::string audio = awkward_audio(4096);
  auto edit = http_request(gateway.port(), "POST", "/v1/images/edits", form_without_model(audio),
                           form_headers(key));
  ASSERT_EQ(edit.status, 200u) << edit.body;
  EXPECT_EQ(edit.header("x-sluice-deployment"), "s1");
  // The model field is added before the first part; the rest is as sent.
  const std::string model_part = "--"s.append(kBoundary) +
                                 "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
                                 "mock-model\r\n";
  EXPECT_EQ(upstream_->recent_requests().back().body, model_part + form_without_model(audio));

  // No default for transcriptions; a named model is used as named.
  auto transcription = http_request(gateway.port(), "POST", "/v1/audio/transcriptions",
                                    form_without_model(audio), form_headers(key));
  EXPECT_EQ(transcription.status, 400u);
  EXPECT_EQ(json::parse(transcription.body)["error"]["code"], "missing_required_parameter");
  auto named = http_request(gateway.port(), "POST", "/v1/moderations",
                            R"({"model":"whisper","input":"x"})", key);
  EXPECT_EQ(named.header("x-sluice-deployment"), "w1");

  // The default model is held to the key's models like a named one.
  auto not_allowed = http_request(gateway.port(), "POST", "/v1/moderations", R"({"input":"x"})",
                                  bearer(std::string(kKey)));
  EXPECT_EQ(not_allowed.status, 404u);
  EXPECT_EQ(json::parse(not_allowed.body)["error"]["code"], "model_not_found");
}

TEST_F(Endpoints, BrokenFormsAreRefusedBeforeTheUpstream) {
  TestGateway gateway(models_yaml(upstream_->base_url()));
  std::string two_models = form("whisper", "x", "model");
  std::string unterminated = form("whisper", "x");
  unterminated.resize(unterminated.size() - 10);
  const std::tuple<std::string, Headers, std::string> cases[] = {
      {two_models, form_headers(), "duplicate_parameter"},
      {unterminated, form_headers(), "invalid_multipart"},
      {form("whisper", "x"), {{"Content-Type", "multipart/form-data"}}, "invalid_multipart"},
      {form("whisper", "x"), {}, "invalid_json"},  // sent as application/json
  };
  for (const auto& [body, headers, code] : cases) {
    auto response = http_request(gateway.port(), "POST", "/v1/audio/transcriptions", body, headers);
    EXPECT_EQ(response.status, 400u) << code;
    auto error = json::parse(response.body)["error"];
    EXPECT_EQ(error["code"], code);
    EXPECT_EQ(error["type"], "invalid_request_error");
  }
  EXPECT_EQ(upstream_->stats().requests, 0u);
}

}  // namespace
}  // namespace sluice::testing

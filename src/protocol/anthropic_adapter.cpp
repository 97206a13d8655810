#include "sluice/protocol/anthropic_adapter.hpp"

#include <chrono>

#include "sluice/common/ascii.hpp"
#include "sluice/http/http_head.hpp"
#include "sluice/protocol/anthropic_answer.hpp"
#include "sluice/protocol/anthropic_request.hpp"

namespace sluice::protocol {

namespace {

using namespace std::string_view_literals;

// Client header lines that must never reach Anthropic: credentials (the
// client's own key is withheld already, see is_withheld_from_upstream;
// dropped again here so no change there can leak one to another vendor).
bool is_credential(std::string_view name) {
  for (auto credential : {"authorization"sv, "x-api-key"sv, "api-key"sv}) {
    if (iequals(name, credential)) return true;
  }
  return false;
}

// A translated request also drops the lines the adapter sets itself, which
// would otherwise go twice.
bool replaced_by_translation(std::string_view name) {
  return is_credential(name) || iequals(name, "anthropic-version"sv) ||
         iequals(name, "content-type"sv);
}

bool has_line(std::string_view lines, std::string_view name) {
  bool found = false;
  for_each_field_line(lines,
                      [&](const FieldLine& field) { found = found || iequals(field.name, name); });
  return found;
}

class AnthropicAdapter final : public Adapter {
 public:
  explicit AnthropicAdapter(const config::Deployment& deployment) {
    // The deployment's own headers, then the ones the Messages API needs:
    // its key goes in x-api-key, never as a bearer token.
    for (const auto& [name, value] : deployment.headers) {
      key_fields_.append(name).append(": ").append(value).append("\r\n");
    }
    if (!deployment.api_key.empty()) {
      key_fields_.append("x-api-key: ").append(deployment.api_key).append("\r\n");
    }
    versioned_fields_ = key_fields_;
    versioned_fields_.append("anthropic-version: ")
        .append(deployment.anthropic_version.empty() ? anthropic::kDefaultVersion
                                                     : deployment.anthropic_version)
        .append("\r\n");
    translated_fields_ = versioned_fields_ + "content-type: application/json\r\n";
  }

  bool passes_through(Dialect /*client*/) const override { return false; }

  std::optional<ApiError> adapt_request(upstream::Request& request,
                                        std::string& storage) const override {
    if (dialect_of(request.target[1]) == Dialect::anthropic) {
      return pass_through(request, storage);
    }
    if (request.target[1] != "/chat/completions") {
      return ApiError::invalid_request(
          "Provider anthropic serves /v1/chat/completions only, not /v1" +
              std::string(request.target[1]) + ".",
          "model", "unsupported_endpoint");
    }
    std::string openai_body;
    for (auto piece : request.body) openai_body.append(piece);
    auto translated = anthropic::translate_chat_request(openai_body);
    if (!translated) return std::move(translated.error());

    // The body and the client's kept lines share the attempt's storage:
    // both are written before either is pointed at.
    std::string kept;
    const auto client_lines = lines_without(request.fields[0], kept, replaced_by_translation);
    storage = std::move(translated.value());
    const auto body_size = storage.size();
    storage.append(kept);
    const std::string_view stored(storage);
    request.body = {stored.substr(0, body_size)};
    if (client_lines.size() != request.fields[0].size())
      request.fields[0] = stored.substr(body_size);
    request.fields[2] = translated_fields_;
    // The Messages API takes no query of OpenAI's (an api-version, say).
    request.target = {request.target[0], "/v1/messages"sv, {}};
    return std::nullopt;
  }

  std::unique_ptr<stream::AnswerTranslator> translate_answer(Dialect client) const override {
    if (client == Dialect::anthropic) return nullptr;
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    return std::make_unique<anthropic::AnswerTranslator>(
        std::chrono::duration_cast<std::chrono::seconds>(now).count());
  }

 private:
  // A Messages client's request, as it came but for its model (spliced in
  // already) and the key: its anthropic-version and anthropic-beta lines,
  // its query (`?beta=true`) and its body go as they are.
  std::optional<ApiError> pass_through(upstream::Request& request, std::string& storage) const {
    const auto client_lines = request.fields[0];
    request.fields[0] = lines_without(client_lines, storage, is_credential);
    request.fields[2] =
        has_line(client_lines, "anthropic-version"sv) ? key_fields_ : versioned_fields_;
    request.target[1] =
        request.target[1] == kMessagesEndpoint ? "/v1/messages"sv : "/v1/messages/count_tokens"sv;
    return std::nullopt;
  }

  std::string key_fields_;         // the deployment's headers and key
  std::string versioned_fields_;   // ... and the anthropic-version it sends
  std::string translated_fields_;  // ... and the content type of a translated body
};

}  // namespace

std::unique_ptr<Adapter> make_anthropic_adapter(const config::Deployment& deployment) {
  return std::make_unique<AnthropicAdapter>(deployment);
}

}  // namespace sluice::protocol

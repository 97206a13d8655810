#include "sluice/protocol/anthropic_adapter.hpp"

#include <chrono>

#include "sluice/common/ascii.hpp"
#include "sluice/protocol/anthropic_answer.hpp"
#include "sluice/protocol/anthropic_request.hpp"

namespace sluice::protocol {

namespace {

using namespace std::string_view_literals;

// Client header lines that must not reach Anthropic: credentials (the
// client's own key is withheld already, see is_withheld_from_upstream;
// dropped again here so no change there can leak one to another vendor),
// and the lines this adapter sets itself, which would otherwise go twice.
bool replaced_by_adapter(std::string_view name) {
  for (auto own :
       {"authorization"sv, "x-api-key"sv, "api-key"sv, "anthropic-version"sv, "content-type"sv}) {
    if (iequals(name, own)) return true;
  }
  return false;
}

// Appends the client's lines that may go on, and says whether any did not.
bool append_kept_lines(std::string_view lines, std::string& kept) {
  bool dropped = false;
  while (!lines.empty()) {
    const auto end = lines.find('\n');
    const auto line = lines.substr(0, end == std::string_view::npos ? lines.size() : end + 1);
    lines.remove_prefix(line.size());
    if (replaced_by_adapter(line.substr(0, line.find(':')))) {
      dropped = true;
    } else {
      kept.append(line);
    }
  }
  return dropped;
}

class AnthropicAdapter final : public Adapter {
 public:
  explicit AnthropicAdapter(const config::Deployment& deployment) {
    // The deployment's own headers, then the ones the Messages API needs:
    // its key goes in x-api-key, never as a bearer token.
    for (const auto& [name, value] : deployment.headers) {
      fields_.append(name).append(": ").append(value).append("\r\n");
    }
    if (!deployment.api_key.empty()) {
      fields_.append("x-api-key: ").append(deployment.api_key).append("\r\n");
    }
    fields_.append("anthropic-version: ")
        .append(deployment.anthropic_version.empty() ? anthropic::kDefaultVersion
                                                     : deployment.anthropic_version)
        .append("\r\n");
    fields_.append("content-type: application/json\r\n");
  }

  bool passes_through() const override { return false; }

  std::optional<ApiError> adapt_request(upstream::Request& request,
                                        std::string& storage) const override {
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
    storage = std::move(translated.value());
    const auto body_size = storage.size();
    const bool dropped = append_kept_lines(request.fields[0], storage);
    const std::string_view stored(storage);
    request.body = {stored.substr(0, body_size)};
    if (dropped) request.fields[0] = stored.substr(body_size);
    request.fields[2] = fields_;
    // The Messages API takes no query of OpenAI's (an api-version, say).
    request.target = {request.target[0], "/v1/messages"sv, {}};
    return std::nullopt;
  }

  std::unique_ptr<stream::AnswerTranslator> translate_answer() const override {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    return std::make_unique<anthropic::AnswerTranslator>(
        std::chrono::duration_cast<std::chrono::seconds>(now).count());
  }

 private:
  std::string fields_;
};

}  // namespace

std::unique_ptr<Adapter> make_anthropic_adapter(const config::Deployment& deployment) {
  return std::make_unique<AnthropicAdapter>(deployment);
}

}  // namespace sluice::protocol

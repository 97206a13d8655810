#include "sluice/protocol/azure_adapter.hpp"

#include <string_view>

#include "sluice/common/ascii.hpp"
#include "sluice/protocol/messages_answer.hpp"
#include "sluice/protocol/messages_to_chat.hpp"

namespace sluice::protocol {

namespace {

// Characters a path segment may carry as they are (RFC 3986's unreserved);
// anything else in a deployment's name is percent-encoded, so that a '/',
// '?' or space in it cannot change where the request goes.
bool is_unreserved(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

std::string escaped_path_segment(std::string_view text) {
  constexpr std::string_view kHexDigits = "0123456789ABCDEF";
  std::string escaped;
  escaped.reserve(text.size());
  for (const char c : text) {
    if (is_unreserved(c)) {
      escaped.push_back(c);
      continue;
    }
    const auto byte = static_cast<unsigned char>(c);
    escaped.push_back('%');
    escaped.push_back(kHexDigits[byte >> 4]);
    escaped.push_back(kHexDigits[byte & 0xF]);
  }
  return escaped;
}

class AzureAdapter final : public Adapter {
 public:
  explicit AzureAdapter(const config::Deployment& deployment)
      : path_prefix_(deployment.base_url.path_prefix + "/openai/deployments/" +
                     escaped_path_segment(deployment.upstream_model)),
        api_version_query_("?api-version=" + deployment.api_version),
        fields_(fields_of(deployment)) {}

  bool passes_through(Dialect /*client*/) const override { return false; }

  // Everything but the client's query is the deployment's, made once: a
  // request without a query costs no copy at all.
  std::optional<ApiError> adapt_request(upstream::Request& request,
                                        std::string& storage) const override {
    const bool translated = dialect_of(request.target[1]) == Dialect::anthropic;
    if (translated) {
      if (auto refusal = messages_to_chat("azure", request, storage)) return refusal;
    }
    const std::string_view client_query = request.target[2];
    request.target[0] = path_prefix_;
    // target[1], the endpoint under /v1 ("/chat/completions"), stays.
    if (client_query.size() > 1) {
      // The client's "?a=b" follows the API version as "&a=b", after a
      // translated body if the storage holds one (views into it are taken
      // once it has stopped growing).
      const auto body_size = translated ? storage.size() : 0;
      if (!translated) storage.clear();
      storage.append(api_version_query_).append("&").append(client_query.substr(1));
      const std::string_view stored(storage);
      if (translated) request.body = {stored.substr(0, body_size)};
      request.target[2] = stored.substr(body_size);
    } else {
      request.target[2] = api_version_query_;
    }
    request.fields[2] = fields_;
    return std::nullopt;
  }

  std::unique_ptr<stream::AnswerTranslator> translate_answer(Dialect client) const override {
    if (client == Dialect::openai) return nullptr;
    return std::make_unique<messages::AnswerTranslator>();
  }

 private:
  // The deployment's own header lines, as Snapshot::build writes them for
  // OpenAI, but with the key as Azure takes it. A configured `api-key`
  // header (a key kept somewhere else) is the one sent.
  static std::string fields_of(const config::Deployment& deployment) {
    std::string fields;
    bool configures_api_key = false;
    for (const auto& [name, value] : deployment.headers) {
      fields.append(name).append(": ").append(value).append("\r\n");
      configures_api_key = configures_api_key || iequals(name, "api-key");
    }
    if (!deployment.api_key.empty() && !configures_api_key) {
      fields.append("api-key: ").append(deployment.api_key).append("\r\n");
    }
    return fields;
  }

  const std::string path_prefix_;        // base_url's path + /openai/deployments/{model}
  const std::string api_version_query_;  // "?api-version=2024-10-21"
  const std::string fields_;
};

}  // namespace

std::unique_ptr<Adapter> make_azure_adapter(const config::Deployment& deployment) {
  return std::make_unique<AzureAdapter>(deployment);
}

}  // namespace sluice::protocol

#include "sluice/protocol/openai_adapter.hpp"

#include "sluice/protocol/messages_answer.hpp"
#include "sluice/protocol/messages_to_chat.hpp"

namespace sluice::protocol {

namespace {

// An upstream that speaks OpenAI's API: an OpenAI client's requests and
// answers pass as they are; a Messages client's are translated.
class OpenAiAdapter final : public Adapter {
 public:
  bool passes_through(Dialect client) const override { return client == Dialect::openai; }
  std::optional<ApiError> adapt_request(upstream::Request& request,
                                        std::string& storage) const override {
    if (dialect_of(request.target[1]) == Dialect::openai) return std::nullopt;
    return messages_to_chat("openai", request, storage);
  }
  std::unique_ptr<stream::AnswerTranslator> translate_answer(Dialect client) const override {
    if (client == Dialect::openai) return nullptr;
    return std::make_unique<messages::AnswerTranslator>();
  }
};

}  // namespace

std::unique_ptr<Adapter> make_openai_adapter(const config::Deployment& /*deployment*/) {
  return std::make_unique<OpenAiAdapter>();
}

}  // namespace sluice::protocol

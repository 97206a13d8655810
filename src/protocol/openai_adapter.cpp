#include "sluice/protocol/openai_adapter.hpp"

namespace sluice::protocol {

namespace {

// An upstream that speaks OpenAI's API, as the client does.
class OpenAiAdapter final : public Adapter {
 public:
  bool passes_through() const override { return true; }
  std::optional<ApiError> adapt_request(upstream::Request& /*request*/,
                                        std::string& /*storage*/) const override {
    return std::nullopt;
  }
  std::unique_ptr<stream::AnswerTranslator> translate_answer() const override { return nullptr; }
};

}  // namespace

std::unique_ptr<Adapter> make_openai_adapter(const config::Deployment& /*deployment*/) {
  return std::make_unique<OpenAiAdapter>();
}

}  // namespace sluice::protocol

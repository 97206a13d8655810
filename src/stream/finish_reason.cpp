#include "sluice/stream/finish_reason.hpp"

namespace sluice::stream {
namespace {

constexpr std::string_view kKey = R"("finish_reason")";
constexpr std::string_view kLength = "length";

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

}  // namespace

void FinishReasonWatch::feed(std::string_view bytes) {
  for (std::size_t at = 0; at < bytes.size(); ++at) {
    const char c = bytes[at];
    switch (stage_) {
      case Stage::key:
        if (matched_ == 0) {
          // Nothing begun: only a quote can begin the key.
          at = bytes.find('"', at);
          if (at == std::string_view::npos) return;
          matched_ = 1;
        } else if (c == kKey[matched_]) {
          if (++matched_ == kKey.size()) {
            stage_ = Stage::colon;
            matched_ = 0;
          }
        } else {
          // The key's one quote-prefix is its first byte.
          matched_ = c == '"' ? 1 : 0;
        }
        break;
      case Stage::colon:
        // Anything but a colon: the spelling was a value, not a key.
        if (c == ':') {
          stage_ = Stage::value;
        } else if (!is_json_space(c)) {
          stage_ = Stage::key;
          matched_ = c == '"' ? 1 : 0;
        }
        break;
      case Stage::value:
        if (is_json_space(c)) break;
        if (c == '"') {
          stage_ = Stage::reason;
          reason_is_length_ = true;
        } else {
          stage_ = Stage::key;  // null
        }
        break;
      case Stage::reason:
        if (c == '"') {
          if (matched_ > 0) saw_reason_ = true;
          if (reason_is_length_ && matched_ == kLength.size()) saw_length_ = true;
          stage_ = Stage::key;
          matched_ = 0;
        } else {
          if (matched_ >= kLength.size() || c != kLength[matched_]) reason_is_length_ = false;
          if (matched_ < UINT8_MAX) ++matched_;
        }
        break;
    }
  }
}

}  // namespace sluice::stream

#pragma once

#include <cstdint>
#include <string_view>

namespace sluice::stream {

// Follows the `"finish_reason"` keys of an OpenAI answer (a JSON body or a
// stream's events) across the reads it arrives in, wherever a read splits a
// key or its value. A quote inside a JSON string is escaped, so the key's
// quoted spelling matches keys only, never text the model wrote.
class FinishReasonWatch {
 public:
  void feed(std::string_view bytes);

  // A finish_reason other than null (or "") went by.
  bool saw_reason() const { return saw_reason_; }
  // One of them was "length": the answer stopped at its token limit.
  bool saw_length() const { return saw_length_; }

 private:
  enum class Stage : std::uint8_t { key, colon, value, reason };
  Stage stage_ = Stage::key;
  // Bytes of the quoted key matched so far, or of the reason read so far.
  std::uint8_t matched_ = 0;
  bool reason_is_length_ = true;
  bool saw_reason_ = false;
  bool saw_length_ = false;
};

}  // namespace sluice::stream

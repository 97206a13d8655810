#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "sluice/config/config.hpp"

// The quality guard: an answer that came back fast because it came back
// badly counts as a failure of its deployment (cooldown, error rate), so
// that it loses traffic instead of winning it on latency. It only informs
// routing: the client's answer is never changed.
namespace sluice::router {

enum class QualityFailure { none, truncated, empty, length_early, stalled, slow_tokens };

std::string_view to_string(QualityFailure failure);

// What the relay learnt of one successful answer of an OpenAI chat or text
// completion (the only answers whose end and usage are known in one shape).
struct AnswerFacts {
  bool stream = false;
  bool complete = false;                           // the upstream body was read to its end
  bool stalled = false;                            // ended by the stall (idle) deadline
  bool saw_done = false;                           // a stream's `data: [DONE]`
  bool saw_finish_reason = false;                  // a non-null finish_reason
  bool json_ends_object = true;                    // a JSON body's last byte closes its object
  std::optional<std::uint64_t> completion_tokens;  // from the usage, when reported
  bool finish_length = false;                      // finish_reason "length"
  std::optional<std::uint64_t> max_tokens;         // the request's, if it set one
  // First body byte to the body's end.
  std::chrono::microseconds streaming_time{0};
};

// The first failure that `facts` show, or none. `slow_tokens` is checked only
// when the policy sets min_tokens_per_second.
QualityFailure judge_answer(const AnswerFacts& facts, const config::Quality& policy);

}  // namespace sluice::router

#include "sluice/router/quality.hpp"

namespace sluice::router {

std::string_view to_string(QualityFailure failure) {
  switch (failure) {
    case QualityFailure::none:
      return "none";
    case QualityFailure::truncated:
      return "truncated";
    case QualityFailure::empty:
      return "empty";
    case QualityFailure::length_early:
      return "length_early";
    case QualityFailure::stalled:
      return "stalled";
    case QualityFailure::slow_tokens:
      return "slow_tokens";
  }
  return "none";
}

QualityFailure judge_answer(const AnswerFacts& facts, const config::Quality& policy) {
  if (facts.stalled) return QualityFailure::stalled;
  // Other breaks (reset, cut connection) are failures of their own already.
  if (!facts.complete) return QualityFailure::none;
  // A stream ends with its choice's finish_reason and then [DONE]; a clean
  // end that misses either was cut short.
  if (facts.stream ? !(facts.saw_done && facts.saw_finish_reason) : !facts.json_ends_object) {
    return QualityFailure::truncated;
  }
  if (facts.completion_tokens && *facts.completion_tokens == 0) return QualityFailure::empty;
  // Stopped "by length" well short of the length asked for: the upstream
  // cut the answer, not the client's limit.
  if (facts.finish_length && facts.max_tokens && facts.completion_tokens &&
      static_cast<double>(*facts.completion_tokens) <
          0.9 * static_cast<double>(*facts.max_tokens)) {
    return QualityFailure::length_early;
  }
  if (policy.min_tokens_per_second > 0 && facts.stream && facts.completion_tokens &&
      facts.streaming_time.count() > 0) {
    const double seconds = std::chrono::duration<double>(facts.streaming_time).count();
    // One token says nothing of a rate.
    if (*facts.completion_tokens > 1 &&
        static_cast<double>(*facts.completion_tokens) / seconds < policy.min_tokens_per_second) {
      return QualityFailure::slow_tokens;
    }
  }
  return QualityFailure::none;
}

}  // namespace sluice::router

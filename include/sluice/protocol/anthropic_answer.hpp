#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "sluice/stream/answer_translator.hpp"

// Anthropic Messages answers as OpenAI chat completion answers: a whole
// message, an error body, and an event stream translated one event at a
// time. Pure but for the translator's small state, so testable without a
// socket.
namespace sluice::protocol::anthropic {

// OpenAI's finish_reason for an Anthropic stop_reason ("stop" for
// end_turn, stop_sequence and pause_turn or anything unknown).
std::string_view finish_reason(std::string_view stop_reason);

// A whole Messages answer as a `chat.completion` made at `created` (Unix
// seconds); an Anthropic error body as OpenAI's error shape. Anything else
// becomes an OpenAI error saying the answer was not understood, and
// `understood` (if given) is set false.
std::string translate_answer_body(std::string_view anthropic_body, std::int64_t created,
                                  bool* understood = nullptr);

// An Anthropic error body ({"type":"error","error":{"type","message"}}) as
// OpenAI's ({"error":{"message","type","param","code"}}); a body that is no
// such JSON becomes a server_error quoting its start.
std::string translate_error_body(std::string_view anthropic_body);

// A Messages event stream as chat.completion.chunk events, each written as
// soon as the upstream's event that makes it arrives.
class EventTranslator {
 public:
  explicit EventTranslator(std::int64_t created) : created_(created) {}

  // One whole upstream event (its lines, without the blank line after).
  void event(std::string_view upstream_event, std::string& out);
  // The upstream's stream ended: nothing when it ended as it should (with
  // message_stop, or an error event), else an error event, never a
  // clean end the upstream did not send.
  void end_of_events(std::string& out);

 private:
  void on_message_start(const nlohmann::json& message, std::string& out);
  void take_usage(const nlohmann::json& usage);
  void append_chunk(const nlohmann::json& delta, std::string_view finish_reason,
                    std::string& out) const;
  void append_usage_chunk(std::string& out) const;

  std::int64_t created_;
  std::string id_;
  std::string model_;
  // Anthropic's content block index -> the OpenAI tool_calls index of the
  // tool_use block there.
  std::map<std::int64_t, unsigned> tool_indexes_;
  unsigned tool_blocks_ = 0;
  std::uint64_t input_tokens_ = 0;
  std::uint64_t cache_read_tokens_ = 0;
  std::uint64_t cache_creation_tokens_ = 0;
  std::uint64_t output_tokens_ = 0;
  bool finished_ = false;  // [DONE] or an error event was sent
};

// The AnswerTranslator a deployment's relay uses: bodies and events as
// above, made at the time of the answer.
class AnswerTranslator final : public stream::AnswerTranslator {
 public:
  explicit AnswerTranslator(std::int64_t created) : created_(created), events_(created) {}

  unsigned status(unsigned upstream_status) override;
  std::string_view content_type(std::string_view upstream_type) override;
  void event(std::string_view upstream_event, std::string& out) override;
  void end_of_events(std::string& out) override;
  void body(std::string_view upstream_body, std::string& out) override;

 private:
  std::int64_t created_;
  EventTranslator events_;
  bool not_understood_ = false;
};

}  // namespace sluice::protocol::anthropic

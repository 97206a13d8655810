#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "sluice/stream/answer_translator.hpp"

// OpenAI chat completion answers as Anthropic Messages answers, for a
// client of POST /v1/messages served by a deployment that speaks OpenAI's
// API: a whole message, an error body, and an event stream translated one
// event at a time. Pure but for the translator's small state, so testable
// without a socket. The reverse of protocol::anthropic's answer translation.
//
// Not carried over: reasoning_content. Anthropic's thinking blocks come
// with a signature that Anthropic checks when they are sent back on a later
// turn; OpenAI's reasoning has none, and a thinking block without one would
// be refused on that turn (and ignored by translate_messages_request
// anyway). The reasoning still counts in output_tokens, as it does at both.
namespace sluice::protocol::messages {

// Anthropic's error type for an HTTP status: 400 invalid_request_error,
// 401 authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 503 and 529 overloaded_error,
// other 4xx invalid_request_error, anything else api_error.
std::string_view error_type(unsigned status);

// Anthropic's error body: {"type":"error","error":{"type":...,"message":...}}.
std::string error_body(std::string_view type, std::string_view message);

// The same as an event: `event: error`, its data that body, a blank line.
std::string error_event(std::string_view type, std::string_view message);

// Anthropic's stop_reason for an OpenAI finish_reason: stop is end_turn
// (OpenAI does not say whether a stop sequence ended the answer, so it is
// never stop_sequence, and stop_sequence is always null), length
// max_tokens, tool_calls and function_call tool_use, content_filter
// refusal; anything else end_turn.
std::string_view stop_reason(std::string_view finish_reason);

// An OpenAI error body answered with `status` as Anthropic's error body:
// its type from the status, its message the error's. A body that is no
// such JSON is quoted (its start) as the message. OpenAI's
// context_length_exceeded reads "prompt is too long: ...", Anthropic's words
// for it, which clients (Claude Code) recognise to shorten the conversation.
std::string translate_error_body(std::string_view openai_body, unsigned status);

// A whole `chat.completion` as an Anthropic message: its text as a text
// block, its tool calls as tool_use blocks (their ids kept, their
// arguments parsed as the input), finish_reason as stop_reason, and usage
// with cached prompt tokens apart: input_tokens is prompt_tokens less
// prompt_tokens_details.cached_tokens, cache_read_input_tokens those, and
// output_tokens completion_tokens. The message id is OpenAI's, with "msg_"
// put before it unless it has it (Anthropic's ids have it; clients show,
// not parse, them).
//
// An OpenAI error body is translated as translate_error_body does, its type
// read from the error itself (no status is known here). Anything else,
// and tool arguments that are no JSON object when the answer was not cut
// short by its length limit, make an api_error body saying the answer was
// not understood, and `understood` (if given) is set false. (Arguments cut
// by the length limit become the input {}: stop_reason max_tokens tells
// the client why.)
std::string translate_answer_body(std::string_view openai_body, bool* understood = nullptr);

// An OpenAI event stream of chat.completion.chunk events as Anthropic's
// Messages events (`event: NAME`, `data: JSON`, a blank line), each written
// as soon as the upstream's event that makes it arrives, never gathered:
// message_start on the first chunk (its usage zero, as OpenAI reports usage
// last), a text block for text and a tool_use block for each tool call,
// each argument fragment an input_json_delta of its own, and at [DONE]
// message_delta (stop_reason and the usage the stream ended with) and
// message_stop. Content-block indexes count up from 0, and every block
// started is stopped once, before the next one starts. An error event of
// the upstream's (or sluice's: {"error":{...}}) becomes Anthropic's error
// event and ends the stream.
//
// OpenAI streams each tool call's arguments whole before the next call
// starts; were arguments of a call to come after a later one began, its
// block is stopped already, and no Anthropic event could add them: the
// stream then ends with an error event rather than with wrong arguments.
class EventTranslator {
 public:
  // One whole upstream event (its lines, without the blank line after).
  void event(std::string_view upstream_event, std::string& out);
  // The upstream's stream ended: nothing when it ended as it should (with
  // [DONE], or an error event), else an error event, never a clean end the
  // upstream did not send.
  void end_of_events(std::string& out);

 private:
  void on_chunk(const nlohmann::json& chunk, std::string& out);
  void start_message(const nlohmann::json& chunk, std::string& out);
  void add_text(std::string_view text, std::string& out);
  void add_tool_call(const nlohmann::json& call, std::size_t position, std::string& out);
  void stop_block(std::string& out);
  void take_usage(const nlohmann::json& usage);
  void finish(std::string& out);
  void fail(std::string_view type, std::string_view message, std::string& out);

  enum class Block { none, text, tool_use };

  std::string id_;
  bool started_ = false;   // message_start was sent
  bool finished_ = false;  // message_stop or an error event was sent
  Block open_ = Block::none;
  unsigned open_index_ = 0;  // the open block's index
  unsigned next_index_ = 0;  // the next block's
  // OpenAI's tool call index -> the content block index of its tool_use.
  std::map<std::int64_t, unsigned> tool_blocks_;
  std::int64_t open_tool_ = -1;  // the tool call whose block is open
  std::string stop_reason_;
  bool refused_ = false;  // the model refused (OpenAI's `refusal` text)
  std::uint64_t prompt_tokens_ = 0;
  std::uint64_t cached_tokens_ = 0;
  std::uint64_t completion_tokens_ = 0;
};

// The AnswerTranslator a deployment's relay uses for a Messages client:
// bodies and events as above.
//
// A body's meaning depends on the upstream's status, but body() may come
// before status() or without it: the relay reads a whole body before it
// writes the head, and a failed attempt's error body is translated with no
// status() call. So a status told before body() decides (2xx an answer,
// 4xx and 5xx an error, typed by the status), and without one the body's
// shape does (an OpenAI error object is an error, typed by its own type).
class AnswerTranslator final : public stream::AnswerTranslator {
 public:
  unsigned status(unsigned upstream_status) override;
  std::string_view content_type(std::string_view upstream_type) override;
  void event(std::string_view upstream_event, std::string& out) override;
  void end_of_events(std::string& out) override;
  void body(std::string_view upstream_body, std::string& out) override;

 private:
  EventTranslator events_;
  unsigned upstream_status_ = 0;  // 0: not told yet
  bool not_understood_ = false;
};

}  // namespace sluice::protocol::messages

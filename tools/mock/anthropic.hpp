#pragma once

// The Anthropic Messages wire format of sluice-mock: the bodies and SSE
// events of POST /v1/messages and /v1/messages/count_tokens, shaped as
// https://docs.anthropic.com documents them. Only formatting lives here; the
// server decides what to answer (mock_server.cpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::mock::anthropic {

// Which blocks an answer holds besides its text (Behaviour::anthropic_content).
struct ContentChoice {
  bool tool_use = false;  // a tool_use block after the text; stop_reason "tool_use"
  bool thinking = false;  // a thinking block before the text
};

// "" | "tools" | "thinking" | "tools,thinking" (in either order); nullopt for
// anything else.
std::optional<ContentChoice> parse_content_choice(std::string_view text);

// Everything one answer is made of, fixed before the first byte.
struct Answer {
  std::uint64_t serial = 0;  // numbers the message and tool-use ids
  std::string model;         // the request's model, echoed
  unsigned text_tokens = 8;  // "tok0 tok1 ..." as the OpenAI answers have
  ContentChoice content;
  std::string tool_name = "get_weather";  // the first tool the request offered, if any
  std::uint64_t input_tokens = 1;
  std::uint64_t cache_read_input_tokens = 0;
  std::uint64_t cache_creation_input_tokens = 0;
};

// The tool_use block's input, serialised; the streamed input_json_delta
// pieces concatenate to exactly this.
std::string tool_input_json(const Answer& answer);
// Text tokens, plus the thinking words and the tool input's bytes / 4 when
// those blocks are present.
std::uint64_t output_tokens(const Answer& answer);

// The non-streamed answer: a "message" object.
std::string message_body(const Answer& answer);

// The streamed answer, each event framed as "event: TYPE\ndata: JSON\n\n":
// message_start, then per block content_block_start, its deltas and
// content_block_stop (a ping after the first block starts), then
// message_delta and message_stop.
std::vector<std::string> stream_events(const Answer& answer);

// How many events of stream_events() precede the first content delta.
constexpr std::size_t kEventsBeforeFirstDelta = 3;  // message_start, content_block_start, ping

// True for a content_block_delta event of stream_events().
bool is_delta_event(std::string_view event);
// True for the message_delta event of stream_events().
bool is_message_delta_event(std::string_view event);

// Event `index` of a stream that never ends: the opening events of a text
// answer, then text deltas for ever.
void append_endless_event(const Answer& answer, std::size_t index, std::string& out);

// A text-only answer (no thinking, no tool use) streamed as stream_events()
// streams it, each event formatted when it is due rather than all of them
// before the first: its first event costs no more than an OpenAI chunk's.
std::size_t text_answer_event_count(const Answer& answer);
void append_text_answer_event(const Answer& answer, std::size_t index, std::string& out);

// {"type":"error","error":{"type":TYPE,"message":MESSAGE}}
std::string error_body(std::string_view type, std::string_view message);
// The same error sent as an SSE event in the middle of a stream.
std::string error_event(std::string_view type, std::string_view message);
// The error type Anthropic sends with an HTTP status.
std::string_view error_type_for_status(unsigned status);

// {"input_tokens":N}
std::string count_tokens_body(std::uint64_t input_tokens);

}  // namespace sluice::mock::anthropic

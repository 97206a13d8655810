// libFuzzer entry point for the event translators of both protocol
// directions; scripts/fuzz builds and runs it.
//
// The input is cut into events as the translating relay cuts an upstream's
// stream (stream::next_event_end; an unfinished last event is dropped) and
// fed one event at a time to anthropic::EventTranslator (Anthropic events to
// OpenAI chunks) and messages::EventTranslator (OpenAI chunks to Anthropic
// events), then end_of_events. Checked, whatever the input: the output is a
// sequence of whole SSE events, each ending in a blank line, each with data,
// every payload but [DONE] a JSON object; the stream ends exactly once,
// last ([DONE] or an error event). For the Messages events also: each
// event's name is its payload's type; message_start comes first; content
// blocks are numbered from 0 up by one, get deltas only while open, and are
// each stopped exactly once, before the next starts and before
// message_delta and message_stop. The whole input as a body must translate
// to one JSON object in both directions.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/protocol/anthropic_answer.hpp"
#include "sluice/protocol/messages_answer.hpp"
#include "sluice/stream/sse_events.hpp"

namespace {

using nlohmann::json;
namespace protocol = sluice::protocol;
namespace stream = sluice::stream;

[[noreturn]] void fail(const char* what, std::string_view output) {
  std::fprintf(stderr, "event translator invariant broken: %s\noutput:\n%.*s\n", what,
               static_cast<int>(output.size()), output.data());
  std::abort();
}

// A string member's text; "" when it is absent or no string.
std::string text_of(const json& object, const char* name) {
  const auto found = object.find(name);
  return found != object.end() && found->is_string() ? found->get<std::string>() : "";
}

struct OutEvent {
  std::string name;  // "" when it has no event: line
  std::string data;
  json payload;  // discarded for [DONE]
};

// The output read back as a client reads it, checking its framing: whole
// events, LF LF after each, every line `event:` or `data:`, data in each,
// every payload but [DONE] a JSON object.
std::vector<OutEvent> read_output(std::string_view output) {
  std::vector<OutEvent> events;
  std::string_view rest = output;
  while (!rest.empty()) {
    std::size_t event_end = 0;
    const auto end = stream::next_event_end(rest, event_end);
    if (end == std::string_view::npos) fail("output ends inside an event", output);
    if (end != event_end + 2 || rest.substr(event_end, 2) != "\n\n") {
      fail("an event does not end in LF LF", output);
    }
    const auto text = rest.substr(0, event_end);
    OutEvent event;
    std::size_t data_lines = 0;
    for (std::string_view lines = text; !lines.empty();) {
      const auto newline = lines.find('\n');
      const auto line = lines.substr(0, newline);
      lines.remove_prefix(newline == std::string_view::npos ? lines.size() : newline + 1);
      if (line.find('\r') != std::string_view::npos) fail("a CR inside a line", output);
      if (line.starts_with("event: ")) {
        event.name = line.substr(7);
      } else if (line.starts_with("data: ")) {
        ++data_lines;
      } else {
        fail("a line that is neither event: nor data:", output);
      }
    }
    if (data_lines != 1) fail("an event without exactly one data line", output);
    event.data = stream::event_data(text);
    if (event.data != "[DONE]") {
      event.payload = json::parse(event.data, nullptr, false);
      if (event.payload.is_discarded() || !event.payload.is_object()) {
        fail("a data payload that is no JSON object", output);
      }
    } else {
      event.payload = json(json::value_t::discarded);
    }
    events.push_back(std::move(event));
    rest.remove_prefix(end);
  }
  return events;
}

// OpenAI chunks, as anthropic::EventTranslator writes them.
void check_chunks(std::string_view output) {
  const auto events = read_output(output);
  if (events.empty()) fail("no end: neither [DONE] nor an error", output);
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& event = events[i];
    if (!event.name.empty()) fail("an OpenAI chunk with an event name", output);
    const bool last = i + 1 == events.size();
    const bool done = event.data == "[DONE]";
    const bool error = !done && event.payload.contains("error");
    if ((done || error) != last) fail("the stream's end is not its last event", output);
    if (!done && !error && text_of(event.payload, "object") != "chat.completion.chunk") {
      fail("a chunk that is no chat.completion.chunk", output);
    }
  }
}

// Anthropic's events, as messages::EventTranslator writes them.
void check_messages(std::string_view output) {
  const auto events = read_output(output);
  if (events.empty()) fail("no end: neither message_stop nor an error", output);
  bool started = false;
  bool delta_sent = false;
  std::int64_t open = -1;
  std::int64_t next = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& event = events[i];
    const bool last = i + 1 == events.size();
    if (event.data == "[DONE]") fail("[DONE] in an Anthropic stream", output);
    if (event.name.empty() || text_of(event.payload, "type") != event.name) {
      fail("an event whose name is not its payload's type", output);
    }
    const auto& name = event.name;
    if (name == "error") {
      if (!last) fail("events after an error", output);
      continue;
    }
    if (name == "message_start") {
      if (started) fail("a second message_start", output);
      started = true;
      continue;
    }
    if (!started) fail("an event before message_start", output);
    if (delta_sent && name != "message_stop") fail("an event after message_delta", output);
    const auto* index = event.payload.contains("index") ? &event.payload["index"] : nullptr;
    if (name == "content_block_start") {
      if (open != -1) fail("a block starts while another is open", output);
      if (!index || *index != next) fail("a block index out of order", output);
      open = next++;
    } else if (name == "content_block_delta") {
      if (open == -1 || !index || *index != open) fail("a delta for no open block", output);
    } else if (name == "content_block_stop") {
      if (open == -1 || !index || *index != open) fail("a stop for no open block", output);
      open = -1;
    } else if (name == "message_delta") {
      if (open != -1) fail("a block left open at message_delta", output);
      delta_sent = true;
    } else if (name == "message_stop") {
      if (!delta_sent) fail("message_stop without message_delta", output);
      if (!last) fail("events after message_stop", output);
    } else {
      fail("an event of an unknown name", output);
    }
  }
  const auto& end = events.back().name;
  if (end != "message_stop" && end != "error") fail("the stream ended without an end", output);
}

void check_body(const std::string& body, std::string_view what) {
  const auto parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) fail(what.data(), body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  std::vector<std::string_view> events;
  for (std::string_view rest = input;;) {
    std::size_t event_end = 0;
    const auto end = stream::next_event_end(rest, event_end);
    if (end == std::string_view::npos) break;
    events.push_back(rest.substr(0, event_end));
    rest.remove_prefix(end);
  }

  {
    protocol::anthropic::EventTranslator translator(1700000000);
    std::string output;
    for (auto event : events) translator.event(event, output);
    translator.end_of_events(output);
    check_chunks(output);
  }
  {
    protocol::messages::EventTranslator translator;
    std::string output;
    for (auto event : events) {
      // Each event's output is whole events by itself: the relay writes it
      // at once.
      std::string one;
      translator.event(event, one);
      if (!one.empty()) read_output(one);
      output += one;
    }
    translator.end_of_events(output);
    check_messages(output);
  }

  check_body(protocol::messages::translate_answer_body(input), "messages answer body");
  check_body(protocol::messages::translate_error_body(input, 400 + size % 200),
             "messages error body");
  check_body(protocol::anthropic::translate_answer_body(input, 1), "anthropic answer body");
  check_body(protocol::anthropic::translate_error_body(input), "anthropic error body");
  return 0;
}

#include "mock/anthropic.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace sluice::mock::anthropic {

namespace {

// Ordered, so each object's keys go out as Anthropic orders them: "type" first.
using Json = nlohmann::ordered_json;

// Streamed tool arguments come in pieces this many bytes long, so a client
// sees them split mid-token as the real API splits them.
constexpr std::size_t kToolInputPieceBytes = 5;
// The thinking block's words, one thinking_delta each.
constexpr std::string_view kThinkingWords[] = {"Let ", "me ", "think ", "this ", "through. "};
constexpr std::string_view kSignature = "EqQBCkYIBRgCIkBtb2NrLXNpZ25hdHVyZS1zbHVpY2UtbW9jaw==";

std::string text_of(const Answer& answer) {
  std::string text;
  text.reserve(answer.text_tokens * 6);
  for (unsigned i = 0; i < answer.text_tokens; ++i) text += "tok" + std::to_string(i) + ' ';
  return text;
}

std::string thinking_text() {
  std::string text;
  for (auto word : kThinkingWords) text += word;
  return text;
}

std::string message_id(const Answer& answer) { return "msg_mock_" + std::to_string(answer.serial); }

std::string tool_use_id(const Answer& answer) {
  return "toolu_mock_" + std::to_string(answer.serial);
}

std::string_view stop_reason(const Answer& answer) {
  return answer.content.tool_use ? "tool_use" : "end_turn";
}

Json usage(const Answer& answer, std::uint64_t output) {
  return {{"input_tokens", answer.input_tokens},
          {"output_tokens", output},
          {"cache_read_input_tokens", answer.cache_read_input_tokens},
          {"cache_creation_input_tokens", answer.cache_creation_input_tokens}};
}

std::string event(std::string_view type, const Json& data) {
  std::string out = "event: ";
  out += type;
  out += "\ndata: ";
  out += data.dump();
  out += "\n\n";
  return out;
}

std::string block_start(std::size_t index, Json block) {
  return event("content_block_start",
               {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
}

std::string block_delta(std::size_t index, Json delta) {
  return event("content_block_delta",
               {{"type", "content_block_delta"}, {"index", index}, {"delta", delta}});
}

std::string block_stop(std::size_t index) {
  return event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
}

// The events of a text answer up to its last delta are written out by hand
// rather than built as JSON values: they come before the first byte a
// client sees, which is then no later than an OpenAI chunk's (a benchmark
// compares the two). They are the same bytes the JSON values dump to.

std::string message_start(const Answer& answer) {
  // As the real API does, the opening usage counts the input and one output
  // token; message_delta carries the final output count.
  std::string out =
      "event: message_start\ndata: "
      R"({"type":"message_start","message":{"id":")";
  out += message_id(answer);
  out += R"(","type":"message","role":"assistant","model":)";
  out += Json(answer.model).dump();
  out += R"(,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":)";
  out += std::to_string(answer.input_tokens);
  out += R"(,"output_tokens":1,"cache_read_input_tokens":)";
  out += std::to_string(answer.cache_read_input_tokens);
  out += R"(,"cache_creation_input_tokens":)";
  out += std::to_string(answer.cache_creation_input_tokens);
  out += "}}}\n\n";
  return out;
}

std::string text_block_start(std::size_t index) {
  return "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":" +
         std::to_string(index) + R"(,"content_block":{"type":"text","text":""}})" + "\n\n";
}

std::string ping() { return "event: ping\ndata: {\"type\":\"ping\"}\n\n"; }

std::string message_delta(const Answer& answer) {
  return event("message_delta",
               {{"type", "message_delta"},
                {"delta", {{"stop_reason", stop_reason(answer)}, {"stop_sequence", nullptr}}},
                {"usage", {{"output_tokens", output_tokens(answer)}}}});
}

std::string message_stop() { return event("message_stop", {{"type", "message_stop"}}); }

std::string text_delta(std::size_t block_index, std::size_t token_index) {
  return "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":" +
         std::to_string(block_index) + R"(,"delta":{"type":"text_delta","text":"tok)" +
         std::to_string(token_index) + " \"}}\n\n";
}

}  // namespace

std::optional<ContentChoice> parse_content_choice(std::string_view text) {
  ContentChoice choice;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    if (item == "tools") {
      choice.tool_use = true;
    } else if (item == "thinking") {
      choice.thinking = true;
    } else {
      return std::nullopt;
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return std::nullopt;  // a trailing comma
  }
  return choice;
}

std::string tool_input_json(const Answer&) {
  // Nested values and an escaped quote, so a client that reassembles the
  // pieces wrongly produces invalid JSON rather than a near miss. The same
  // for every request, so a streamed answer's input can be compared with a
  // plain one's.
  return Json{{"location", "San Francisco, CA"},
              {"unit", "celsius"},
              {"days", 3},
              {"note", "say \"hi\""},
              {"tags", {"tok0", "tok1"}}}
      .dump();
}

std::uint64_t output_tokens(const Answer& answer) {
  std::uint64_t tokens = answer.text_tokens;
  if (answer.content.thinking) tokens += std::size(kThinkingWords);
  if (answer.content.tool_use) tokens += tool_input_json(answer).size() / 4;
  return tokens;
}

std::string message_body(const Answer& answer) {
  Json content = Json::array();
  if (answer.content.thinking) {
    content.push_back(
        {{"type", "thinking"}, {"thinking", thinking_text()}, {"signature", kSignature}});
  }
  content.push_back({{"type", "text"}, {"text", text_of(answer)}});
  if (answer.content.tool_use) {
    content.push_back({{"type", "tool_use"},
                       {"id", tool_use_id(answer)},
                       {"name", answer.tool_name},
                       {"input", Json::parse(tool_input_json(answer))}});
  }
  return Json{{"id", message_id(answer)},      {"type", "message"},
              {"role", "assistant"},           {"model", answer.model},
              {"content", std::move(content)}, {"stop_reason", stop_reason(answer)},
              {"stop_sequence", nullptr},      {"usage", usage(answer, output_tokens(answer))}}
      .dump();
}

std::vector<std::string> stream_events(const Answer& answer) {
  std::vector<std::string> events;
  events.reserve(answer.text_tokens + 32);
  events.push_back(message_start(answer));
  std::size_t block = 0;
  bool pinged = false;
  // The real API sends its first ping right after the first block starts.
  auto start = [&](std::string block_start_event) {
    events.push_back(std::move(block_start_event));
    if (!pinged) events.push_back(ping());
    pinged = true;
  };

  if (answer.content.thinking) {
    start(block_start(block, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}));
    for (auto word : kThinkingWords) {
      events.push_back(block_delta(block, {{"type", "thinking_delta"}, {"thinking", word}}));
    }
    events.push_back(block_delta(block, {{"type", "signature_delta"}, {"signature", kSignature}}));
    events.push_back(block_stop(block++));
  }

  start(text_block_start(block));
  for (unsigned i = 0; i < answer.text_tokens; ++i) events.push_back(text_delta(block, i));
  events.push_back(block_stop(block++));

  if (answer.content.tool_use) {
    start(block_start(block, {{"type", "tool_use"},
                              {"id", tool_use_id(answer)},
                              {"name", answer.tool_name},
                              {"input", Json::object()}}));
    const std::string input = tool_input_json(answer);
    for (std::size_t at = 0; at < input.size(); at += kToolInputPieceBytes) {
      events.push_back(
          block_delta(block, {{"type", "input_json_delta"},
                              {"partial_json", input.substr(at, kToolInputPieceBytes)}}));
    }
    events.push_back(block_stop(block++));
  }

  events.push_back(message_delta(answer));
  events.push_back(message_stop());
  return events;
}

bool is_delta_event(std::string_view event) {
  return event.starts_with("event: content_block_delta\n");
}

bool is_message_delta_event(std::string_view event) {
  return event.starts_with("event: message_delta\n");
}

void append_endless_event(const Answer& answer, std::size_t index, std::string& out) {
  switch (index) {
    case 0:
      out += message_start(answer);
      break;
    case 1:
      out += text_block_start(0);
      break;
    case 2:
      out += ping();
      break;
    default:
      out += text_delta(0, index - kEventsBeforeFirstDelta);
  }
}

std::size_t text_answer_event_count(const Answer& answer) {
  // The opening events, the deltas, then content_block_stop, message_delta
  // and message_stop.
  return kEventsBeforeFirstDelta + answer.text_tokens + 3;
}

void append_text_answer_event(const Answer& answer, std::size_t index, std::string& out) {
  const std::size_t deltas_end = kEventsBeforeFirstDelta + answer.text_tokens;
  if (index < deltas_end) {
    append_endless_event(answer, index, out);
  } else if (index == deltas_end) {
    out += block_stop(0);
  } else if (index == deltas_end + 1) {
    out += message_delta(answer);
  } else {
    out += message_stop();
  }
}

std::string error_body(std::string_view type, std::string_view message) {
  return Json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}.dump();
}

std::string error_event(std::string_view type, std::string_view message) {
  return event("error", Json::parse(error_body(type, message)));
}

std::string_view error_type_for_status(unsigned status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string count_tokens_body(std::uint64_t input_tokens) {
  return Json{{"input_tokens", input_tokens}}.dump();
}

}  // namespace sluice::mock::anthropic

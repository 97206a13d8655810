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

std::string message_start(const Answer& answer) {
  // As the real API does, the opening usage counts the input and one output
  // token; message_delta carries the final output count.
  return event("message_start", {{"type", "message_start"},
                                 {"message",
                                  {{"id", message_id(answer)},
                                   {"type", "message"},
                                   {"role", "assistant"},
                                   {"model", answer.model},
                                   {"content", Json::array()},
                                   {"stop_reason", nullptr},
                                   {"stop_sequence", nullptr},
                                   {"usage", usage(answer, 1)}}}});
}

std::string ping() { return event("ping", {{"type", "ping"}}); }

std::string text_delta(std::size_t block_index, std::size_t token_index) {
  return block_delta(block_index,
                     {{"type", "text_delta"}, {"text", "tok" + std::to_string(token_index) + ' '}});
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
  auto start = [&](Json content_block) {
    events.push_back(block_start(block, std::move(content_block)));
    if (!pinged) events.push_back(ping());
    pinged = true;
  };

  if (answer.content.thinking) {
    start({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    for (auto word : kThinkingWords) {
      events.push_back(block_delta(block, {{"type", "thinking_delta"}, {"thinking", word}}));
    }
    events.push_back(block_delta(block, {{"type", "signature_delta"}, {"signature", kSignature}}));
    events.push_back(block_stop(block++));
  }

  start({{"type", "text"}, {"text", ""}});
  for (unsigned i = 0; i < answer.text_tokens; ++i) events.push_back(text_delta(block, i));
  events.push_back(block_stop(block++));

  if (answer.content.tool_use) {
    start({{"type", "tool_use"},
           {"id", tool_use_id(answer)},
           {"name", answer.tool_name},
           {"input", Json::object()}});
    const std::string input = tool_input_json(answer);
    for (std::size_t at = 0; at < input.size(); at += kToolInputPieceBytes) {
      events.push_back(
          block_delta(block, {{"type", "input_json_delta"},
                              {"partial_json", input.substr(at, kToolInputPieceBytes)}}));
    }
    events.push_back(block_stop(block++));
  }

  events.push_back(
      event("message_delta",
            {{"type", "message_delta"},
             {"delta", {{"stop_reason", stop_reason(answer)}, {"stop_sequence", nullptr}}},
             {"usage", {{"output_tokens", output_tokens(answer)}}}}));
  events.push_back(event("message_stop", {{"type", "message_stop"}}));
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
      out += block_start(0, {{"type", "text"}, {"text", ""}});
      break;
    case 2:
      out += ping();
      break;
    default:
      out += text_delta(0, index - kEventsBeforeFirstDelta);
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

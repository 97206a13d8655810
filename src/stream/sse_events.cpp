#include "sluice/stream/sse_events.hpp"

#include "sluice/openai/api_error.hpp"

namespace sluice::stream {

std::size_t next_event_end(std::string_view text, std::size_t& event_end) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c != '\n' && c != '\r') continue;
    // A line ends at i; a second line ending right after it is the blank
    // line that ends the event.
    std::size_t next = i + 1;
    if (c == '\r' && next < text.size() && text[next] == '\n') ++next;
    if (next >= text.size()) return std::string_view::npos;
    const char after = text[next];
    if (after == '\n' || after == '\r') {
      std::size_t end = next + 1;
      if (after == '\r') {
        if (end >= text.size()) return std::string_view::npos;  // CR LF may follow
        if (text[end] == '\n') ++end;
      }
      event_end = i;
      return end;
    }
    i = next - 1;
  }
  return std::string_view::npos;
}

std::string event_data(std::string_view event) {
  std::string data;
  while (!event.empty()) {
    auto end = event.find_first_of("\r\n");
    auto line = event.substr(0, end);
    event.remove_prefix(end == std::string_view::npos ? event.size() : end + 1);
    if (!line.starts_with("data:")) continue;
    line.remove_prefix(5);
    if (line.starts_with(' ')) line.remove_prefix(1);
    if (!data.empty()) data += '\n';
    data.append(line);
  }
  return data;
}

std::string stream_error_event(std::string_view message, std::string_view code) {
  ApiError error{502, std::string(message), "upstream_error", "", std::string(code)};
  return "data: " + error.to_json() + "\n\n";
}

}  // namespace sluice::stream

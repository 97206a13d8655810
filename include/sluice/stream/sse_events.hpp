#pragma once

#include <cstddef>
#include <string>
#include <string_view>

// Server-sent events as text: where one ends, and the error event a broken
// stream ends with. Apart from the relays so that code translating events
// (and its fuzz target) needs no sockets.
namespace sluice::stream {

// Where the first complete server-sent event in `text` ends: the index just
// past the blank line that ends it (LF LF, CR LF CR LF, CR CR), or npos.
// `event_end` is where the event's own lines end.
std::size_t next_event_end(std::string_view text, std::size_t& event_end);

// The data of one event (its lines, without the blank line after): its
// `data:` lines joined by line feeds, as SSE joins them; "" when it has
// none. Its other lines (`event:`, `id:`, comments) are not read.
std::string event_data(std::string_view event);

// The SSE event sent when a stream breaks after its first byte, in OpenAI's
// error shape.
std::string stream_error_event(std::string_view message, std::string_view code);

// Writes the event a broken stream ends with, as the client's protocol words
// it; `code` is sluice's ("upstream_timeout", "stream_interrupted").
using StreamErrorEvent = std::string (*)(std::string_view message, std::string_view code);

}  // namespace sluice::stream

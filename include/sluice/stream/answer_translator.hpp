#pragma once

#include <string>
#include <string_view>

// The answer side of a protocol adapter: the upstream's answer turned into
// what the client's endpoint speaks, one piece at a time, as the relay reads
// it. Events are translated one by one as they arrive, never gathered into
// a whole stream.
namespace sluice::stream {

class AnswerTranslator {
 public:
  virtual ~AnswerTranslator() = default;

  // The answer's status, as the client gets it; the upstream's by default.
  virtual unsigned status(unsigned upstream_status) { return upstream_status; }
  // The content type the client gets for an answer of `upstream_type`.
  virtual std::string_view content_type(std::string_view upstream_type) { return upstream_type; }

  // One server-sent event of the upstream's, whole (its lines, without the
  // blank line that ended it): appends what the client gets for it, as
  // complete events each ending in a blank line, or nothing.
  virtual void event(std::string_view upstream_event, std::string& out) = 0;
  // The upstream's event stream ended cleanly: anything the client's
  // protocol sends last (OpenAI's `data: [DONE]`).
  virtual void end_of_events(std::string& out) = 0;
  // A body that is no event stream (JSON, an error), whole: the client's.
  virtual void body(std::string_view upstream_body, std::string& out) = 0;
};

}  // namespace sluice::stream

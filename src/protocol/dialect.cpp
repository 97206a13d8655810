#include "sluice/protocol/dialect.hpp"

#include "sluice/protocol/messages_answer.hpp"

namespace sluice::protocol {

namespace {

std::string messages_stream_error_event(std::string_view message, std::string_view /*code*/) {
  // Anthropic's streams carry no code of sluice's: an interrupted stream is
  // an api_error, as Anthropic words its own.
  return messages::error_event(messages::error_type(502), message);
}

}  // namespace

std::string error_json(Dialect dialect, const ApiError& error) {
  if (dialect == Dialect::openai) return error.to_json();
  return messages::error_body(messages::error_type(error.status), error.message);
}

stream::StreamErrorEvent stream_error_event(Dialect dialect) {
  return dialect == Dialect::openai ? &stream::stream_error_event : &messages_stream_error_event;
}

}  // namespace sluice::protocol

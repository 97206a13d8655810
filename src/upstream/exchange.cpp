#include "sluice/upstream/exchange.hpp"

namespace sluice::upstream {

const char* to_string(Failure failure) {
  switch (failure) {
    case Failure::dns:
      return "dns";
    case Failure::connect:
      return "connect";
    case Failure::connect_timeout:
      return "connect_timeout";
    case Failure::tls:
      return "tls";
    case Failure::send:
      return "send";
    case Failure::first_byte_timeout:
      return "first_byte_timeout";
    case Failure::no_response:
      return "no_response";
    case Failure::bad_response:
      return "bad_response";
    case Failure::idle_timeout:
      return "idle_timeout";
    case Failure::total_timeout:
      return "total_timeout";
    case Failure::body_interrupted:
      return "body_interrupted";
    case Failure::aborted:
      return "aborted";
  }
  return "unknown";
}

std::string UpstreamError::describe() const {
  std::string text = to_string(failure);
  if (ec) {
    text += ": ";
    text += ec.message();
  }
  return text;
}

}  // namespace sluice::upstream

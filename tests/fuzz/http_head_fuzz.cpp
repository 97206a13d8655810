// libFuzzer entry point for the gateway's two HTTP/1.x parsers, the client
// request and the upstream response: each reads the input once with the
// plain reader first and once with Beast's parser alone, and the two
// readings must leave the same observable state (what was consumed, the
// error, the head's parts, the forwarded and withheld fields, the framing,
// keep-alive and the body). The plain reader may only ever take what Beast's
// parser takes, and read it the same way.
//
// Input: byte 0 picks the parser (bit 0) and where the first read ends
// (the other bits, in eighths of the message); byte 1 the head limit (0:
// Beast's default, else that many times 4 bytes); the rest is the message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "support/parser_observation.hpp"

namespace {

template <class Reading>
void check_alike(const Reading& plain_first, Reading beast, std::string_view message) {
  // Which reader took the head is the one difference allowed.
  beast.plain = plain_first.plain;
  if (plain_first == beast) return;
  std::fprintf(stderr, "the readers disagree on %zu bytes\n-- plain reader first: %s\n-- Beast: %s\n",
               message.size(), plain_first.describe().c_str(), beast.describe().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const bool request = (data[0] & 1) != 0;
  const std::string_view message(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::size_t first_piece = message.size() * ((data[0] >> 1) % 9) / 8;
  const std::uint32_t header_limit = data[1] == 0 ? 8192u : data[1] * 4u;
  using sluice::testing::read_request;
  using sluice::testing::read_response;
  if (request) {
    using Reading = sluice::server::ClientRequest::Reading;
    const std::uint64_t body_limit = 64;
    check_alike(read_request(Reading::plain_when_possible, message, header_limit, body_limit,
                             first_piece),
                read_request(Reading::beast_only, message, header_limit, body_limit, first_piece),
                message);
  } else {
    using Reading = sluice::upstream::ResponseParser::Reading;
    check_alike(read_response(Reading::plain_when_possible, message, header_limit, first_piece),
                read_response(Reading::beast_only, message, header_limit, first_piece), message);
  }
  return 0;
}

#include "sluice/metrics/server_timing.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>

namespace sluice::metrics {

namespace {

// Milliseconds of a duration that fits in 64 bits of nanoseconds.
constexpr std::size_t kMaxDigits = 20;

// The header is composed in a stack buffer and appended to the response's
// fields in one piece: it is written for every response.
char* put(char* at, std::string_view text) {
  std::memcpy(at, text.data(), text.size());
  return at + text.size();
}

char* put_milliseconds(char* at, Clock::duration duration) {
  // Integer arithmetic on whole microseconds, rounded to nearest (half up):
  // exact, and cheaper than formatting a double. Not std::chrono::round,
  // which overflows near the largest duration. Durations are never negative;
  // a clock oddity shows as 0 rather than as a malformed header.
  const std::int64_t nanos = std::max<std::int64_t>(std::chrono::nanoseconds(duration).count(), 0);
  const std::int64_t micros = nanos / 1000 + (nanos % 1000 >= 500 ? 1 : 0);
  at = std::to_chars(at, at + kMaxDigits, micros / 1000).ptr;
  const auto fraction = static_cast<unsigned>(micros % 1000);
  if (fraction == 0) return at;
  const char digits[4] = {'.', static_cast<char>('0' + fraction / 100),
                          static_cast<char>('0' + fraction / 10 % 10),
                          static_cast<char>('0' + fraction % 10)};
  std::size_t length = 4;
  while (digits[length - 1] == '0') --length;
  return put(at, std::string_view(digits, length));
}

constexpr std::string_view kEntryNames[] = {"gateway", "upstream-connect", "upstream-ttfb"};
constexpr std::size_t kMaxValue = 3 * (sizeof ", upstream-connect;dur=" + kMaxDigits + 4);

char* put_value(char* at, const ServerTiming& timing) {
  const std::optional<Clock::duration>* entries[] = {&timing.gateway, &timing.upstream_connect,
                                                     &timing.upstream_ttfb};
  const char* const start = at;
  for (std::size_t i = 0; i < std::size(entries); ++i) {
    if (!*entries[i]) continue;
    if (at != start) at = put(at, ", ");
    at = put(at, kEntryNames[i]);
    at = put(at, ";dur=");
    at = put_milliseconds(at, **entries[i]);
  }
  return at;
}

}  // namespace

void append_milliseconds(std::string& out, Clock::duration duration) {
  char buffer[kMaxDigits + 4];
  out.append(buffer, put_milliseconds(buffer, duration));
}

void render_server_timing_value(std::string& out, const ServerTiming& timing) {
  char buffer[kMaxValue];
  out.append(buffer, put_value(buffer, timing));
}

void render_server_timing(std::string& out, const ServerTiming& timing) {
  if (!timing.gateway && !timing.upstream_connect && !timing.upstream_ttfb) return;
  char buffer[kServerTimingHeader.size() + 2 + kMaxValue + 2];
  char* at = put(buffer, kServerTimingHeader);
  at = put(at, ": ");
  at = put_value(at, timing);
  at = put(at, "\r\n");
  out.append(buffer, at);
}

}  // namespace sluice::metrics

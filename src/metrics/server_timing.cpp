#include "sluice/metrics/server_timing.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>

namespace sluice::metrics {

void append_milliseconds(std::string& out, Clock::duration duration) {
  // Integer arithmetic on whole microseconds, rounded to nearest: exact, and
  // cheaper than formatting a double. Durations are never negative; a clock
  // oddity shows as 0 rather than as a malformed header.
  const std::int64_t micros =
      std::max<std::int64_t>(std::chrono::round<std::chrono::microseconds>(duration).count(), 0);
  char buffer[24];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, micros / 1000);
  out.append(buffer, end);
  const auto fraction = static_cast<unsigned>(micros % 1000);
  if (fraction == 0) return;
  const char digits[4] = {'.', static_cast<char>('0' + fraction / 100),
                          static_cast<char>('0' + fraction / 10 % 10),
                          static_cast<char>('0' + fraction % 10)};
  std::size_t length = 4;
  while (digits[length - 1] == '0') --length;
  out.append(digits, length);
}

void render_server_timing_value(std::string& out, const ServerTiming& timing) {
  bool first = true;
  auto entry = [&](std::string_view name, const std::optional<Clock::duration>& duration) {
    if (!duration) return;
    if (!first) out += ", ";
    first = false;
    out += name;
    out += ";dur=";
    append_milliseconds(out, *duration);
  };
  entry("gateway", timing.gateway);
  entry("upstream-connect", timing.upstream_connect);
  entry("upstream-ttfb", timing.upstream_ttfb);
}

void render_server_timing(std::string& out, const ServerTiming& timing) {
  if (!timing.gateway && !timing.upstream_connect && !timing.upstream_ttfb) return;
  out += kServerTimingHeader;
  out += ": ";
  render_server_timing_value(out, timing);
  out += "\r\n";
}

}  // namespace sluice::metrics

#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/clock.hpp"

namespace sluice::metrics {

// What the client is told about where its request's time went (the
// Server-Timing header, which browsers' dev tools and many HTTP clients show).
// Absent entries are left out.
struct ServerTiming {
  std::optional<Clock::duration> gateway;           // time spent in sluice itself
  std::optional<Clock::duration> upstream_connect;  // DNS + TCP + TLS of the final attempt
  std::optional<Clock::duration> upstream_ttfb;     // request sent -> first upstream byte
};

inline constexpr std::string_view kServerTimingHeader = "Server-Timing";

// Appends the header value, e.g.
// "gateway;dur=0.123, upstream-connect;dur=1.2, upstream-ttfb;dur=45.6"
// (milliseconds, at most 3 decimals, trailing zeros dropped). Appends nothing
// when every entry is absent.
void render_server_timing_value(std::string& out, const ServerTiming& timing);

// Appends the whole "Server-Timing: <value>\r\n" field line, ready for
// HeadWriter::raw_fields; nothing when every entry is absent.
void render_server_timing(std::string& out, const ServerTiming& timing);

// Milliseconds with at most 3 decimals and no trailing zeros ("45.6", "12").
void append_milliseconds(std::string& out, Clock::duration duration);

}  // namespace sluice::metrics

#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace sluice::metrics {

// W3C Trace Context (https://www.w3.org/TR/trace-context/): the traceparent
// header, "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>".
struct TraceContext {
  std::array<std::uint8_t, 16> trace_id{};
  std::array<std::uint8_t, 8> parent_id{};  // the span id of the hop that sent it
  std::uint8_t flags = 0;

  static constexpr std::uint8_t kSampled = 0x01;

  std::string trace_id_hex() const;
  std::string parent_id_hex() const;
  // The traceparent header value, always version 00.
  std::string traceparent() const;
  // The same, appended to `out`.
  void append_traceparent(std::string& out) const;
  bool operator==(const TraceContext&) const = default;
};

// Parses a traceparent value (surrounding spaces and tabs are allowed, as in
// any HTTP field). nullopt when malformed: wrong length or separators,
// anything but lowercase hex, version ff, an all-zero trace or parent id.
// A version above 00 is read as 00 if its first four fields parse and it is
// either exactly that long or continues with '-', as the spec asks.
std::optional<TraceContext> parse_traceparent(std::string_view value);

// Builds from raw random words; an all-zero id (invalid) becomes ...01.
TraceContext make_trace_context(std::uint64_t trace_high, std::uint64_t trace_low,
                                std::uint64_t span, std::uint8_t flags);

// A new trace for a request that came without a (valid) traceparent. It is
// marked sampled: the access log records every request under its trace id.
template <class Random>
requires std::convertible_to<std::invoke_result_t<Random&>, std::uint64_t> TraceContext
new_trace_context(Random&& random, std::uint8_t flags = TraceContext::kSampled) {
  const std::uint64_t high = random();
  const std::uint64_t low = random();
  const std::uint64_t span = random();
  return make_trace_context(high, low, span, flags);
}

// The context for our hop, to forward upstream: the same trace id and flags,
// with a new span id as the parent id.
template <class Random>
requires std::convertible_to<std::invoke_result_t<Random&>, std::uint64_t> TraceContext
next_hop(const TraceContext& incoming, Random&& random) {
  TraceContext hop = make_trace_context(0, 1, random(), incoming.flags);
  hop.trace_id = incoming.trace_id;
  return hop;
}

}  // namespace sluice::metrics

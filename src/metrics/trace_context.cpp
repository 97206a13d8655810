#include "sluice/metrics/trace_context.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace sluice::metrics {

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

// Lowercase only: the spec's HEXDIGLC.
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

template <std::size_t N>
bool parse_hex(std::string_view text, std::array<std::uint8_t, N>& bytes) {
  if (text.size() != 2 * N) return false;
  for (std::size_t i = 0; i < N; ++i) {
    const int high = hex_value(text[2 * i]);
    const int low = hex_value(text[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    bytes[i] = static_cast<std::uint8_t>(high << 4 | low);
  }
  return true;
}

// The two digits of every byte value, so a byte is written with one load
// and one store: every proxied request writes a traceparent.
constexpr auto kHexPairs = [] {
  std::array<char, 512> pairs{};
  for (std::size_t byte = 0; byte < 256; ++byte) {
    pairs[2 * byte] = kHexDigits[byte >> 4];
    pairs[2 * byte + 1] = kHexDigits[byte & 0x0f];
  }
  return pairs;
}();

// Writes 2 * N digits at `out`.
template <std::size_t N>
char* write_hex(char* out, const std::array<std::uint8_t, N>& bytes) {
  for (std::uint8_t byte : bytes) {
    std::memcpy(out, &kHexPairs[2 * std::size_t{byte}], 2);
    out += 2;
  }
  return out;
}

template <std::size_t N>
std::string hex(const std::array<std::uint8_t, N>& bytes) {
  std::string out(2 * N, '\0');
  write_hex(out.data(), bytes);
  return out;
}

template <std::size_t N>
bool all_zero(const std::array<std::uint8_t, N>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

void store_big_endian(std::uint8_t* out, std::uint64_t value) {
  if constexpr (std::endian::native == std::endian::little) value = __builtin_bswap64(value);
  std::memcpy(out, &value, sizeof value);
}

std::string_view trim_whitespace(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

constexpr std::size_t kVersion00Length = 55;  // 2 + 1 + 32 + 1 + 16 + 1 + 2

}  // namespace

std::string TraceContext::trace_id_hex() const { return hex(trace_id); }

std::string TraceContext::parent_id_hex() const { return hex(parent_id); }

std::string TraceContext::traceparent() const {
  std::string out;
  append_traceparent(out);
  return out;
}

void TraceContext::append_traceparent(std::string& out) const {
  const std::size_t start = out.size();
  out.resize(start + kVersion00Length, '-');
  char* at = out.data() + start;
  *at++ = '0';
  *at++ = '0';
  at = write_hex(at + 1, trace_id);
  at = write_hex(at + 1, parent_id);
  write_hex(at + 1, std::array<std::uint8_t, 1>{flags});
}

std::optional<TraceContext> parse_traceparent(std::string_view value) {
  value = trim_whitespace(value);
  if (value.size() < kVersion00Length) return std::nullopt;

  std::array<std::uint8_t, 1> version;
  if (!parse_hex(value.substr(0, 2), version) || version[0] == 0xff) return std::nullopt;
  if (version[0] == 0x00 && value.size() != kVersion00Length) return std::nullopt;
  // Later versions may append fields, each introduced by '-'.
  if (value.size() > kVersion00Length && value[kVersion00Length] != '-') return std::nullopt;
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return std::nullopt;

  TraceContext context;
  std::array<std::uint8_t, 1> flags;
  if (!parse_hex(value.substr(3, 32), context.trace_id) ||
      !parse_hex(value.substr(36, 16), context.parent_id) ||
      !parse_hex(value.substr(53, 2), flags)) {
    return std::nullopt;
  }
  if (all_zero(context.trace_id) || all_zero(context.parent_id)) return std::nullopt;
  context.flags = flags[0];
  return context;
}

TraceContext make_trace_context(std::uint64_t trace_high, std::uint64_t trace_low,
                                std::uint64_t span, std::uint8_t flags) {
  if (trace_high == 0 && trace_low == 0) trace_low = 1;
  if (span == 0) span = 1;
  TraceContext context;
  store_big_endian(context.trace_id.data(), trace_high);
  store_big_endian(context.trace_id.data() + 8, trace_low);
  store_big_endian(context.parent_id.data(), span);
  context.flags = flags;
  return context;
}

}  // namespace sluice::metrics

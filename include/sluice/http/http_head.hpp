#pragma once

#include <boost/beast/http/field.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "sluice/common/ascii.hpp"

namespace sluice {

// Writes an HTTP/1.1 head straight into a reusable string: cheaper than
// building a Beast fields container for heads we only ever serialise.
class HeadWriter {
 public:
  // Room for a typical head at once: appending field by field to an empty
  // string would reallocate it several times per request.
  static constexpr std::size_t kTypicalHeadBytes = 512;

  explicit HeadWriter(std::string& out) : out_(out) {
    out_.clear();
    out_.reserve(kTypicalHeadBytes);
  }

  HeadWriter& status_line(unsigned status);
  // The target is written as the concatenation of its pieces.
  HeadWriter& request_line(std::string_view method, std::span<const std::string_view> target);
  HeadWriter& field(std::string_view name, std::string_view value);
  HeadWriter& field(std::string_view name, std::size_t value);
  // Copies preformatted "Name: value\r\n" lines.
  HeadWriter& raw_fields(std::string_view lines);
  std::string& finish();

 private:
  std::string& out_;
};

// Hop-by-hop headers (RFC 9110 §7.6.1) and the framing headers a proxy
// always sets itself, for a name as parsed (token characters).
bool is_hop_by_hop_header(std::string_view name);
// The same set for a name the parser has looked up already: Beast knows
// every hop-by-hop name, so an unknown one is end-to-end.
bool is_hop_by_hop_field(boost::beast::http::field name);

// Whether the comma-separated list `list` (a Connection value, RFC 9110
// §7.6.1) holds `token`, compared case-insensitively.
bool token_list_has(std::string_view list, std::string_view token);

// One "Name: value\r\n" line of a run of them, as the parsers keep them.
struct FieldLine {
  std::string_view name;
  std::string_view line;  // the whole line, its CRLF included
};

// Calls visit(FieldLine) for each line of `lines`, in order.
template <class Visit>
void for_each_field_line(std::string_view lines, Visit&& visit) {
  while (!lines.empty()) {
    const std::size_t end = lines.find('\n');
    const std::string_view line = lines.substr(0, end == std::string_view::npos ? end : end + 1);
    visit(FieldLine{line.substr(0, line.find(':')), line});
    lines.remove_prefix(line.size());
  }
}

// `lines` without the lines whose name drop(name) holds: `lines` itself,
// with nothing copied, when there is none; otherwise the rest, copied into
// `kept`.
template <class Text, class Drop>
std::string_view lines_without(std::string_view lines, Text& kept, Drop&& drop) {
  bool dropped_any = false;
  for_each_field_line(lines, [&](const FieldLine& field) {
    if (drop(field.name)) {
      if (!dropped_any) {
        kept.assign(lines.data(), static_cast<std::size_t>(field.line.data() - lines.data()));
      }
      dropped_any = true;
    } else if (dropped_any) {
      kept.append(field.line.data(), field.line.size());
    }
  });
  return dropped_any ? std::string_view(kept.data(), kept.size()) : lines;
}

// Whether a field name as parsed (token characters only) is `lowercase`, a
// name of lower-case letters, digits and '-', in any case. Setting bit 5 of
// every byte lower-cases letters and maps no other token character onto a
// letter, digit or '-', so eight bytes are compared at a time.
inline bool field_name_is(std::string_view name, std::string_view lowercase) {
  const std::size_t size = name.size();
  if (size != lowercase.size()) return false;
  if (size < 8) {
    for (std::size_t i = 0; i < size; ++i) {
      if ((name[i] | 0x20) != lowercase[i]) return false;
    }
    return true;
  }
  const auto word = [](const char* at) {
    std::uint64_t value;
    std::memcpy(&value, at, sizeof value);
    return value;
  };
  constexpr std::uint64_t kBit5 = 0x2020202020202020;
  for (std::size_t i = 0; i + 8 < size; i += 8) {
    if ((word(name.data() + i) | kBit5) != word(lowercase.data() + i)) return false;
  }
  // The last eight bytes, overlapping the words before when size is not a
  // multiple of eight.
  return (word(name.data() + size - 8) | kBit5) == word(lowercase.data() + size - 8);
}

}  // namespace sluice

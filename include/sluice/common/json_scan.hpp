#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace sluice {

// Byte range [begin, end) of a JSON value inside a larger text.
struct ValueSpan {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// Finds the value of `key` in the top-level object of `json` without building
// a DOM, so a large body can be forwarded with one field replaced in place.
// Keys are compared as decoded (a key spelled with escapes is found too);
// with duplicate keys the last one wins, as in nlohmann::json. Returns nullopt
// when the text is not an object or the key is absent.
std::optional<ValueSpan> find_top_level_value(std::string_view json, std::string_view key);

// Calls `visit(key, value)` for each member of the top-level object, in
// order; the key is the raw text between its quotes. Returns false when the
// text is not an object or its structure is broken (values are delimited,
// not validated). Text after the object's closing brace is not looked at.
bool for_each_top_level_member(std::string_view json,
                               const std::function<void(std::string_view, ValueSpan)>& visit);

// The four hex digits of a `\u` escape starting at `at`, or -1.
long json_hex4(std::string_view text, std::size_t at);

// Appends the text of a JSON string literal, given without its quotes, with
// its escapes decoded (a surrogate pair becomes one UTF-8 sequence). Returns
// false at a malformed escape; other bytes are copied as they are.
bool decode_json_string(std::string_view literal, std::string& out);

// Appends `text` as a JSON string literal (quotes and escapes included).
// Bytes that are not UTF-8 become U+FFFD, so the result is always valid JSON
// whatever a client, a config or an upstream put in the text.
void append_json_string(std::string& out, std::string_view text);

// Length of the valid UTF-8 sequence starting at text[at] (a byte >= 0x80),
// or 0 when it is not one (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF).
std::size_t utf8_sequence_length(std::string_view text, std::size_t at);

}  // namespace sluice

#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
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

// Walks the members of the top-level object, in order, without building a
// DOM; the key is the raw text between its quotes. Values are delimited, not
// validated. Text after the object's closing brace is not looked at.
class TopLevelMembers {
 public:
  explicit TopLevelMembers(std::string_view json) : json_(json) {}

  // The next member, or false at the end of the object or where its
  // structure breaks (well_formed() tells which).
  bool next(std::string_view& key, ValueSpan& value);
  bool well_formed() const { return state_ != State::broken; }
  // Once next() has returned false on a well-formed object: just past its
  // closing brace.
  std::size_t end() const { return pos_; }

 private:
  enum class State { before_object, in_object, done, broken };
  bool fail() {
    state_ = State::broken;
    return false;
  }

  std::string_view json_;
  std::size_t pos_ = 0;
  State state_ = State::before_object;
};

// Calls `visit(key, value)` for each member of the top-level object, in
// order (see TopLevelMembers). Returns false when the text is not an object
// or its structure is broken.
template <typename Visit>
bool for_each_top_level_member(std::string_view json, Visit&& visit) {
  TopLevelMembers members(json);
  std::string_view key;
  ValueSpan value;
  while (members.next(key, value)) visit(key, value);
  return members.well_formed();
}

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

// What a UTF-8 sequence's first byte allows (RFC 3629, table 3-7 of the
// Unicode standard): its length (0: no sequence starts with it) and the
// range of its second byte, which rules out overlong forms, surrogates and
// anything above U+10FFFF; later bytes are any continuation byte.
struct Utf8Lead {
  std::uint8_t length;
  std::uint8_t second_low;
  std::uint8_t second_high;
};
inline constexpr std::array<Utf8Lead, 256> kUtf8Leads = [] {
  std::array<Utf8Lead, 256> leads{};
  for (int lead = 0; lead < 256; ++lead) {
    const std::uint8_t length = lead >= 0xc2 && lead <= 0xdf   ? 2
                                : lead >= 0xe0 && lead <= 0xef ? 3
                                : lead >= 0xf0 && lead <= 0xf4 ? 4
                                                               : 0;
    leads[lead] = Utf8Lead{length, 0x80, 0xbf};
  }
  leads[0xe0].second_low = 0xa0;
  leads[0xed].second_high = 0x9f;
  leads[0xf0].second_low = 0x90;
  leads[0xf4].second_high = 0x8f;
  return leads;
}();

// Length of the valid UTF-8 sequence starting at `p` (a byte >= 0x80) and
// ending by `end`, or 0 when it is not one.
inline std::size_t utf8_sequence_length(const char* p, const char* end) {
  if (p >= end) return 0;
  const Utf8Lead lead = kUtf8Leads[static_cast<unsigned char>(*p)];
  if (lead.length == 0 || end - p < lead.length) return 0;
  const auto second = static_cast<unsigned char>(p[1]);
  if (second < lead.second_low || second > lead.second_high) return 0;
  for (std::size_t i = 2; i < lead.length; ++i) {
    if ((static_cast<unsigned char>(p[i]) & 0xc0u) != 0x80u) return 0;
  }
  return lead.length;
}

// The same for text[at].
inline std::size_t utf8_sequence_length(std::string_view text, std::size_t at) {
  return utf8_sequence_length(text.data() + at, text.data() + text.size());
}

}  // namespace sluice

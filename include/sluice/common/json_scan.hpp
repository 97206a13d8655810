#pragma once

#include <cstddef>
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

// Length of the valid UTF-8 sequence starting at text[at] (a byte >= 0x80),
// or 0 when it is not one (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF).
std::size_t utf8_sequence_length(std::string_view text, std::size_t at);

}  // namespace sluice

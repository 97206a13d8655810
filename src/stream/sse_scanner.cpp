#include "sluice/stream/sse_scanner.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <nlohmann/json.hpp>

#include "sluice/common/cpu_features.hpp"
#include "sluice/common/json_scan.hpp"
#include "sluice/openai/request_body.hpp"

namespace sluice::stream {

namespace {

using nlohmann::json;

// First reservation of a carry buffer; it grows from there as events demand.
constexpr std::size_t kInitialCarry = 4096;
// How deep a nested "usage" object is looked for (covers `response.usage` of
// the Responses API and provider extensions such as `x_groq.usage`).
constexpr int kUsageSearchDepth = 3;

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_line_end(char c) { return c == '\n' || c == '\r'; }

std::string_view trim_json_space(std::string_view text) {
  while (!text.empty() && is_json_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_json_space(text.back())) text.remove_suffix(1);
  return text;
}

// Every byte of a stream passes through here, so it is two vectorised
// scans (glibc's memchr) rather than a loop testing each byte twice: the
// first '\n', then any '\r' before it (rare: most streams end lines with
// '\n' alone).
std::size_t find_line_end(std::string_view text, std::size_t from) {
  const char* begin = text.data() + from;
  const std::size_t length = text.size() - from;
  const auto* newline = static_cast<const char*>(std::memchr(begin, '\n', length));
  const std::size_t searched = newline ? static_cast<std::size_t>(newline - begin) : length;
  if (const auto* cr = static_cast<const char*>(std::memchr(begin, '\r', searched))) {
    return from + static_cast<std::size_t>(cr - begin);
  }
  return from + searched;
}

}  // namespace

namespace detail {

namespace {

// Goes on with a line scan from `at`, with the first key start found before
// it, if any: sixteen positions at a time, then byte by byte.
DataLine scan_line_rest(std::string_view text, std::size_t at, std::size_t first_key_start) {
  const char* const data = text.data();
  const std::size_t size = text.size();
#if defined(__SSE2__)
  if (size >= 17 && at + 1 < size) {
    const __m128i newline = _mm_set1_epi8('\n');
    const __m128i carriage_return = _mm_set1_epi8('\r');
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i letter_u = _mm_set1_epi8('u');
    const __m128i letter_e = _mm_set1_epi8('e');
    // A block is the sixteen positions from `base`, each compared with the
    // byte after it too, so the last block that stays inside the text
    // starts 17 bytes before its end.
    const std::size_t last_base = size - 17;
    const auto block = [&](std::size_t base, unsigned wanted) -> std::optional<DataLine> {
      const auto load = [&](std::size_t offset) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + base + offset));
      };
      const __m128i bytes = load(0);
      const __m128i next = load(1);
      const unsigned ends =
          static_cast<unsigned>(_mm_movemask_epi8(_mm_or_si128(
              _mm_cmpeq_epi8(bytes, newline), _mm_cmpeq_epi8(bytes, carriage_return)))) &
          wanted;
      unsigned starts =
          static_cast<unsigned>(_mm_movemask_epi8(_mm_and_si128(
              _mm_cmpeq_epi8(bytes, quote),
              _mm_or_si128(_mm_cmpeq_epi8(next, letter_u), _mm_cmpeq_epi8(next, letter_e))))) &
          wanted;
      if (ends != 0) starts &= (1U << static_cast<unsigned>(__builtin_ctz(ends))) - 1;
      if (starts != 0 && first_key_start == DataLine::kNone) {
        first_key_start = base + static_cast<std::size_t>(__builtin_ctz(starts));
      }
      if (ends == 0) return std::nullopt;
      return DataLine{base + static_cast<std::size_t>(__builtin_ctz(ends)), first_key_start};
    };
    for (; at <= last_base; at += 16) {
      if (auto line = block(at, 0xFFFFU)) return *line;
    }
    // The last block overlaps the one before; only its positions from `at`
    // are new. The text's last byte has no byte after it and is left to the
    // loop below.
    if (at < size - 1) {
      if (auto line = block(last_base, (0xFFFFU << (at - last_base)) & 0xFFFFU)) return *line;
    }
    at = size - 1;
  }
#endif
  for (; at < size; ++at) {
    const char c = data[at];
    if (is_line_end(c)) return {at, first_key_start};
    if (c == '"' && first_key_start == DataLine::kNone &&
        (at + 1 == size || data[at + 1] == 'u' || data[at + 1] == 'e')) {
      first_key_start = at;
    }
  }
  return {size, first_key_start};
}

}  // namespace

DataLine scan_data_line_sse2(std::string_view text, std::size_t from) {
  return scan_line_rest(text, from, DataLine::kNone);
}

#if defined(__x86_64__)
bool has_avx2_line_scan() { return cpu_has_avx2(); }

// Thirty-two positions at a time while a whole block and the byte after it
// fit; what is left, the last 32 bytes at most, goes to the sixteen-wide scan.
__attribute__((target("avx2"))) DataLine scan_data_line_avx2(std::string_view text,
                                                             std::size_t from) {
  const char* const data = text.data();
  const std::size_t size = text.size();
  std::size_t at = from;
  std::size_t first_key_start = DataLine::kNone;
  if (size >= 33) {
    const __m256i newline = _mm256_set1_epi8('\n');
    const __m256i carriage_return = _mm256_set1_epi8('\r');
    const __m256i quote = _mm256_set1_epi8('"');
    const __m256i letter_u = _mm256_set1_epi8('u');
    const __m256i letter_e = _mm256_set1_epi8('e');
    for (; at <= size - 33; at += 32) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + at));
      const __m256i next = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + at + 1));
      const auto ends = static_cast<unsigned>(_mm256_movemask_epi8(_mm256_or_si256(
          _mm256_cmpeq_epi8(bytes, newline), _mm256_cmpeq_epi8(bytes, carriage_return))));
      auto starts = static_cast<unsigned>(_mm256_movemask_epi8(_mm256_and_si256(
          _mm256_cmpeq_epi8(bytes, quote),
          _mm256_or_si256(_mm256_cmpeq_epi8(next, letter_u), _mm256_cmpeq_epi8(next, letter_e)))));
      if (ends != 0) starts &= (1U << static_cast<unsigned>(__builtin_ctz(ends))) - 1;
      if (starts != 0 && first_key_start == DataLine::kNone) {
        first_key_start = at + static_cast<std::size_t>(__builtin_ctz(starts));
      }
      if (ends != 0) return {at + static_cast<std::size_t>(__builtin_ctz(ends)), first_key_start};
    }
  }
  return scan_line_rest(text, at, first_key_start);
}
#endif

DataLine scan_data_line(std::string_view text, std::size_t from) {
#if defined(__x86_64__)
  if (has_avx2_line_scan()) return scan_data_line_avx2(text, from);
#endif
  return scan_data_line_sse2(text, from);
}

}  // namespace detail

namespace {

// Where `one` or `other` first occurs in `text` at or after `from`; the two
// have the same length, first byte and last byte (quoted keys of the same
// length). Sixteen positions are tested at a time: a position is a
// candidate only when the first byte, either second byte and the last byte
// all match there (for quoted keys: a quote, either key's first letter, a
// quote), which is rare enough that comparing the candidates whole costs
// little. Every SSE event's payload is searched this way for two keys in one
// pass: std::string_view::find stops at every quote of a JSON payload, and
// glibc's memmem spent ~500 instructions a call setting up its shift table.
std::size_t find_either(std::string_view text, std::string_view one, std::string_view other,
                        std::size_t from = 0) {
  const std::size_t size = one.size();
  if (from > text.size() || text.size() - from < size) return std::string_view::npos;
  if (size == 0) return from;
  const char* const data = text.data();
  const auto matches_at = [&](std::size_t at) {
    return std::memcmp(data + at, one.data(), size) == 0 ||
           std::memcmp(data + at, other.data(), size) == 0;
  };
  const std::size_t last_start = text.size() - size;  // the last place a match can begin
#if defined(__SSE2__)
  if (size > 1 && last_start - from >= 15) {
    const __m128i first = _mm_set1_epi8(one[0]);
    const __m128i second_one = _mm_set1_epi8(one[1]);
    const __m128i second_other = _mm_set1_epi8(other[1]);
    const __m128i final = _mm_set1_epi8(one[size - 1]);
    // The sixteen positions from `at`. Each load stays inside the text: `at`
    // is at most last_start - 15, so the last byte's load ends at the text's
    // last byte at most, and the second byte's load before it.
    const auto block = [&](std::size_t at) {
      const auto load = [&](std::size_t offset) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + at + offset));
      };
      const __m128i seconds = load(1);
      const __m128i second =
          _mm_or_si128(_mm_cmpeq_epi8(seconds, second_one), _mm_cmpeq_epi8(seconds, second_other));
      auto candidates = static_cast<unsigned>(
          _mm_movemask_epi8(_mm_and_si128(_mm_and_si128(_mm_cmpeq_epi8(load(0), first), second),
                                          _mm_cmpeq_epi8(load(size - 1), final))));
      for (; candidates != 0; candidates &= candidates - 1) {
        const std::size_t candidate = at + static_cast<std::size_t>(__builtin_ctz(candidates));
        if (matches_at(candidate)) return candidate;
      }
      return std::string_view::npos;
    };
    std::size_t at = from;
    for (; at + 15 <= last_start; at += 16) {
      if (auto found = block(at); found != std::string_view::npos) return found;
    }
    // The last block overlaps the one before; its positions before `at`
    // matched nothing there and match nothing here.
    return at > last_start ? std::string_view::npos : block(last_start - 15);
  }
#endif
  for (std::size_t at = from; at <= last_start; ++at) {
    if (data[at] == one[0] && matches_at(at)) return at;
  }
  return std::string_view::npos;
}

std::size_t find_bytes(std::string_view text, std::string_view needle, std::size_t from = 0) {
  return find_either(text, needle, needle, from);
}

// Whether the value after a key (whose end is at `at`) is an object.
bool object_follows(std::string_view text, std::size_t at) {
  while (at < text.size() && is_json_space(text[at])) ++at;
  if (at == text.size() || text[at] != ':') return false;
  ++at;
  while (at < text.size() && is_json_space(text[at])) ++at;
  return at < text.size() && text[at] == '{';
}

// Whether `quoted_key` occurs followed by a colon and an object. A quoted key
// cannot occur inside a JSON string (its quotes would be escaped), so a hit is
// a real key somewhere in the document, or invalid JSON that fails to parse.
bool has_object_valued_key(std::string_view text, std::string_view quoted_key) {
  for (auto at = find_bytes(text, quoted_key); at != std::string_view::npos;
       at = find_bytes(text, quoted_key, at + 1)) {
    if (object_follows(text, at + quoted_key.size())) return true;
  }
  return false;
}

// The field name and colon that start an event's data lines.
constexpr std::string_view kDataField = "data:";

constexpr std::string_view kUsageKey = "\"usage\"";
constexpr std::string_view kErrorKey = "\"error\"";

// What an event's payload may hold, from one pass over it for both keys
// (the same reasoning as has_object_valued_key's).
struct KeysSeen {
  bool usage_object = false;
  bool error = false;
};

// Keys are looked for from `from` on: the caller knows no key starts before.
KeysSeen keys_seen(std::string_view text, std::size_t from) {
  KeysSeen seen;
  for (auto at = find_either(text, kUsageKey, kErrorKey, from);
       at != std::string_view::npos && !(seen.usage_object && seen.error);
       at = find_either(text, kUsageKey, kErrorKey, at + 1)) {
    if (text[at + 1] == kErrorKey[1]) {
      seen.error = true;
    } else if (object_follows(text, at + kUsageKey.size())) {
      seen.usage_object = true;
    }
  }
  return seen;
}

// The counters a usage object may carry, under the Chat Completions names
// and the Responses API's.
struct UsageCounts {
  std::optional<std::uint64_t> prompt, input, completion, output, total, cache_read, cache_creation;

  std::optional<std::uint64_t>* slot(std::string_view name) {
    if (name == "prompt_tokens") return &prompt;
    if (name == "input_tokens") return &input;
    if (name == "completion_tokens") return &completion;
    if (name == "output_tokens") return &output;
    if (name == "total_tokens") return &total;
    if (name == "cache_read_input_tokens") return &cache_read;
    if (name == "cache_creation_input_tokens") return &cache_creation;
    return nullptr;
  }

  std::optional<Usage> to_usage() const {
    // Anthropic's input_tokens leave out the prompt it read from or wrote to
    // its cache, which it bills as input all the same.
    auto prompt_count = prompt;
    if (!prompt_count && input) {
      prompt_count = *input + cache_read.value_or(0) + cache_creation.value_or(0);
    }
    auto completion_count = completion ? completion : output;
    if (!prompt_count && !completion_count && !total) return std::nullopt;
    Usage result;
    result.prompt_tokens = prompt_count.value_or(0);
    result.completion_tokens = completion_count.value_or(0);
    result.total_tokens = total.value_or(result.prompt_tokens + result.completion_tokens);
    return result;
  }
};

std::optional<Usage> usage_fields(const json& usage) {
  if (!usage.is_object()) return std::nullopt;
  UsageCounts counts;
  for (const char* name :
       {"prompt_tokens", "input_tokens", "completion_tokens", "output_tokens", "total_tokens",
        "cache_read_input_tokens", "cache_creation_input_tokens"}) {
    auto it = usage.find(name);
    if (it != usage.end() && it->is_number_unsigned())
      *counts.slot(name) = it->get<std::uint64_t>();
  }
  return counts.to_usage();
}

// A JSON number that is a non-negative integer within 64 bits, as
// nlohmann's is_number_unsigned() would say of it.
std::optional<std::uint64_t> unsigned_integer(std::string_view text) {
  if (text.empty() || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  std::uint64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// A "usage" of the object itself wins over nested ones.
std::optional<Usage> find_usage(const json& value, int depth) {
  if (value.is_object()) {
    if (auto it = value.find("usage"); it != value.end()) {
      if (auto found = usage_fields(*it)) return found;
    }
  }
  if (depth == 0) return std::nullopt;
  for (const auto& child : value) {
    if (!child.is_structured()) continue;
    if (auto found = find_usage(child, depth - 1)) return found;
  }
  return std::nullopt;
}

bool is_error_payload(const json& doc) {
  if (auto it = doc.find("error"); it != doc.end() && !it->is_null()) return true;
  auto type = doc.find("type");
  return type != doc.end() && type->is_string() && type->get_ref<const std::string&>() == "error";
}

bool is_usage_only_chunk(const json& doc) {
  auto choices = doc.find("choices");
  auto usage = doc.find("usage");
  return choices != doc.end() && choices->is_array() && choices->empty() && usage != doc.end() &&
         usage->is_object();
}

// The usage of a payload whose top level holds a usage object with
// counters (every Chat Completions and Completions usage chunk), read by a
// scan of the top-level members instead of a parse into a document; and
// whether the payload is a usage-only chunk. The payload is validated as
// the parser would (an event is dropped only if it is valid JSON), without
// building anything. nullopt for anything else (no such usage object, a
// key written with escapes, invalid JSON): the parser decides those.
struct TopLevelUsage {
  Usage usage;
  bool usage_only_chunk = false;
};

std::optional<TopLevelUsage> top_level_usage(std::string_view text) {
  std::optional<ValueSpan> usage;
  std::optional<ValueSpan> choices;
  TopLevelMembers members(text);
  std::string_view key;
  ValueSpan value;
  while (members.next(key, value)) {
    if (key.find('\\') != std::string_view::npos) return std::nullopt;
    // The last of repeated keys wins, as in a parsed document.
    if (key == "usage") {
      usage = value;
    } else if (key == "choices") {
      choices = value;
    }
  }
  if (!members.well_formed() || !trim_json_space(text.substr(members.end())).empty() || !usage ||
      text[usage->begin] != '{' || !is_valid_json(text)) {
    return std::nullopt;
  }
  const auto found = usage_from_usage_object(text.substr(usage->begin, usage->end - usage->begin));
  if (!found) return std::nullopt;
  bool empty_choices = false;
  if (choices && text[choices->begin] == '[') {
    empty_choices =
        trim_json_space(text.substr(choices->begin + 1, choices->end - choices->begin - 2))
            .empty() &&
        text[choices->end - 1] == ']';
  }
  return TopLevelUsage{*found, empty_choices};
}

void reserve_once(std::string& buffer) {
  if (buffer.capacity() < kInitialCarry) buffer.reserve(kInitialCarry);
}

}  // namespace

namespace detail {

bool UsageOnlyProbe::rules_out(std::string_view bytes) {
  static constexpr std::string_view kChoices = "choices";
  // The state is worked on in a copy: the members are written back once, so
  // that the compiler need not reload them after every byte it reads (a char
  // may alias anything). Most bytes of a payload are inside strings that
  // cannot be the "choices" key; those are skipped to the next quote or
  // backslash.
  UsageOnlyProbe state = *this;
  const char* p = bytes.data();
  const char* const last = p + bytes.size();
  while (p < last && state.stage_ != Stage::ruled_out) {
    if (state.in_string_ && !state.escaped_ && (!state.reading_key_ || state.key_mismatch_)) {
      while (p < last && *p != '"' && *p != '\\') ++p;
      if (p == last) break;
    }
    const char c = *p++;
    if (state.in_string_) {
      if (state.escaped_) {
        state.escaped_ = false;
      } else if (c == '\\') {
        state.escaped_ = true;
        state.key_mismatch_ = true;  // an escaped key is left to the full parse
      } else if (c == '"') {
        state.in_string_ = false;
        if (state.reading_key_) {
          state.reading_key_ = false;
          state.key_is_choices_ = !state.key_mismatch_ && state.key_matched_ == kChoices.size();
        }
      } else if (state.reading_key_ && !state.key_mismatch_) {
        if (state.key_matched_ < kChoices.size() && c == kChoices[state.key_matched_]) {
          ++state.key_matched_;
        } else {
          state.key_mismatch_ = true;
        }
      }
      continue;
    }
    if (is_json_space(c)) continue;
    switch (state.stage_) {
      case Stage::before_object:
        if (c == '{') {
          state.stage_ = Stage::in_object;
          state.depth_ = 1;
          state.expect_key_ = true;
        } else if (static_cast<unsigned char>(c) < 0x80) {
          // A byte-order mark (non-ASCII) may still precede the object.
          state.stage_ = Stage::ruled_out;
        }
        break;
      case Stage::choices_value:
        if (c == '[') {
          state.stage_ = Stage::choices_first_item;
          ++state.depth_;
        } else {
          state.stage_ = Stage::ruled_out;
        }
        break;
      case Stage::choices_first_item:
        if (c == ']') {
          state.stage_ = Stage::in_object;
          --state.depth_;
        } else {
          state.stage_ = Stage::ruled_out;
        }
        break;
      case Stage::after_object:
        // Trailing bytes make the payload invalid JSON, which is never stripped.
        state.stage_ = Stage::ruled_out;
        break;
      case Stage::in_object:
        if (c == '"') {
          state.in_string_ = true;
          if (state.depth_ == 1 && state.expect_key_) {
            state.reading_key_ = true;
            state.expect_key_ = false;
            state.key_matched_ = 0;
            state.key_mismatch_ = false;
          }
        } else if (c == '{' || c == '[') {
          ++state.depth_;
        } else if (c == '}' || c == ']') {
          if (--state.depth_ == 0) state.stage_ = Stage::after_object;
        } else if (c == ',' && state.depth_ == 1) {
          state.expect_key_ = true;
          state.key_is_choices_ = false;
        } else if (c == ':' && state.depth_ == 1 && state.key_is_choices_) {
          state.key_is_choices_ = false;
          state.stage_ = Stage::choices_value;
        }
        break;
      case Stage::ruled_out:
        break;
    }
  }
  *this = state;
  return stage_ == Stage::ruled_out;
}

}  // namespace detail

void SseScanner::feed(std::string_view piece, std::vector<std::string_view>& out) {
  // What was handed out before is written by now: the held event's buffer
  // moves to the front, and the others are free again.
  if (handed_out_ > 0) {
    if (handed_out_ < held_.size()) {
      std::swap(held_[0], held_[handed_out_]);
    } else {
      held_[0]->clear();
    }
    handed_out_ = 0;
  }
  scan(piece, out);
}

void SseScanner::feed_more(std::string_view piece, std::vector<std::string_view>& out) {
  scan(piece, out);
}

void SseScanner::scan(std::string_view piece, std::vector<std::string_view>& out) {
  piece_ = piece;
  out_ = &out;
  // An event held over from the previous piece comes first; the piece bytes
  // are passed on only once it is decided.
  run_start_ = holding_ ? kNoRun : 0;
  hold_start_ = 0;
  value_continued_ = line_state_ == LineState::value;

  std::size_t i = 0;
  if (!in_block_ && line_state_ == LineState::start && !after_cr_) i = take_whole_data_events();
  const std::size_t size = piece.size();
  while (i < size) {
    const char c = piece[i];
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') {
        if (swallow_lf_) run_start_ = i + 1;
        swallow_lf_ = false;
        ++i;
        continue;
      }
    }
    swallow_lf_ = false;
    if (!in_block_) begin_block(i);
    switch (line_state_) {
      case LineState::start:
        if (is_line_end(c)) {
          end_line(i);
          ++i;
        } else if (c == ':') {
          line_state_ = LineState::skip;  // a comment
          ++i;
        } else if (size - i >= kDataField.size() &&
                   piece.substr(i, kDataField.size()) == kDataField) {
          i = take_data_line(i);
        } else {
          name_length_ = 0;
          line_state_ = LineState::name;
        }
        break;
      case LineState::name:
        if (is_line_end(c)) {
          end_line(i);
        } else if (c == ':') {
          start_field();
          line_state_ = LineState::space;
        } else {
          if (name_length_ < kNameCapacity) name_[name_length_] = c;
          ++name_length_;
        }
        ++i;
        break;
      case LineState::space:
        // One space after the colon is not part of the value.
        line_state_ = LineState::value;
        value_continued_ = false;
        if (c == ' ') ++i;
        break;
      case LineState::value:
      case LineState::skip: {
        if (line_state_ == LineState::value && field_ == Field::data) {
          i = take_data_value(i);
          break;
        }
        const std::size_t end = find_line_end(piece, i);
        if (line_state_ == LineState::value) take_value(piece.substr(i, end - i), end < size);
        if (end == size) {
          i = size;
        } else {
          end_line(end);
          i = end + 1;
        }
        break;
      }
    }
  }
  end_of_piece();
}

std::size_t SseScanner::take_whole_data_events() {
  const std::string_view piece = piece_;
  const std::size_t size = piece.size();
  std::size_t at = 0;
  while (size - at > kDataField.size() && piece.compare(at, kDataField.size(), kDataField) == 0) {
    std::size_t value = at + kDataField.size();
    if (piece[value] == ' ' && ++value == size) break;
    const auto line = detail::scan_data_line(piece, value);
    if (size - line.end < 2 || piece[line.end] != '\n' || piece[line.end + 1] != '\n') break;
    ++events_;
    const auto payload = piece.substr(value, line.end - value);
    const std::size_t end = line.end + 2;
    bool dropped = inspect(payload, strip_, line.key_from(value));
    if (dropped) {
      // The probe has the last word, as it has for an event read in steps.
      probe_.reset();
      dropped = !probe_.rules_out(payload);
    }
    if (dropped) {
      hold_start_ = at;
      drop_held(end, false);
    }
    at = end;
  }
  return at;
}

std::size_t SseScanner::take_data_line(std::size_t start) {
  const std::string_view piece = piece_;
  const std::size_t size = piece.size();
  field_ = Field::data;
  start_data_line();
  std::size_t value = start + kDataField.size();
  if (value == size) {
    line_state_ = LineState::space;  // whether a space follows is the next piece's to tell
    return size;
  }
  if (piece[value] == ' ') ++value;
  line_state_ = LineState::value;
  value_continued_ = false;
  if (value == size) return size;
  std::size_t next = take_data_value(value);
  // The blank line that ends the event, nearly always right after.
  if (next < size && !after_cr_ && piece[next] == '\n') {
    swallow_lf_ = false;
    end_line(next);
    ++next;
  }
  return next;
}

std::size_t SseScanner::take_data_value(std::size_t value) {
  const std::string_view piece = piece_;
  const auto line = detail::scan_data_line(piece, value);
  take_data(piece.substr(value, line.end - value), line.end < piece.size(), line.key_from(value));
  if (line.end == piece.size()) return piece.size();
  end_line(line.end);
  return line.end + 1;
}

void SseScanner::finish(std::vector<std::string_view>& out) {
  piece_ = {};
  out_ = &out;
  if (holding_) {
    run_start_ = kNoRun;
    release_held();
  }
  // The incomplete trailing event is dropped unread, as SSE clients drop it.
  reset_block();
  line_state_ = LineState::start;
  after_cr_ = false;
  swallow_lf_ = false;
  out_ = nullptr;
}

void SseScanner::begin_block(std::size_t position) {
  in_block_ = true;
  if (strip_) {
    holding_ = true;
    hold_start_ = position;
    probe_.reset();
  }
}

void SseScanner::start_field() {
  const std::string_view name(name_, std::min(name_length_, kNameCapacity));
  if (name_length_ == 4 && name == "data") {
    field_ = Field::data;
    start_data_line();
  } else if (name_length_ == 5 && name == "event") {
    field_ = Field::event;
    event_type_length_ = 0;
  } else {
    field_ = Field::other;
  }
}

void SseScanner::end_line(std::size_t position) {
  const char terminator = piece_[position];
  after_cr_ = terminator == '\r';
  switch (line_state_) {
    case LineState::start:
      dispatch(position + 1, after_cr_);
      break;
    case LineState::name:
      // A field name without a colon has an empty value.
      start_field();
      value_continued_ = false;
      take_value({}, true);
      [[fallthrough]];
    case LineState::space:
    case LineState::value:
      if (field_ == Field::event) {
        // The last `event:` line names the event.
        event_is_error_ = event_type_length_ == 5 && std::string_view(event_type_, 5) == "error";
      }
      break;
    case LineState::skip:
      break;
  }
  line_state_ = LineState::start;
}

void SseScanner::take_value(std::string_view bytes, bool line_complete) {
  if (field_ == Field::data) {
    take_data(bytes, line_complete, 0);
  } else if (field_ == Field::event) {
    for (const char c : bytes) {
      if (event_type_length_ < kNameCapacity) event_type_[event_type_length_] = c;
      ++event_type_length_;
    }
  }
}

void SseScanner::start_data_line() {
  ++data_lines_;
  if (data_lines_ == 1) return;
  // Data lines join with '\n'.
  move_data_to_buffer();
  append_data("\n");
}

void SseScanner::take_data(std::string_view bytes, bool line_complete, std::size_t key_from) {
  if (overflowed_) return;
  if (line_complete && !value_continued_ && data_lines_ == 1 && !data_in_buffer_) {
    data_view_ = bytes;  // the whole data of the event so far, inside this piece
    data_key_from_ = key_from;
    return;
  }
  move_data_to_buffer();
  // A quote that ends one part counts as a possible key start in it, so the
  // first start among the parts is the first in the joined data too.
  if (data_key_from_ == detail::DataLine::kNone && key_from != detail::DataLine::kNone) {
    data_key_from_ = data_.size() + key_from;
  }
  append_data(bytes);
}

void SseScanner::move_data_to_buffer() {
  if (data_in_buffer_ || overflowed_) return;
  data_in_buffer_ = true;
  data_.clear();
  const auto view = data_view_;
  data_view_ = {};
  append_data(view);
}

void SseScanner::append_data(std::string_view bytes) {
  if (overflowed_) return;
  if (data_.size() + bytes.size() > max_carry_) {
    give_up_on_event();
    return;
  }
  reserve_once(data_);
  data_.append(bytes);
}

void SseScanner::give_up_on_event() {
  overflowed_ = true;
  data_.clear();
  data_view_ = {};
  data_in_buffer_ = false;
  if (holding_) release_held();
}

std::string& SseScanner::hold_buffer() {
  if (handed_out_ == held_.size()) held_.push_back(std::make_unique<std::string>());
  return *held_[handed_out_];
}

void SseScanner::release_held() {
  holding_ = false;
  if (run_start_ != kNoRun) return;  // the run up to the event's start carries on through it
  if (handed_out_ < held_.size() && !held_[handed_out_]->empty()) {
    out_->push_back(*held_[handed_out_]);
    ++handed_out_;
    if (handed_out_ < held_.size()) held_[handed_out_]->clear();
  }
  run_start_ = 0;
}

void SseScanner::drop_held(std::size_t end, bool ended_with_cr) {
  ++stripped_events_;
  holding_ = false;
  if (run_start_ == kNoRun) {
    if (handed_out_ < held_.size()) held_[handed_out_]->clear();
  } else if (hold_start_ > run_start_) {
    out_->push_back(piece_.substr(run_start_, hold_start_ - run_start_));
  }
  run_start_ = end;
  swallow_lf_ = ended_with_cr;
}

void SseScanner::dispatch(std::size_t end, bool ended_with_cr) {
  bool usage_only = false;
  if (data_lines_ > 0) {
    ++events_;
    if (!overflowed_) {
      usage_only = inspect(data(), holding_, data_key_from_);
    }
  }
  if (event_is_error_) saw_error_ = true;
  if (holding_) {
    // The probe has the last word, as it would have had reading the event
    // as it came (a repeated "choices", bytes after the object): whether an
    // event is dropped must not depend on where the reads split it.
    if (usage_only && !probe_.rules_out(data().substr(std::min(probed_, data().size())))) {
      drop_held(end, ended_with_cr);
    } else {
      release_held();
    }
  }
  reset_block();
}

bool SseScanner::inspect(std::string_view payload, bool want_usage_only, std::size_t key_from) {
  const auto text = trim_json_space(payload);
  if (text == "[DONE]") {
    saw_done_ = true;
    return false;
  }
  if (key_from == detail::DataLine::kNone) return false;
  // Where the key may start in the trimmed text.
  const auto trimmed = static_cast<std::size_t>(text.data() - payload.data());
  const auto [may_have_usage, may_have_error] =
      keys_seen(text, key_from > trimmed ? key_from - trimmed : 0);
  if (!may_have_usage && !may_have_error) return false;
  if (!may_have_error) {
    if (const auto found = top_level_usage(text)) {
      take_usage(found->usage);
      return want_usage_only && found->usage_only_chunk;
    }
  }
  const auto doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (!doc.is_object()) return false;
  if (may_have_error && is_error_payload(doc)) saw_error_ = true;
  if (!may_have_usage) return false;
  if (auto found = find_usage(doc, kUsageSearchDepth)) take_usage(*found);
  return want_usage_only && is_usage_only_chunk(doc);
}

void SseScanner::take_usage(const Usage& found) {
  // Anthropic's streams report in parts: the input in message_start, the
  // output in message_delta. A later report without input keeps the input
  // reported before it.
  if (usage_ && found.prompt_tokens == 0 && usage_->prompt_tokens > 0) {
    const auto input = usage_->prompt_tokens;
    usage_ = Usage{input, found.completion_tokens, input + found.completion_tokens};
    return;
  }
  usage_ = found;
}

void SseScanner::end_of_piece() {
  const std::size_t size = piece_.size();
  // Views into the piece end with this call. This may hit the cap and
  // release the held event, so it goes before the output is settled.
  if (in_block_ && data_lines_ > 0) move_data_to_buffer();
  // An event that goes on into the next piece is released now if what came
  // of its data so far rules out a usage-only chunk. One that ended in this
  // piece was decided at its end, so the probe reads only the events that
  // straddle reads, not every event's bytes.
  if (holding_ && !overflowed_) {
    if (probe_.rules_out(std::string_view(data_).substr(probed_))) release_held();
    probed_ = data_.size();
  }
  if (holding_) {
    auto& held = hold_buffer();
    if (held.size() + (size - hold_start_) > max_carry_) {
      give_up_on_event();
    } else {
      if (run_start_ != kNoRun && hold_start_ > run_start_) {
        out_->push_back(piece_.substr(run_start_, hold_start_ - run_start_));
      }
      reserve_once(held);
      held.append(piece_.substr(hold_start_));
    }
  }
  if (!holding_ && run_start_ < size) out_->push_back(piece_.substr(run_start_));
  piece_ = {};
  out_ = nullptr;
}

void SseScanner::reset_block() {
  in_block_ = false;
  holding_ = false;
  event_is_error_ = false;
  overflowed_ = false;
  data_lines_ = 0;
  data_view_ = {};
  data_key_from_ = detail::DataLine::kNone;
  probed_ = 0;
  data_in_buffer_ = false;
  data_.clear();
  event_type_length_ = 0;
}

std::optional<Usage> usage_from_usage_object(std::string_view usage_object) {
  const auto text = trim_json_space(usage_object);
  UsageCounts counts;
  bool well_formed = for_each_top_level_member(text, [&](std::string_view key, ValueSpan value) {
    if (auto* slot = counts.slot(key)) {
      *slot = unsigned_integer(text.substr(value.begin, value.end - value.begin));
    }
  });
  if (!well_formed) return std::nullopt;
  return counts.to_usage();
}

std::optional<Usage> usage_from_json_body(std::string_view body) {
  const auto text = trim_json_space(body);
  if (!has_object_valued_key(text, kUsageKey)) return std::nullopt;
  const auto doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (!doc.is_object()) return std::nullopt;
  return find_usage(doc, kUsageSearchDepth);
}

}  // namespace sluice::stream

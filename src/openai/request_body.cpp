#include "sluice/openai/request_body.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <limits>
#include <nlohmann/json.hpp>

#include "sluice/common/cpu_features.hpp"
#include "sluice/common/json_scan.hpp"

namespace sluice {

namespace {

// The escapes of two bytes: a backslash and one of these.
bool is_short_escape(char c) {
  switch (c) {
    case '"':
    case '\\':
    case '/':
    case 'b':
    case 'f':
    case 'n':
    case 'r':
    case 't':
      return true;
    default:
      return false;
  }
}

#if defined(__SSE2__)
// Which of the 16 bytes at `p` a string's scan stops at, bit by bit: a
// quote, a backslash, a control byte or one from 0x80 up.
inline unsigned string_stops_in_16(const char* p) {
  const __m128i block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  // Signed: bytes from 0x80 up are negative, so below the space too.
  const __m128i stops = _mm_or_si128(_mm_cmplt_epi8(block, _mm_set1_epi8(0x20)),
                                     _mm_or_si128(_mm_cmpeq_epi8(block, _mm_set1_epi8('"')),
                                                  _mm_cmpeq_epi8(block, _mm_set1_epi8('\\'))));
  return static_cast<unsigned>(_mm_movemask_epi8(stops));
}
#endif

// Skips the bytes a JSON string holds as they are (printable ASCII other
// than '"' and '\\'); returns the first that needs a closer look, or `end`.
// Message contents are most of a request body: 16 bytes are tested at a
// time. A pasted document has an escape (\n, \") every few dozen bytes, so
// the two-byte escapes are stepped over inside the block too, and set
// `escaped`; a \u escape or anything doubtful is left to the caller.
const char* skip_plain_string_bytes_sse2(const char* p, const char* end, bool& escaped) {
#if defined(__SSE2__)
  while (end - p >= 16) {
    auto mask = string_stops_in_16(p);
    std::size_t advance = 16;
    while (mask != 0) {
      const auto index = static_cast<unsigned>(__builtin_ctz(mask));
      const char* stop = p + index;
      if (*stop != '\\' || end - stop < 2 || !is_short_escape(stop[1])) return stop;
      escaped = true;
      if (index == 15) {
        advance = 17;  // the escaped byte is the next block's first
        break;
      }
      // The backslash and the byte it escapes, whatever that byte's own bit.
      mask &= ~(3U << index);
    }
    p += advance;
  }
#else
  (void)escaped;
  // Eight at a time (SWAR): each test sets a byte's top bit where it holds.
  constexpr std::uint64_t kOnes = 0x0101010101010101ULL;
  constexpr std::uint64_t kHighs = 0x8080808080808080ULL;
  while (end - p >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, sizeof word);
    const std::uint64_t quote = word ^ (kOnes * '"');
    const std::uint64_t backslash = word ^ (kOnes * '\\');
    const std::uint64_t flagged = ((quote - kOnes) & ~quote) | ((backslash - kOnes) & ~backslash) |
                                  (word - kOnes * 0x20) | word;
    if ((flagged & kHighs) != 0) break;
    p += 8;
  }
#endif
  while (p < end) {
    const auto c = static_cast<unsigned char>(*p);
    if (c < 0x20 || c == '"' || c == '\\' || c >= 0x80) break;
    ++p;
  }
  return p;
}

#if defined(__x86_64__)
// 32 bytes of `value`.
__attribute__((target("avx2"))) inline __m256i bytes(int value) {
  return _mm256_set1_epi8(static_cast<char>(value));
}

// Where `back1`, the byte before each of `block`'s, is `first` and the byte
// itself is out of the range it allows (`out_of_range`).
__attribute__((target("avx2"))) inline __m256i after_first_byte(__m256i back1, int first,
                                                                __m256i out_of_range) {
  return _mm256_and_si256(_mm256_cmpeq_epi8(back1, bytes(first)), out_of_range);
}

// Whether the 32 bytes of `block` break UTF-8 (RFC 3629), read on from
// `before`, the 32 bytes ahead of them: a continuation byte where none is
// due or none where one is, a byte no sequence has (C0, C1, F5 and up), or
// a second byte outside its first byte's range (overlong forms, surrogates,
// code points above U+10FFFF). ASCII bytes pass.
__attribute__((target("avx2"))) inline bool breaks_utf8(__m256i block, __m256i before) {
  const __m256i zero = _mm256_setzero_si256();
  // The bytes one, two and three places back, across the two halves.
  const __m256i joined = _mm256_permute2x128_si256(before, block, 0x21);
  const __m256i back1 = _mm256_alignr_epi8(block, joined, 15);
  const __m256i back2 = _mm256_alignr_epi8(block, joined, 14);
  const __m256i back3 = _mm256_alignr_epi8(block, joined, 13);
  // Signed, 0x80..0xBF are the bytes below -64.
  const __m256i continuation = _mm256_cmpgt_epi8(bytes(-64), block);
  // Due after a first byte of two or more (C0 up), as the third byte of
  // three or more (E0 up) and as the fourth of four (F0 up).
  const __m256i due =
      _mm256_cmpgt_epi8(_mm256_or_si256(_mm256_or_si256(_mm256_subs_epu8(back1, bytes(0xbf)),
                                                        _mm256_subs_epu8(back2, bytes(0xdf))),
                                        _mm256_subs_epu8(back3, bytes(0xef))),
                        zero);
  __m256i broken = _mm256_xor_si256(continuation, due);
  broken =
      _mm256_or_si256(broken, _mm256_cmpeq_epi8(_mm256_and_si256(block, bytes(0xfe)), bytes(0xc0)));
  broken = _mm256_or_si256(broken, _mm256_cmpgt_epi8(_mm256_subs_epu8(block, bytes(0xf4)), zero));
  // Second bytes, as signed numbers: E0 needs A0 up, ED at most 9F, F0 90
  // up, F4 at most 8F.
  broken =
      _mm256_or_si256(broken, after_first_byte(back1, 0xe0, _mm256_cmpgt_epi8(bytes(-96), block)));
  broken =
      _mm256_or_si256(broken, after_first_byte(back1, 0xed, _mm256_cmpgt_epi8(block, bytes(-97))));
  broken =
      _mm256_or_si256(broken, after_first_byte(back1, 0xf0, _mm256_cmpgt_epi8(bytes(-112), block)));
  broken =
      _mm256_or_si256(broken, after_first_byte(back1, 0xf4, _mm256_cmpgt_epi8(block, bytes(-113))));
  return _mm256_testz_si256(broken, broken) == 0;
}

// breaks_utf8 over a step's 64 bytes, before which no sequence is open (so
// the bytes ahead of them may be taken for ASCII). Out of line: its
// constants would take the registers of the ASCII loop around it, which
// then reloaded its own from memory on every step.
__attribute__((target("avx2"), noinline)) bool breaks_utf8_in_step(__m256i first, __m256i second) {
  return breaks_utf8(first, _mm256_setzero_si256()) || breaks_utf8(second, first);
}

// Where a UTF-8 sequence that began in the three bytes before `p` starts,
// when it is not whole before `p`; nullptr when none is open. The bytes
// before `p` must have passed breaks_utf8.
inline const char* open_utf8_sequence(const char* p) {
  const auto back = [&](int places) { return static_cast<unsigned char>(p[-places]); };
  if (back(1) >= 0xc0) return p - 1;
  if (back(2) >= 0xe0) return p - 2;
  if (back(3) >= 0xf0) return p - 3;
  return nullptr;
}

// 32 bytes of a step, and what tells which of them the step may pass over
// (each a byte of all ones or of zeros): whether the byte before each is a
// backslash, and whether each is one of the escape bytes the steps read. A
// byte after a backslash passes where it makes a two-byte escape with it;
// any other, where it is printable ASCII but the quote (`passing`). A
// backslash itself passes, its escape being told at the byte after it; a
// backslash after a backslash fails, which leaves runs of them, whose
// escapes pair up by count, to the caller.
struct StepBlock {
  __m256i bytes;
  __m256i after_backslash;
  __m256i escape_byte;
};

__attribute__((target("avx2"))) inline StepBlock step_block(const char* p) {
  // \" \/ \f \n \r \t: halving each byte, rounded up, gives the six
  // escape bytes six low nibbles, so one lookup names the one a byte may
  // be and a compare tells whether it is. \b shares \"'s nibble and is left
  // to the caller, as \\ and \u are. Unused entries hold 0xFF, which no
  // byte that looks them up is: 0xFF halves to 0x80, whose lookup gives 0.
  const __m256i by_half =
      _mm256_setr_epi8(-1, '"', -1, 'f', -1, -1, -1, 'n', '/', 'r', 't', -1, -1, -1, -1, -1,  //
                       -1, '"', -1, 'f', -1, -1, -1, 'n', '/', 'r', 't', -1, -1, -1, -1, -1);
  const __m256i block = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i before = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p - 1));
  const __m256i half = _mm256_avg_epu8(block, _mm256_setzero_si256());
  return {block, _mm256_cmpeq_epi8(before, bytes('\\')),
          _mm256_cmpeq_epi8(block, _mm256_shuffle_epi8(by_half, half))};
}

// StepBlock's verdict on its bytes. `plain` tells the bytes that pass
// where no backslash is before them.
__attribute__((target("avx2"))) inline __m256i passing(const StepBlock& block, __m256i plain) {
  return _mm256_blendv_epi8(plain, block.escape_byte, block.after_backslash);
}

// Printable ASCII but the quote: flipping bit 1 makes the quote 0x20 and
// keeps 0x00..0x1F below it; from 0x80 up, bytes are negative.
__attribute__((target("avx2"))) inline __m256i plain_ascii(__m256i block) {
  return _mm256_cmpgt_epi8(_mm256_xor_si256(block, bytes(0x02)), bytes(0x20));
}

// The same with the bytes from 0x80 up (checked as UTF-8 apart): flipping
// bit 7 too moves them above the printable ones, compared signed.
__attribute__((target("avx2"))) inline __m256i plain_or_high(__m256i block) {
  return _mm256_cmpgt_epi8(_mm256_xor_si256(block, bytes(0x82)), bytes(0x20 ^ 0x80));
}

// Which of the 32 bytes at `p` pass, bytes from 0x80 up failing.
__attribute__((target("avx2"))) inline __m256i passes_as_ascii(const char* p) {
  const StepBlock block = step_block(p);
  return passing(block, plain_ascii(block.bytes));
}

// Whether all the 128 bytes at `p` pass, with no byte from 0x80 up.
__attribute__((target("avx2"))) inline bool two_steps_pass_as_ascii(const char* p) {
  const __m256i passes =
      _mm256_and_si256(_mm256_and_si256(passes_as_ascii(p), passes_as_ascii(p + 32)),
                       _mm256_and_si256(passes_as_ascii(p + 64), passes_as_ascii(p + 96)));
  return _mm256_testc_si256(passes, _mm256_set1_epi8(-1)) != 0;
}

// skip_plain_string_bytes_sse2's task, 64 bytes at a time. A pasted
// document has an escape in nearly every 64 bytes, so a step takes its
// two-byte escapes in the same few vector operations as its plain bytes,
// without a mask per kind of byte: each byte is checked against the byte
// before it (StepBlock). A step that fails is looked at again: bytes from
// 0x80 up are validated as UTF-8 in vectors, and the caller gets the first
// byte it must read for itself (an escape at its backslash). Text in other
// scripts than Latin fails every step and is validated that way.
__attribute__((target("avx2"))) const char* skip_plain_string_bytes_avx2(const char* p,
                                                                         const char* end,
                                                                         bool& escaped) {
  // The byte before `p` was read by the caller; a backslash there is one
  // that a backslash escaped, and does not escape the byte at `p`, which
  // the steps would take it to. Once that byte is past, no step starts
  // after a backslash that is not an escape's first byte.
  if (p < end && p[-1] == '\\') {
    const auto c = static_cast<unsigned char>(*p);
    if (c < 0x20 || c == '"' || c == '\\' || c >= 0x80) return p;
    ++p;
  }
  if (end - p < 64) return skip_plain_string_bytes_sse2(p, end, escaped);
  // The steps do not tell whether they passed an escape: a string they read
  // is taken to hold one, which costs a long key or model a decode that
  // gives back the same text.
  escaped = true;
  const __m256i all = _mm256_set1_epi8(-1);
  const char* const last_step = end - 64;
  const char* const last_pair = end - p >= 128 ? end - 128 : p - 1;
  // Two steps are tested at once while they pass. From a pair that fails,
  // steps go one at a time until one passes the first test again: text in
  // another script fails every step, and would pay for a pair's test too.
  bool one_at_a_time = false;
  while (p <= last_step) {
    if (!one_at_a_time) {
      while (p <= last_pair && two_steps_pass_as_ascii(p)) p += 128;
      if (p > last_step) break;
    }
    const StepBlock first = step_block(p);
    const StepBlock second = step_block(p + 32);
    __m256i first_passes = passing(first, plain_ascii(first.bytes));
    __m256i second_passes = passing(second, plain_ascii(second.bytes));
    if (_mm256_testc_si256(_mm256_and_si256(first_passes, second_passes), all) != 0) {
      p += 64;
      one_at_a_time = false;
      continue;
    }
    one_at_a_time = true;
    const std::uint64_t non_ascii =
        static_cast<std::uint32_t>(_mm256_movemask_epi8(first.bytes)) |
        std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_epi8(second.bytes))} << 32;
    if (non_ascii != 0) {
      if (breaks_utf8_in_step(first.bytes, second.bytes)) {
        // An escape's byte first, read with its backslash; then nothing but
        // plain ASCII would leave the break after it.
        if (p[-1] == '\\') return p - 1;
        while (static_cast<unsigned char>(*p) - 0x20u < 0x60u && *p != '"' && *p != '\\') ++p;
        return p;
      }
      first_passes = passing(first, plain_or_high(first.bytes));
      second_passes = passing(second, plain_or_high(second.bytes));
    }
    const std::uint64_t failing =
        ~(static_cast<std::uint32_t>(_mm256_movemask_epi8(first_passes)) |
          std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_epi8(second_passes))} << 32);
    if (failing != 0) {
      const char* stop = p + __builtin_ctzll(failing);
      // An escaped byte is looked at with its backslash.
      return stop[-1] == '\\' ? stop - 1 : stop;
    }
    p += 64;
    // A sequence the step's end cut is read again by the next, whole.
    if ((non_ascii >> 61) != 0) {
      if (const char* open = open_utf8_sequence(p)) p = open;
    }
  }
  // An escape's first byte ends the steps: its second is read with it. (No
  // backslash before `p` starts one unless a step passed it.)
  if (p != end && p[-1] == '\\') return p - 1;
  return skip_plain_string_bytes_sse2(p, end, escaped);
}
#endif

// The best of the above this processor runs. Keys, roles and model names
// end within their first 16 bytes, which are tested here, inline, before
// either scan is called.
inline const char* skip_plain_string_bytes(const char* p, const char* end, bool& escaped,
                                           bool wide) {
#if defined(__SSE2__)
  if (end - p >= 16) {
    if (const unsigned stops = string_stops_in_16(p); stops != 0) {
      const char* const stop = p + __builtin_ctz(stops);
#if defined(__x86_64__)
      // Text in another script: the wide scan validates it in blocks.
      if (wide && static_cast<unsigned char>(*stop) >= 0x80) {
        return skip_plain_string_bytes_avx2(stop, end, escaped);
      }
#endif
      return stop;
    }
    p += 16;
  }
#endif
#if defined(__x86_64__)
  if (wide) return skip_plain_string_bytes_avx2(p, end, escaped);
#else
  (void)wide;
#endif
  return skip_plain_string_bytes_sse2(p, end, escaped);
}

using json = nlohmann::json;

// The request fields the gateway reads; the slot a value fills is known from
// its key before the value is scanned.
enum class Field {
  none,
  model,
  stream,
  stream_options,
  include_usage,  // inside stream_options
  temperature,
  cache,
  max_tokens,  // max_tokens, max_completion_tokens or max_output_tokens
};

Field top_level_field(std::string_view key) {
  switch (key.size()) {
    case 5:
      if (key == "model") return Field::model;
      if (key == "cache") return Field::cache;
      break;
    case 6:
      if (key == "stream") return Field::stream;
      break;
    case 10:
      if (key == "max_tokens") return Field::max_tokens;
      break;
    case 11:
      if (key == "temperature") return Field::temperature;
      break;
    case 14:
      if (key == "stream_options") return Field::stream_options;
      break;
    case 17:
      if (key == "max_output_tokens") return Field::max_tokens;
      break;
    case 21:
      if (key == "max_completion_tokens") return Field::max_tokens;
      break;
    default:
      break;
  }
  return Field::none;
}

// One validating pass over the body, to the same verdicts as a strict JSON
// parser (nlohmann::json's, which the fuzz target compares it with): RFC 8259
// grammar, UTF-8 checked byte by byte, escapes and surrogate pairs checked,
// numbers that overflow a double refused, a leading byte order mark skipped.
// It builds nothing: only the fields above are kept, the last of repeated keys
// winning as in a parsed document.
class BodyScanner {
 public:
  BodyScanner(std::string_view text, int max_depth, detail::StringScan strings)
      : begin_(text.data()),
        at_(text.data()),
        end_(text.data() + text.size()),
        max_depth_(max_depth),
        wide_strings_(strings == detail::StringScan::avx2) {}

  // False when the body is not JSON or nests too deep (`too_deep` tells).
  bool scan() {
    if (end_ - at_ >= 3 && static_cast<unsigned char>(at_[0]) == 0xEF &&
        static_cast<unsigned char>(at_[1]) == 0xBB && static_cast<unsigned char>(at_[2]) == 0xBF) {
      at_ += 3;
      // The splice cannot keep a byte order mark in front of the body.
      spliceable_ = false;
    }
    skip_whitespace();
    if (at_ < end_ && *at_ == '{') top_is_object = true;
    if (!value(0, Field::none)) return false;
    skip_whitespace();
    return at_ == end_;
  }

  RequestBody body;
  bool top_is_object = false;
  bool has_model = false;
  bool model_is_string = false;
  bool too_deep = false;

 private:
  void skip_whitespace() {
    while (at_ < end_ && (*at_ == ' ' || *at_ == '\n' || *at_ == '\r' || *at_ == '\t')) ++at_;
  }

  // A value whose key put it in `field`; `depth` counts the containers
  // around it.
  bool value(int depth, Field field) {
    if (at_ == end_) return false;
    switch (*at_) {
      case '{':
        return object(depth + 1, field);
      case '[':
        return array(depth + 1, field);
      case '"':
        return string_value(field);
      case 't':
        return literal("true", field, true);
      case 'f':
        return literal("false", field, false);
      case 'n':
        return literal("null", field, std::nullopt);
      default:
        return number(field);
    }
  }

  bool enter(int depth) {
    if (depth <= max_depth_) return true;
    too_deep = true;
    return false;
  }

  bool object(int depth, Field field) {
    if (!enter(depth)) return false;
    other_value(field);
    const bool options = field == Field::stream_options;
    if (options) body.has_stream_options = true;
    ++at_;  // '{'
    skip_whitespace();
    if (at_ < end_ && *at_ == '}') {
      ++at_;
      return true;
    }
    for (;;) {
      if (at_ == end_ || *at_ != '"') return false;
      const char* key_begin = at_ + 1;
      bool escaped = false;
      if (!string(escaped)) return false;
      Field member = Field::none;
      if (depth == 1 || options) {
        std::string_view key(key_begin, static_cast<std::size_t>(at_ - 1 - key_begin));
        std::string decoded;
        if (escaped) {
          decode_json_string(key, decoded);
          key = decoded;
        }
        if (depth == 1) {
          member = top_level_field(key);
        } else if (key == "include_usage") {
          member = Field::include_usage;
        }
        note_key(member);
      }
      skip_whitespace();
      if (at_ == end_ || *at_ != ':') return false;
      ++at_;
      skip_whitespace();
      if (!value(depth, member)) return false;
      skip_whitespace();
      if (at_ == end_) return false;
      if (*at_ == ',') {
        ++at_;
        skip_whitespace();
        continue;
      }
      if (*at_ != '}') return false;
      ++at_;
      return true;
    }
  }

  bool array(int depth, Field field) {
    if (!enter(depth)) return false;
    other_value(field);
    ++at_;  // '['
    skip_whitespace();
    if (at_ < end_ && *at_ == ']') {
      ++at_;
      return true;
    }
    for (;;) {
      if (!value(depth, Field::none)) return false;
      skip_whitespace();
      if (at_ == end_) return false;
      if (*at_ == ',') {
        ++at_;
        skip_whitespace();
        continue;
      }
      if (*at_ != ']') return false;
      ++at_;
      return true;
    }
  }

  bool literal(std::string_view word, Field field, std::optional<bool> boolean) {
    if (static_cast<std::size_t>(end_ - at_) < word.size() ||
        std::string_view(at_, word.size()) != word) {
      return false;
    }
    at_ += word.size();
    // Whatever the field held is replaced; then a boolean field takes it.
    other_value(field);
    if (!boolean) return true;
    if (field == Field::stream) {
      body.stream = *boolean;
    } else if (field == Field::include_usage) {
      body.include_usage = *boolean;
    } else if (field == Field::cache) {
      body.cache = *boolean;
    }
    return true;
  }

  bool string_value(Field field) {
    const char* literal_begin = at_;
    bool escaped = false;
    if (!string(escaped)) return false;
    if (field != Field::model) {
      other_value(field);
      return true;
    }
    std::string_view raw(literal_begin + 1, static_cast<std::size_t>(at_ - literal_begin - 2));
    body.model.clear();
    if (escaped) {
      decode_json_string(raw, body.model);
    } else {
      body.model.assign(raw);
    }
    model_is_string = true;
    if (spliceable_) {
      body.model_value = ValueSpan{static_cast<std::size_t>(literal_begin - begin_),
                                   static_cast<std::size_t>(at_ - begin_)};
    }
    return true;
  }

  // A string literal from its opening quote; leaves `at_` past the closing
  // one. Control characters, malformed escapes, lone surrogates and bytes
  // that are not UTF-8 are refused.
  bool string(bool& escaped) {
    ++at_;  // '"'
    for (;;) {
      // Plain ASCII is the common case: run through it first.
      at_ = skip_plain_string_bytes(at_, end_, escaped, wide_strings_);
      if (at_ == end_) return false;
      const auto c = static_cast<unsigned char>(*at_);
      if (c == '"') {
        ++at_;
        return true;
      }
      if (c < 0x20) return false;
      if (c == '\\') {
        escaped = true;
        if (!escape()) return false;
        continue;
      }
      if (!utf8_sequence()) return false;
    }
  }

  bool escape() {
    ++at_;  // '\'
    if (at_ == end_) return false;
    const char kind = *at_++;
    if (is_short_escape(kind)) return true;
    if (kind != 'u') return false;
    long unit = hex4();
    if (unit < 0) return false;
    if (unit >= 0xDC00 && unit <= 0xDFFF) return false;  // a low surrogate alone
    if (unit < 0xD800 || unit > 0xDBFF) return true;
    if (end_ - at_ < 2 || at_[0] != '\\' || at_[1] != 'u') return false;
    at_ += 2;
    long low = hex4();
    return low >= 0xDC00 && low <= 0xDFFF;
  }

  long hex4() {
    const long unit = json_hex4(std::string_view(at_, static_cast<std::size_t>(end_ - at_)), 0);
    if (unit >= 0) at_ += 4;
    return unit;
  }

  // From a byte of 0x80 or above: a run of well-formed UTF-8 sequences and
  // the few plain ASCII bytes between them. Prompts in most of the world's
  // scripts are such runs; going back to the loop in string() for every
  // character cost about 80 instructions a character. False when the first
  // sequence is malformed; the run ends before anything else that needs a
  // closer look, or after a few ASCII bytes in a row, which the block scan
  // takes faster. Out of line, so that string(), which English text
  // mostly runs through, stays small enough to be inlined.
  __attribute__((noinline)) bool utf8_sequence() {
    constexpr int kAsciiBytesLeftToTheBlockScan = 8;
    const char* p = at_;
    std::size_t length = utf8_sequence_length(p, end_);
    if (length == 0) return false;
    p += length;
    // The wide scan validates UTF-8 itself and leaves only what it cannot:
    // a sequence near the end of the body, or one it found broken.
    if (wide_strings_) {
      at_ = p;
      return true;
    }
    int ascii_in_a_row = 0;
    while (p < end_) {
      const auto c = static_cast<unsigned char>(*p);
      if (c < 0x80) {
        if (c < 0x20 || c == '"' || c == '\\' || ++ascii_in_a_row > kAsciiBytesLeftToTheBlockScan) {
          break;
        }
        ++p;
        continue;
      }
      length = utf8_sequence_length(p, end_);
      if (length == 0) break;
      ascii_in_a_row = 0;
      p += length;
    }
    at_ = p;
    return true;
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool number(Field field) {
    other_value(field);
    const char* number_begin = at_;
    const bool negative = at_ < end_ && *at_ == '-';
    if (negative) ++at_;
    if (at_ == end_ || !is_digit(*at_)) return false;
    if (*at_ == '0') {
      ++at_;
    } else {
      while (at_ < end_ && is_digit(*at_)) ++at_;
    }
    const char* integer_end = at_;
    bool integral = true;
    if (at_ < end_ && *at_ == '.') {
      integral = false;
      ++at_;
      if (at_ == end_ || !is_digit(*at_)) return false;
      while (at_ < end_ && is_digit(*at_)) ++at_;
    }
    if (at_ < end_ && (*at_ == 'e' || *at_ == 'E')) {
      integral = false;
      ++at_;
      if (at_ < end_ && (*at_ == '+' || *at_ == '-')) ++at_;
      if (at_ == end_ || !is_digit(*at_)) return false;
      while (at_ < end_ && is_digit(*at_)) ++at_;
    }

    // An integer that fits is one; anything else is read as a double, which
    // must be finite.
    if (integral) {
      const char* digits = number_begin + (negative ? 1 : 0);
      std::uint64_t magnitude = 0;
      auto [end, ec] = std::from_chars(digits, integer_end, magnitude);
      const bool fits =
          ec == std::errc{} &&
          (!negative ||
           magnitude <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1);
      if (fits) {
        if (field == Field::temperature) body.zero_temperature = magnitude == 0;
        if (field == Field::max_tokens && (!negative || magnitude == 0)) {
          body.max_tokens = magnitude;
        }
        return true;
      }
    }
    double parsed = 0;
    auto [end, ec] = std::from_chars(number_begin, at_, parsed);
    if (ec == std::errc::result_out_of_range) {
      if (overflows(number_begin, at_)) return false;
      parsed = 0;  // an underflow reads as zero or a subnormal
    } else if (ec != std::errc{}) {
      return false;
    }
    if (field == Field::temperature) body.zero_temperature = parsed == 0;
    return true;
  }

  // For a number std::from_chars found out of a double's range: too large
  // (refused) rather than too small (read as zero). Its decimal exponent
  // decides, beyond ±300 either way.
  static bool overflows(const char* begin, const char* end) {
    if (*begin == '-') ++begin;
    long exponent = 0;
    const char* mantissa_end =
        std::find_if(begin, end, [](char c) { return c == 'e' || c == 'E'; });
    if (mantissa_end != end) {
      const char* digits = mantissa_end + 1;
      if (*digits == '+') ++digits;
      auto [stop, ec] = std::from_chars(digits, end, exponent);
      if (ec == std::errc::result_out_of_range) exponent = *digits == '-' ? -1000000 : 1000000;
    }
    // Where the first significant digit stands relative to the point; a
    // mantissa of zeros is zero whatever the exponent.
    const char* point = std::find(begin, mantissa_end, '.');
    const char* first_significant =
        std::find_if(begin, mantissa_end, [](char c) { return c != '0' && c != '.'; });
    if (first_significant == mantissa_end) return false;
    const long position =
        first_significant < point ? point - first_significant : -(first_significant - point - 1);
    return exponent + position > 0;
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  // A key seen again: what its earlier value set is forgotten first.
  void note_key(Field field) {
    switch (field) {
      case Field::model:
        has_model = true;
        break;
      case Field::cache:
        body.has_cache_field = true;
        body.cache.reset();
        break;
      case Field::temperature:
        body.zero_temperature = false;
        break;
      default:
        break;
    }
  }

  // A value of a type the field does not take.
  void other_value(Field field) {
    switch (field) {
      case Field::model:
        model_is_string = false;
        break;
      case Field::stream:
        body.stream = false;
        break;
      case Field::stream_options:
        body.has_stream_options = false;
        body.include_usage = false;
        break;
      case Field::include_usage:
        body.include_usage = false;
        break;
      default:
        break;
    }
  }

  const char* begin_;
  const char* at_;
  const char* end_;
  int max_depth_;
  bool wide_strings_;
  bool spliceable_ = true;
};

}  // namespace

namespace detail {

StringScan best_string_scan() { return cpu_has_avx2() ? StringScan::avx2 : StringScan::sse2; }

bool is_valid_json(std::string_view text, int max_depth, StringScan strings) {
  BodyScanner scanner(text, max_depth, strings);
  return scanner.scan();
}

Result<RequestBody, ApiError> inspect_request_body(std::string_view body, int max_depth,
                                                   StringScan strings) {
  BodyScanner scanner(body, max_depth, strings);
  const bool ok = scanner.scan();
  if (scanner.too_deep) {
    return ApiError::invalid_request(
        "The JSON body is nested more than " + std::to_string(max_depth) + " levels deep.", "",
        "invalid_json");
  }
  if (!ok) {
    return ApiError::invalid_request(
        "We could not parse the JSON body of your request. The body must be valid JSON (UTF-8).",
        "", "invalid_json");
  }
  if (!scanner.top_is_object) {
    return ApiError::invalid_request("The request body must be a JSON object.", "", "invalid_type");
  }
  if (!scanner.has_model) {
    return ApiError::missing_model();
  }
  if (!scanner.model_is_string) {
    return ApiError::invalid_request("The model parameter must be a string.", "model",
                                     "invalid_type");
  }
  return std::move(scanner.body);
}

}  // namespace detail

bool is_valid_json(std::string_view text, int max_depth) {
  return detail::is_valid_json(text, max_depth, detail::best_string_scan());
}

Result<RequestBody, ApiError> inspect_request_body(std::string_view body, int max_depth) {
  return detail::inspect_request_body(body, max_depth, detail::best_string_scan());
}

std::string with_model_member(std::string_view body, std::string_view model) {
  // The first brace of an object's text is its own: what may precede it (a
  // byte order mark, whitespace) holds none.
  const auto open = body.find('{');
  const auto first = body.find_first_not_of(" \t\r\n", open + 1);
  const bool empty_object = first != std::string_view::npos && body[first] == '}';
  std::string text;
  text.reserve(body.size() + model.size() + 16);
  text.append(body.substr(0, open + 1)).append(R"("model":)");
  append_json_string(text, model);
  if (!empty_object) text.push_back(',');
  text.append(body.substr(open + 1));
  return text;
}

ModelSplice splice_model(std::string_view body, std::string& storage,
                         std::optional<ValueSpan> model_value) {
  std::string_view text = body;
  std::size_t model_begin = 0;
  std::size_t model_end = 0;
  if (!model_value) model_value = find_top_level_value(body, "model");
  if (auto span = model_value) {
    model_begin = span->begin;
    model_end = span->end;
  } else {
    auto document = json::parse(body);
    document.erase("model");
    storage = document.dump();
    constexpr std::string_view kModelKey = R"("model":)";
    storage.insert(1, kModelKey);
    model_begin = model_end = 1 + kModelKey.size();
    if (storage.size() > model_end + 1) storage.insert(model_end, ",");
    text = storage;
  }
  auto closing = text.rfind('}');
  if (closing == std::string_view::npos || closing < model_end) closing = text.size();
  return {text.substr(0, model_begin), text.substr(model_end, closing - model_end),
          text.substr(closing)};
}

}  // namespace sluice

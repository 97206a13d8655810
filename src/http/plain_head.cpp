#include "sluice/http/plain_head.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "sluice/http/http_head.hpp"

namespace sluice {

// Field values and targets are most of a head's bytes: 16 are tested at a
// time.
const char* skip_visible(const char* p, const char* last, signed char lowest) {
#if defined(__SSE2__)
  const __m128i floor = _mm_set1_epi8(lowest);
  const __m128i del = _mm_set1_epi8(0x7f);
  while (last - p >= 16) {
    const __m128i block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Signed: bytes above 0x7f are negative, so below the floor too.
    const int stops =
        _mm_movemask_epi8(_mm_or_si128(_mm_cmplt_epi8(block, floor), _mm_cmpeq_epi8(block, del)));
    if (stops != 0) return p + __builtin_ctz(static_cast<unsigned>(stops));
    p += 16;
  }
#endif
  while (p < last && static_cast<signed char>(*p) >= lowest && *p != 0x7f) ++p;
  return p;
}

bool PlainFraming::take(std::string_view name, std::string_view value) {
  switch (name.size()) {
    case 10: {
      if (!field_name_is(name, "connection")) return true;
      // A plain value holds no CR, the one byte other than '-' and a letter
      // that field_name_is could take for either.
      const bool says_close = field_name_is(value, "close");
      const bool says_keep_alive = !says_close && field_name_is(value, "keep-alive");
      close = close || says_close;
      keep_alive = keep_alive || says_keep_alive;
      return says_close || says_keep_alive;
    }
    case 14: {
      if (!field_name_is(name, "content-length")) return true;
      // 18 digits cannot overflow; longer lengths are Beast's to judge.
      if (content_length || chunked || value.empty() || value.size() > 18) return false;
      std::uint64_t length = 0;
      for (char c : value) {
        if (c < '0' || c > '9') return false;
        length = length * 10 + static_cast<std::uint64_t>(c - '0');
      }
      content_length = length;
      return true;
    }
    case 16:
      return !field_name_is(name, "proxy-connection");
    case 17:
      if (!field_name_is(name, "transfer-encoding")) return true;
      if (!chunked_allowed || chunked || content_length) return false;
      // "chunked" holds no CR either.
      chunked = field_name_is(value, "chunked");
      return chunked;
    default:
      return true;
  }
}

}  // namespace sluice

#pragma once

namespace sluice {

// Whether this processor (and the system, which must save its registers)
// runs AVX2 code. The scanners of the hot path are built for any x86-64 and
// choose their 32-byte variants by this at run time. Inline, and read once:
// they ask for every line or string they scan.
inline bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace sluice

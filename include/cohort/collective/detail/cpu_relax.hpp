// What every waiting rank of a collective shares, whether its peers are threads (local.hpp) or
// processes (shared_segment.hpp): the cache line that keeps two ranks' counters apart, and the
// pause that tells the core a thread spins.
#pragma once

#include <cstddef>

namespace cohort::collective::detail {

inline constexpr std::size_t kCacheLine = 64;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace cohort::collective::detail

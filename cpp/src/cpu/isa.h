#pragma once
// Each function marked ATTNLAB_ISA_CLONES is compiled once per instruction set and picked at
// load time (GCC function multi-versioning), so its loops vectorize with AVX-512 or AVX2 where
// the CPU has them, while the library still runs on any x86-64.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTNLAB_ISA_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ATTNLAB_ISA_CLONES
#endif
#define ATTNLAB_INLINE inline __attribute__((always_inline))

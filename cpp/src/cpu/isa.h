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
// Unrolls the loop that follows completely (its trip count a small constant), so that arrays
// indexed by its counter can live in registers.
#define ATTNLAB_UNROLL _Pragma("GCC unroll 16")

#include <cstdint>

namespace attnlab::cpu {

// One 64-byte vector of T (GCC vector extension; narrower instruction sets split it). Spelled
// out per type: GCC ignores vector_size on a dependent alias template.
template <typename T>
struct Vector64;
template <>
struct Vector64<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct Vector64<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <typename T>
using Vec = typename Vector64<T>::type;
template <typename T>
constexpr int64_t kLanes = 64 / sizeof(T);
static_assert(sizeof(Vec<float>) == 64 && sizeof(Vec<double>) == 64);

// Whether this CPU has the AVX-512 subsets (F, BW, VL, DQ) that attnlab's own GEMM kernels are
// compiled for, checked once.
inline bool has_avx512_core() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace attnlab::cpu

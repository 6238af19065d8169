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

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace attnlab::cpu {

// std::vector's allocator on 64-byte (cache line) boundaries, for the kernels' scratch buffers:
// malloc aligns to 16 bytes only, so a buffer's 64-byte vector loads and stores (and AMX tile
// rows) could each straddle two lines, depending on where malloc placed it from one call to
// the next.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

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

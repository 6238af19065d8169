#pragma once
// Each function marked ATTNLAB_ISA_CLONES is compiled once per instruction set and picked at
// load time (GCC function multi-versioning), so its loops vectorize with AVX-512 or AVX2 where
// the CPU has them, while the library still runs on any x86-64.
//
// ATTNLAB_CPU_AVX2_ONLY (the CMake option of that name) compiles the library as an AVX2-only CPU
// runs it: no x86-64-v4 clones, and cpu_isa_capped_at_avx2() always true, so that an AVX-512
// machine tests and measures the very code (x86-64-v3 clones included) that Zen 3 or Haswell
// class CPUs get. A separate build for developers (docs/development.md), never the package.
//
// ATTNLAB_CPU_NATIVE_ONLY (the CMake option) compiles one copy, for the building machine's own
// instruction set (-march=native): for builds whose code runs only where it was built (the
// sanitizer build, .ci/sanitize), where the other clones would only be compiled, never run.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#if defined(ATTNLAB_CPU_NATIVE_ONLY)
#define ATTNLAB_ISA_CLONES
#define ATTNLAB_AVX512_CLONES
#define ATTNLAB_CPU_CLONE_TARGETS "native"
#elif defined(ATTNLAB_CPU_AVX2_ONLY)
#define ATTNLAB_ISA_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define ATTNLAB_AVX512_CLONES
#define ATTNLAB_CPU_CLONE_TARGETS "x86-64-v3,default"
#else
#define ATTNLAB_ISA_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// The same without the x86-64-v3 (AVX2) clone, for functions whose AVX2 CPUs take their own
// code (a 32-byte-vector copy chosen by avx2_without_avx512() below).
#define ATTNLAB_AVX512_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#define ATTNLAB_CPU_CLONE_TARGETS "x86-64-v4,x86-64-v3,default"
#endif
// A function compiled for AVX2 and FMA, called only where the CPU has them.
#define ATTNLAB_AVX2_TARGET __attribute__((target("avx2,fma")))
#else
#define ATTNLAB_ISA_CLONES
#define ATTNLAB_AVX512_CLONES
#define ATTNLAB_AVX2_TARGET
#define ATTNLAB_CPU_CLONE_TARGETS ""
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

// One vector of T (GCC vector extension): 64 bytes, split by narrower instruction sets. A file
// that defines ATTNLAB_VECTOR_BYTES as 32 before its first include gets 32-byte vectors instead
// (the AVX2 copies of the small kernels, e.g. small_attention_avx2.cpp). Each width lives in its
// own inline namespace, so the two are distinct types and every function over them a distinct
// symbol. Spelled out per type: GCC ignores vector_size on a dependent alias template.
#ifndef ATTNLAB_VECTOR_BYTES
#define ATTNLAB_VECTOR_BYTES 64
#endif
#if ATTNLAB_VECTOR_BYTES == 64
#define ATTNLAB_VECTOR_NAMESPACE vec64
#elif ATTNLAB_VECTOR_BYTES == 32
#define ATTNLAB_VECTOR_NAMESPACE vec32
#else
#error "ATTNLAB_VECTOR_BYTES must be 64 or 32"
#endif
inline namespace ATTNLAB_VECTOR_NAMESPACE {
template <typename T>
struct VectorOf;
template <>
struct VectorOf<float> {
  typedef float type __attribute__((vector_size(ATTNLAB_VECTOR_BYTES)));
};
template <>
struct VectorOf<double> {
  typedef double type __attribute__((vector_size(ATTNLAB_VECTOR_BYTES)));
};
template <typename T>
using Vec = typename VectorOf<T>::type;
template <typename T>
constexpr int64_t kLanes = ATTNLAB_VECTOR_BYTES / sizeof(T);
static_assert(sizeof(Vec<float>) == ATTNLAB_VECTOR_BYTES);
}  // namespace ATTNLAB_VECTOR_NAMESPACE

// ATTNLAB_CPU_ISA=avx2 in the environment (read once) makes attnlab choose its kernels as on a
// CPU with AVX2 and FMA but no AVX-512: the BLAS for float32 products, the AVX2 row passes and
// the AVX2 small kernels. For tests and measurements of those paths on AVX-512 machines; the
// ATTNLAB_ISA_CLONES functions are still picked by the loader from what the CPU has.
bool cpu_isa_capped_at_avx2();

// Whether this CPU has the AVX-512 subsets (F, BW, VL, DQ) that attnlab's own GEMM kernels are
// compiled for, checked once (false under ATTNLAB_CPU_ISA=avx2).
inline bool has_avx512_core() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool available = [] {
    __builtin_cpu_init();
    return !cpu_isa_capped_at_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  }();
  return available;
#else
  return false;
#endif
}

// Whether the explicit AVX2 paths run: AVX2 and FMA present, the AVX-512 ones not chosen. GCC 12
// turns the comparisons, selects and cross-half shuffles of the generic 64-byte vectors into
// one scalar instruction per lane in its x86-64-v3 clones, so those CPUs get their own code.
inline bool avx2_without_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool available = [] {
    __builtin_cpu_init();
    return !has_avx512_core() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace attnlab::cpu

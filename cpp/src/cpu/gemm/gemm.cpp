#include "cpu/gemm/gemm.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/gemm/f32_gemm.h"
#include "cpu/isa/isa.h"
#include "cpu/isa/vec_transpose.h"

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc);
// MKL's C entry point behind mkl_set_num_threads_local (mkl_service.h maps the name; the
// lower-case symbol is the Fortran one, taking a pointer). Weak: absent with other BLAS.
int MKL_Set_Num_Threads_Local(int nthreads) __attribute__((weak));
}

namespace attnlab::cpu {
namespace {

// Products up to this many multiply-adds, whose packed B fits kPackedBytes, use the small
// kernel. Measured for C = A·Bᵀ with k = 64 on an AVX-512 AMD EPYC core (small kernel vs MKL
// sgemm_): m = n = 16: 0.54 vs 0.56 µs; 48: 2.9 vs 3.5 µs; 64: 4.9 vs 6.0 µs.
constexpr int64_t kSmallWork = 64 * 64 * 64;
// The same bound on CPUs without AVX-512, for float32: there the kernel runs its x86-64-v3
// clone, in which GCC 12 turns part of the 64-byte vector code into scalar code, and MKL's
// sgemm_ beat it at every size measured above 8×8×8 on one AMD EPYC (Zen 3) core (µs per call
// through attnlab._gemm.float32_mm, about 14 of them Python's; small kernel → MKL):
// 16×16×32 16.2 → 14.9, 32×32×32 23.5 → 15.8, 32×64×64 50 → 19-21, 64×64×64 82 → 22-24. The
// causal (8, 8, 512, 64) backward, whose diagonal steps are such products, took 132-138 ms
// instead of 359 on one thread.
constexpr int64_t kSmallWorkFloat32WithoutAvx512 = 8 * 8 * 8;
constexpr int64_t kPackedBytes = 32 * 1024;

// float32 products go to f32_gemm (cpu/gemm/f32_gemm.h) on AVX-512 CPUs, at every size up to this
// k. Measured on one AMD EPYC (Zen 4) core, thread CPU time, best of 10-20, on a shared machine
// (GFLOP/s, MKL sgemm_ or the small kernel below → f32_gemm):
//   attention blocks: 64×512×64 A·Bᵀ 94 → 102; 64×64×512 A·B 95 → 108; 64×128×64 A·Bᵀ 93 → 102;
//   128×64×64 Aᵀ·B 91 → 110; 64×64×128 A·B 93 → 108; 64×2048×64 A·Bᵀ 91 → 97;
//   64×64×2048 A·B 91 → 105;
//   encoder layer: 320×768×256 A·Bᵀ 102 → 108; 320×256×512 A·Bᵀ 102 → 113; 768×256×320
//   Aᵀ·B 102 → 112; 320×256×768 A·B 102 → 111; 1024³ A·B 94 → 107;
//   small kernel sizes: 64×64×64 A·Bᵀ 79 → 104; 16×16×64 59 → 80; 4×20×8 A·Bᵀ 4.1 → 8.1;
//   8×8×8 8.4 → 12.9 (2×3×5 ties at 0.03-0.04 µs);
//   long sums: 256×256×4096 Aᵀ·B 94 → 96, but 128×128×16384 Aᵀ·B 83 → 60 (op(A) is broadcast
//   from A's rows, one cache line per step of the sum, and the 32-column panel of B outgrows
//   the L2 cache), so k above kF32GemmMaxK (gemm.h) stays with BLAS.

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// R rows of C, one vector of columns: acc[r] = Σ_p op(A)[i0 + r, p]·Bp[p, j0 : j0 + lanes].
template <typename T, int R>
ATTNLAB_INLINE void small_gemm_tile(bool trans_a, int64_t cols, int64_t k, T alpha,
                                    const T* a, int64_t lda, const T* packed, int64_t ldp,
                                    T beta, T* c, int64_t ldc) {
  Vec<T> acc[R] = {};
  for (int64_t p = 0; p < k; ++p) {
    Vec<T> bv;
    std::memcpy(&bv, packed + p * ldp, sizeof(bv));
    for (int r = 0; r < R; ++r) {
      const T ar = trans_a ? a[p * lda + r] : a[r * lda + p];
      acc[r] += ar * bv;
    }
  }
  for (int r = 0; r < R; ++r) {
    T out[kLanes<T>];
    std::memcpy(out, &acc[r], sizeof(out));
    T* cr = c + r * ldc;
    if (beta == T(0)) {
      for (int64_t j = 0; j < cols; ++j) cr[j] = alpha * out[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) cr[j] = alpha * out[j] + beta * cr[j];
    }
  }
}

// packed[p·ldp + j] = b[j·ldb + p] for p < k and j < n, and 0 for n <= j < ldp (ldp a multiple
// of the lane count): Bᵀ packed by whole-vector loads, in-register transposes and whole-vector
// stores. A scalar gather of the same elements cost more than the multiply-adds at 16×16×32.
template <typename T>
ATTNLAB_INLINE void pack_transposed(int64_t n, int64_t k, const T* b, int64_t ldb, T* packed,
                                    int64_t ldp) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t j0 = 0; j0 < n; j0 += L) {
    const int64_t rows = std::min(L, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += L) {
      const int64_t cols = std::min(L, k - p0);
      Vec<T> r[L];
      for (int64_t i = 0; i < L; ++i) {
        r[i] = Vec<T>{};
        if (i >= rows) continue;
        const T* src = b + (j0 + i) * ldb + p0;
        if (cols == L) {
          std::memcpy(&r[i], src, sizeof(Vec<T>));
        } else {
          for (int64_t c = 0; c < cols; ++c) r[i][c] = src[c];
        }
      }
      transpose_block<T>(r);
      for (int64_t c = 0; c < cols; ++c) {
        std::memcpy(packed + (p0 + c) * ldp + j0, &r[c], sizeof(Vec<T>));
      }
    }
  }
  if (n == 0) {
    for (int64_t p = 0; p < k; ++p) std::fill(packed + p * ldp, packed + (p + 1) * ldp, T(0));
  }
}

template <typename T>
ATTNLAB_INLINE void small_gemm_impl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                    T alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
                                    T beta, T* c, int64_t ldc) {
  constexpr int64_t L = kLanes<T>;
  // op(B) packed as k rows of round_up(n, L) columns, zero-padded, so every load is a whole
  // vector.
  const int64_t ldp = round_up(n, L);
  alignas(64) T packed[kPackedBytes / sizeof(T)];
  if (trans_b) {
    pack_transposed(n, k, b, ldb, packed, ldp);
  } else {
    for (int64_t p = 0; p < k; ++p) {
      T* row = packed + p * ldp;
      std::memcpy(row, b + p * ldb, n * sizeof(T));
      std::fill(row + n, row + ldp, T(0));
    }
  }
  constexpr int R = 6;  // rows per tile: 6 accumulators + 1 B vector stay in registers
  for (int64_t j0 = 0; j0 < n; j0 += L) {
    const int64_t cols = std::min(L, n - j0);
    const auto tile = [&]<int Rows>(int64_t i0) {
      const T* ai = trans_a ? a + i0 : a + i0 * lda;
      small_gemm_tile<T, Rows>(trans_a, cols, k, alpha, ai, lda, packed + j0, ldp, beta,
                               c + i0 * ldc + j0, ldc);
    };
    int64_t i0 = 0;
    for (; i0 + R <= m; i0 += R) tile.template operator()<R>(i0);
    switch (m - i0) {  // the remaining rows in one tile of their own size
      case 5: tile.template operator()<5>(i0); break;
      case 4: tile.template operator()<4>(i0); break;
      case 3: tile.template operator()<3>(i0); break;
      case 2: tile.template operator()<2>(i0); break;
      case 1: tile.template operator()<1>(i0); break;
      default: break;
    }
  }
}

ATTNLAB_ISA_CLONES void small_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const float* a, int64_t lda, const float* b,
                                   int64_t ldb, float beta, float* c, int64_t ldc) {
  small_gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
ATTNLAB_ISA_CLONES void small_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                   double alpha, const double* a, int64_t lda, const double* b,
                                   int64_t ldb, double beta, double* c, int64_t ldc) {
  small_gemm_impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void blas_call(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

template <typename T>
void gemm_any(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
              int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    empty_sum_product(m, n, beta, c, ldc, c, ldc);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (k <= kF32GemmMaxK && f32_gemm_available()) {
      f32_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
  }
  const int64_t small_work = std::is_same_v<T, float> && !has_avx512_core()
                                 ? kSmallWorkFloat32WithoutAvx512
                                 : kSmallWork;
  if (m * n * k <= small_work &&
      k * round_up(n, kLanes<T>) <= kPackedBytes / static_cast<int64_t>(sizeof(T))) {
    small_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  blas_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The Fortran BLAS call, for m, n, k > 0.
template <typename T>
void blas_call(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  // A row-major matrix is the column-major matrix of its transpose: compute Cᵀ = op(B)ᵀ·op(A)ᵀ.
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&ta, &tb, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
  } else {
    dgemm_(&ta, &tb, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
  }
}

}  // namespace

void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  if (m == 0 || n == 0 || k == 0) {
    gemm_any(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  blas_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  gemm_any(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  gemm_any(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {

template <typename T>
void gemm_add_any(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, const T* d,
                  int64_t ldd, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (m > 0 && n > 0 && k > 0 && k <= kF32GemmMaxK && f32_gemm_available()) {
      f32_gemm_add(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, d, ldd, c, ldc);
      return;
    }
  }
  fill_addend(m, n, beta, d, ldd, c, ldc);
  gemm_any(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

void gemm_add(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
              const float* d, int64_t ldd, float* c, int64_t ldc) {
  gemm_add_any(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, d, ldd, c, ldc);
}

void gemm_add(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
              const double* d, int64_t ldd, double* c, int64_t ldc) {
  gemm_add_any(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, d, ldd, c, ldc);
}

void gemm_bf16_operands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                        float beta, float* c, int64_t ldc) {
  if (bf16_gemm_available()) {
    bf16_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

SequentialBlasScope::SequentialBlasScope() {
  if (MKL_Set_Num_Threads_Local) previous_ = MKL_Set_Num_Threads_Local(1);
}

SequentialBlasScope::~SequentialBlasScope() {
  if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous_);
}

}  // namespace attnlab::cpu

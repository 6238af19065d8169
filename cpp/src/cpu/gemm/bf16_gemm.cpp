#include "cpu/gemm/bf16_gemm.h"

#include "cpu/gemm/f32_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include "cpu/isa/isa.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTNLAB_HAVE_BF16_KERNEL 1
#include <immintrin.h>
#include <x86intrin.h>

#include "cpu/isa/vec_transpose.h"
#endif

namespace attnlab::cpu {

#ifdef ATTNLAB_HAVE_BF16_KERNEL
namespace {

// Only these functions are compiled for AVX512-BF16; bf16_gemm calls them after the run-time
// check, so the library still loads and runs on CPUs without it.
#define ATTNLAB_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define ATTNLAB_BF16_INLINE ATTNLAB_BF16 inline __attribute__((always_inline))

// Operands are packed as 32-bit pairs of bfloat16 values, the unit vdpbf16ps multiplies: pair p
// of a row of op(A) holds op(A)[i, 2p] (low half) and op(A)[i, 2p + 1]; pair p of a column of
// op(B) likewise op(B)[2p, j] and op(B)[2p + 1, j]. An odd k ends in a pair whose high half is 0.
using Pair = uint32_t;

// Register block: kRows rows of C by kVecs vectors of 16 columns: 16 accumulators, 2 B vectors
// and a broadcast A pair of the 32 zmm registers. 32 columns divide the attention's widths (64,
// 128, 512), so its blocks need no column tails.
constexpr int kRows = 8;
constexpr int kVecs = 2;
constexpr int64_t kLanes16 = 16;
constexpr int64_t kCols = kVecs * kLanes16;  // the columns of one panel of packed B

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The first n of 16 lanes (n clamped to [0, 16]).
ATTNLAB_BF16_INLINE __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// 32 floats (the first `count` of x, zeros after) rounded to 16 pairs: pair q = (x[2q], x[2q+1]).
ATTNLAB_BF16_INLINE __m512i pairs_of_run(const float* x, int64_t count) {
  const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(count), x);
  const __m512 hi = _mm512_maskz_loadu_ps(first_lanes(count - 16), x + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Two float rows x0, x1 (the first `count` of 16 columns, zeros after; x1 null for zeros)
// rounded and interleaved column by column: pair j = (x0[j], x1[j]).
ATTNLAB_BF16_INLINE __m512i pairs_of_rows(const float* x0, const float* x1, int64_t count,
                                          __m512i interleave) {
  const __mmask16 lanes = first_lanes(count);
  const __m512 v0 = _mm512_maskz_loadu_ps(lanes, x0);
  const __m512 v1 = x1 ? _mm512_maskz_loadu_ps(lanes, x1) : _mm512_setzero_ps();
  // words 0..15 = v0, 16..31 = v1; vpermw puts word j of each next to the other.
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
}

ATTNLAB_BF16_INLINE __m512i interleave_index() {
  alignas(64) uint16_t index[32];
  for (int w = 0; w < 32; ++w) index[w] = static_cast<uint16_t>((w % 2 ? 16 : 0) + w / 2);
  return _mm512_load_si512(index);
}

// X has k rows (the reduction dimension) of `width` floats: out[p·ldo + j] = pair p of column
// j, zero for width <= j < ldo (ldo a multiple of 16). B when not transposed, A when transposed.
ATTNLAB_BF16 void pack_row_pairs(const float* x, int64_t ldx, int64_t k, int64_t width,
                                 Pair* out, int64_t ldo) {
  const __m512i interleave = interleave_index();
  for (int64_t p = 0; 2 * p < k; ++p) {
    const float* x0 = x + 2 * p * ldx;
    const float* x1 = 2 * p + 1 < k ? x0 + ldx : nullptr;
    Pair* o = out + p * ldo;
    for (int64_t j0 = 0; j0 < ldo; j0 += kLanes16) {
      const int64_t count = width - j0;
      const __m512i v =
          count > 0 ? pairs_of_rows(x0 + j0, x1 ? x1 + j0 : nullptr, count, interleave)
                    : _mm512_setzero_si512();
      _mm512_storeu_si512(o + j0, v);
    }
  }
}

// X has `width` rows of k contiguous floats, X[j, 2p] and X[j, 2p + 1] side by side: rounded
// whole runs make the pairs of row j, and 16×16 transposes of pairs lay them out as
// out[p·ldo + j] (zero for width <= j < ldo). B when transposed (keys in Q·Kᵀ).
ATTNLAB_BF16 void pack_transposed_pairs(const float* x, int64_t ldx, int64_t k, int64_t width,
                                        Pair* out, int64_t ldo) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t j0 = 0; j0 < ldo; j0 += kLanes16) {
    for (int64_t p0 = 0; p0 < pairs; p0 += kLanes16) {
      Vec<float> r[16];
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = j0 + i < width ? (Vec<float>)pairs_of_run(x + (j0 + i) * ldx + 2 * p0, k - 2 * p0)
                              : Vec<float>{};
      }
      transpose_block<float>(r);  // 32-bit lanes: the pairs move as a whole
      const int64_t rows = std::min(kLanes16, pairs - p0);
      for (int64_t q = 0; q < rows; ++q) {
        _mm512_storeu_si512(out + (p0 + q) * ldo + j0, (__m512i)r[q]);
      }
    }
  }
}

// pack_rows of alpha·X (alpha a power of two, so that the rounding is that of X itself).
ATTNLAB_BF16 void pack_rows_scaled(const float* x, int64_t ldx, int64_t k, int64_t width,
                                   float alpha, Pair* out, int64_t ldo) {
  const int64_t pairs = (k + 1) / 2;
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < width; ++i) {
    for (int64_t p0 = 0; p0 < pairs; p0 += kLanes16) {
      const int64_t count = k - 2 * p0;
      const float* r = x + i * ldx + 2 * p0;
      const __m512 lo = _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(first_lanes(count), r));
      const __m512 hi =
          _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(first_lanes(count - 16), r + 16));
      _mm512_mask_storeu_epi32(out + i * ldo + p0, first_lanes(pairs - p0),
                               (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

// X has `width` rows of k contiguous floats: out[i·ldo + p] = pair p of row i. A when not
// transposed (the broadcasts then walk along a row).
ATTNLAB_BF16 void pack_rows(const float* x, int64_t ldx, int64_t k, int64_t width, Pair* out,
                            int64_t ldo) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t i = 0; i < width; ++i) {
    for (int64_t p0 = 0; p0 < pairs; p0 += kLanes16) {
      _mm512_mask_storeu_epi32(out + i * ldo + p0, first_lanes(pairs - p0),
                               pairs_of_run(x + i * ldx + 2 * p0, k - 2 * p0));
    }
  }
}

// The first n of 32 lanes (n clamped to [0, 32]).
ATTNLAB_BF16_INLINE __mmask32 first_lanes32(int64_t n) {
  return n >= 32 ? __mmask32(0xFFFFFFFFu) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1);
}

// 16 bfloat16 values (bits) widened to float32: exact.
ATTNLAB_BF16_INLINE __m512 widen16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The bfloat16 counterparts of the packers above, for inputs already in bfloat16 (bits), so
// that nothing is rounded: rows of k values at stride ldx.
// pack_rows: out row i (ldo >= k rounded up to even) = alpha·x row i, alpha 1 or a power of two
// (exact but for overflow and subnormal results), an odd k's last pair padded with 0.
ATTNLAB_BF16 void pack_rows16(const uint16_t* x, int64_t ldx, int64_t k, int64_t width,
                              float alpha, uint16_t* out, int64_t ldo) {
  const __m512 scale = _mm512_set1_ps(alpha);
  const int64_t k2 = round_up(k, 2);
  for (int64_t i = 0; i < width; ++i) {
    for (int64_t c0 = 0; c0 < k2; c0 += 32) {
      __m512i v = _mm512_maskz_loadu_epi16(first_lanes32(k - c0), x + i * ldx + c0);
      if (alpha != 1.0f) {
        const __m512 lo = _mm512_mul_ps(scale, widen16(_mm512_castsi512_si256(v)));
        const __m512 hi = _mm512_mul_ps(scale, widen16(_mm512_extracti64x4_epi64(v, 1)));
        v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      }
      _mm512_mask_storeu_epi16(out + i * ldo + c0, first_lanes32(k2 - c0), v);
    }
  }
}

// pack_transposed_pairs: a row's pairs are its 32-bit words already, so 16×16 transposes of
// words lay them out.
ATTNLAB_BF16 void pack_transposed_pairs(const uint16_t* x, int64_t ldx, int64_t k,
                                          int64_t width, Pair* out, int64_t ldo) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t j0 = 0; j0 < ldo; j0 += kLanes16) {
    for (int64_t p0 = 0; p0 < pairs; p0 += kLanes16) {
      Vec<float> r[16];
      const __mmask32 lanes = first_lanes32(k - 2 * p0);
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = j0 + i < width
                   ? (Vec<float>)_mm512_maskz_loadu_epi16(lanes, x + (j0 + i) * ldx + 2 * p0)
                   : Vec<float>{};
      }
      transpose_block<float>(r);
      const int64_t rows = std::min(kLanes16, pairs - p0);
      for (int64_t q = 0; q < rows; ++q) {
        _mm512_storeu_si512(out + (p0 + q) * ldo + j0, (__m512i)r[q]);
      }
    }
  }
}

// pack_row_pairs: rows 2p and 2p + 1 interleaved word by word.
ATTNLAB_BF16 void pack_row_pairs(const uint16_t* x, int64_t ldx, int64_t k, int64_t width,
                                   Pair* out, int64_t ldo) {
  const __m512i interleave = interleave_index();
  for (int64_t p = 0; 2 * p < k; ++p) {
    const uint16_t* x0 = x + 2 * p * ldx;
    const uint16_t* x1 = 2 * p + 1 < k ? x0 + ldx : nullptr;
    Pair* o = out + p * ldo;
    for (int64_t j0 = 0; j0 < ldo; j0 += kLanes16) {
      const __mmask16 lanes = first_lanes(width - j0);
      const __m256i v0 = _mm256_maskz_loadu_epi16(lanes, x0 + j0);
      const __m256i v1 = x1 ? _mm256_maskz_loadu_epi16(lanes, x1 + j0) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
      _mm512_storeu_si512(o + j0, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// C[m×n] (+)= a[:, 0]·b_low[0, :]: the rank-one term of an odd k's last column, with b_low the
// packed pairs holding that row of op(B) in their low halves. The products are exact in float.
ATTNLAB_BF16 void add_last_column(int64_t m, int64_t n, const uint16_t* a, int64_t lda,
                                  const Pair* b_low, bool accumulate, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    const uint32_t bits = static_cast<uint32_t>(a[i * lda]) << 16;
    float ai;
    std::memcpy(&ai, &bits, sizeof(ai));
    const __m512 va = _mm512_set1_ps(ai);
    float* ci = c + i * ldc;
    for (int64_t j = 0; j < n; j += kLanes16) {
      const __mmask16 lanes = first_lanes(n - j);
      const __m512 vb =
          _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_maskz_loadu_epi32(lanes, b_low + j), 16));
      const __m512 prev = accumulate ? _mm512_maskz_loadu_ps(lanes, ci + j) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(ci + j, lanes, _mm512_fmadd_ps(va, vb, prev));
    }
  }
}

// One register block: Rows rows of C by Vecs vectors of columns (the last one's lanes in
// `last`). Pair p of row r of op(A) is a[r·a_row + p·a_pair]; b holds the block's columns,
// pair p at b + p·ldb.
template <int Rows, int Vecs>
ATTNLAB_BF16_INLINE void block(int64_t pairs, const Pair* a, int64_t a_row, int64_t a_pair,
                               const Pair* b, int64_t ldb, float alpha, float beta, float* c,
                               int64_t ldc, __mmask16 last) {
  __m512 acc[Rows][Vecs];
  for (int r = 0; r < Rows; ++r) {
    for (int v = 0; v < Vecs; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[Vecs];
    // The last vector's lanes beyond `last` are not loaded: a sub-block of a packed B
    // (bf16_gemm_prepacked16) may end inside its last 16 columns, on the buffer's last pair.
    for (int v = 0; v < Vecs; ++v) {
      bv[v] = (__m512bh)_mm512_maskz_loadu_epi32(v == Vecs - 1 ? last : __mmask16(0xFFFF),
                                                 b + p * ldb + 16 * v);
    }
    const Pair* ap = a + p * a_pair;
    for (int r = 0; r < Rows; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[r * a_row]));
      for (int v = 0; v < Vecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  const __m512 valpha = _mm512_set1_ps(alpha), vbeta = _mm512_set1_ps(beta);
  for (int r = 0; r < Rows; ++r) {
    for (int v = 0; v < Vecs; ++v) {
      const __mmask16 lanes = v == Vecs - 1 ? last : __mmask16(0xFFFF);
      float* cr = c + r * ldc + 16 * v;
      __m512 out = _mm512_mul_ps(acc[r][v], valpha);
      if (beta != 0.0f) out = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(lanes, cr), out);
      _mm512_mask_storeu_ps(cr, lanes, out);
    }
  }
}

template <int Vecs>
ATTNLAB_BF16_INLINE void column_block(int64_t m, int64_t pairs, const Pair* a, int64_t a_row,
                                      int64_t a_pair, const Pair* b, int64_t ldb, float alpha,
                                      float beta, float* c, int64_t ldc, __mmask16 last) {
  int64_t i0 = 0;
  for (; i0 + kRows <= m; i0 += kRows) {
    block<kRows, Vecs>(pairs, a + i0 * a_row, a_row, a_pair, b, ldb, alpha, beta, c + i0 * ldc,
                       ldc, last);
  }
  const Pair* ai = a + i0 * a_row;
  float* ci = c + i0 * ldc;
  switch (m - i0) {  // the remaining rows in one block of their own size
    case 7: block<7, Vecs>(pairs, ai, a_row, a_pair, b, ldb, alpha, beta, ci, ldc, last); break;
    case 6: block<6, Vecs>(pairs, ai, a_row, a_pair, b, ldb, alpha, beta, ci, ldc, last); break;
    case 5: block<5, Vecs>(pairs, ai, a_row, a_pair, b, ldb, alpha, beta, ci, ldc, last); break;
    case 4: block<4, Vecs>(pairs, ai, a_row, a_pair, b, ldb, alpha, beta, ci, ldc, last); break;
    case 3: block<3, Vecs>(pairs, ai, a_row, a_pair, b, ldb, alpha, beta, ci, ldc, last); break;
    case 2: block<2, Vecs>(pairs, ai, a_row, a_pair, b, ldb, alpha, beta, ci, ldc, last); break;
    case 1: block<1, Vecs>(pairs, ai, a_row, a_pair, b, ldb, alpha, beta, ci, ldc, last); break;
    default: break;
  }
}

// Every column of C through the register blocks: blocks of kCols columns, then the last one or
// two vectors, masked. B's columns from j0 start at b + j0·b_col, their pairs ldb apart; ldb = 0
// for B packed in panels, whose pairs lie round_up(width, 16) apart (the panel's own width).
ATTNLAB_BF16_INLINE void column_blocks(int64_t m, int64_t n, int64_t pairs, const Pair* a,
                                       int64_t a_row, int64_t a_pair, const Pair* b,
                                       int64_t b_col, int64_t ldb, float alpha, float beta,
                                       float* c, int64_t ldc) {
  int64_t j0 = 0;
  for (; j0 + kCols <= n; j0 += kCols) {
    column_block<kVecs>(m, pairs, a, a_row, a_pair, b + j0 * b_col, ldb ? ldb : kCols, alpha,
                        beta, c + j0, ldc, __mmask16(0xFFFF));
  }
  const int64_t rest = n - j0;  // fewer than kCols columns: one or two vectors, the last masked
  if (rest > kLanes16) {
    column_block<2>(m, pairs, a, a_row, a_pair, b + j0 * b_col, ldb ? ldb : 2 * kLanes16, alpha,
                    beta, c + j0, ldc, first_lanes(rest - kLanes16));
  } else if (rest > 0) {
    column_block<1>(m, pairs, a, a_row, a_pair, b + j0 * b_col, ldb ? ldb : kLanes16, alpha,
                    beta, c + j0, ldc, first_lanes(rest));
  }
}

// C = alpha·A·B + beta·C through torch's oneDNN brgemm (AMX tiles where the CPU has them), for
// the packed operands below: A's rows of pairs are row-major bfloat16 (lda = 2·pairs), and each
// panel of B (pair p of column j at p·ldo + j, ldo = 16 or 32) is the "VNNI" layout
// [K/2][ldo][2] that oneDNN's transform (cpublas::pack) makes with out_ld = ldo. The one-time
// check in brgemm_route() compares this against block() on a product, so a different layout
// could only disable the route.
void brgemm_panels(int64_t m, int64_t n, int64_t pairs, const Pair* pa, const Pair* pb,
                   float alpha, float beta, float* c, int64_t ldc) {
  thread_local AlignedVector<float> tmp;
  const int64_t k2 = 2 * pairs;
  const auto* a = reinterpret_cast<const c10::BFloat16*>(pa);
  // brgemm adds A·B to C or overwrites it; other alpha and beta go through a panel of C.
  const bool direct = alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
  if (!direct && static_cast<int64_t>(tmp.size()) < m * kCols) tmp.resize(m * kCols);
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t width = std::min(kCols, n - j0), ldo = round_up(width, kLanes16);
    const auto* b = reinterpret_cast<const c10::BFloat16*>(pb + j0 * pairs);
    if (direct) {
      at::native::cpublas::brgemm(m, width, k2, k2, ldo, ldc, beta == 1.0f, a, b, c + j0, true);
      continue;
    }
    at::native::cpublas::brgemm(m, width, k2, k2, ldo, kCols, false, a, b, tmp.data(), true);
    for (int64_t i = 0; i < m; ++i) {
      float* ci = c + i * ldc + j0;
      const float* ti = tmp.data() + i * kCols;
      for (int64_t j = 0; j < width; ++j) {
        ci[j] = beta == 0.0f ? alpha * ti[j] : alpha * ti[j] + beta * ci[j];
      }
    }
  }
  at::native::cpublas::brgemm_release(true);
}

// C[m×n] *= alpha.
ATTNLAB_BF16 void scale_block(int64_t m, int64_t n, float alpha, float* c, int64_t ldc) {
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    for (int64_t j = 0; j < n; j += kLanes16) {
      const __mmask16 lanes = first_lanes(n - j);
      _mm512_mask_storeu_ps(ci + j, lanes,
                            _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(lanes, ci + j)));
    }
  }
}

// in[p·ld + i] (pairs × m, ld a multiple of 16 and >= m) to out[i·pairs + p] (m × pairs).
ATTNLAB_BF16 void transpose_pairs(const Pair* in, int64_t ld, int64_t pairs, int64_t m,
                                  Pair* out) {
  for (int64_t p0 = 0; p0 < pairs; p0 += kLanes16) {
    const int64_t np = std::min(kLanes16, pairs - p0);
    for (int64_t i0 = 0; i0 < m; i0 += kLanes16) {
      Vec<float> r[16];
      for (int64_t q = 0; q < 16; ++q) {
        r[q] = q < np ? (Vec<float>)_mm512_loadu_si512(in + (p0 + q) * ld + i0) : Vec<float>{};
      }
      transpose_block<float>(r);  // r[i] now holds pairs p0.. of row i0 + i
      const int64_t rows = std::min(kLanes16, m - i0);
      for (int64_t i = 0; i < rows; ++i) {
        _mm512_mask_storeu_epi32(out + (i0 + i) * pairs + p0, first_lanes(np), (__m512i)r[i]);
      }
    }
  }
}

// brgemm: the products through oneDNN (brgemm_panels), a transposed A (the backward's dK and
// dV) turned into rows first; without it the AVX512-BF16 register blocks.
ATTNLAB_BF16 void bf16_gemm_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const float* a, int64_t lda, const float* b,
                                   int64_t ldb, float beta, float* c, int64_t ldc, bool brgemm) {
  const int64_t pairs = (k + 1) / 2;
  // Per-thread buffers, grown as needed: the attention kernels call this on every block.
  thread_local AlignedVector<Pair> packed_a, packed_b;
  // op(B) in panels of kCols columns (the last one narrower), each panel's pairs contiguous so
  // that a register block streams through memory in order: panel j0 starts at j0·pairs.
  const int64_t ldpb = round_up(n, kLanes16);
  if (static_cast<int64_t>(packed_b.size()) < pairs * ldpb) packed_b.resize(pairs * ldpb);
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t width = std::min(kCols, n - j0), ldo = round_up(width, kLanes16);
    if (trans_b) {
      pack_transposed_pairs(b + j0 * ldb, ldb, k, width, packed_b.data() + j0 * pairs, ldo);
    } else {
      pack_row_pairs(b + j0, ldb, k, width, packed_b.data() + j0 * pairs, ldo);
    }
  }
  int64_t a_row, a_pair;
  if (trans_a) {  // op(A)'s columns are A's rows: packed like B, pairs of rows interleaved
    const int64_t ldpa = round_up(m, kLanes16);
    if (static_cast<int64_t>(packed_a.size()) < pairs * ldpa) packed_a.resize(pairs * ldpa);
    pack_row_pairs(a, lda, k, m, packed_a.data(), ldpa);
    a_row = 1;
    a_pair = ldpa;
  } else {
    if (static_cast<int64_t>(packed_a.size()) < m * pairs) packed_a.resize(m * pairs);
    pack_rows(a, lda, k, m, packed_a.data(), pairs);
    a_row = pairs;
    a_pair = 1;
  }
  const Pair* pa = packed_a.data();
  const Pair* pb = packed_b.data();
  if (brgemm && trans_a) {
    // oneDNN's brgemm takes A by rows: the pairs packed down op(A)'s columns above, turned
    // into rows of pairs by 16×16 transposes.
    thread_local AlignedVector<Pair> rows_a;
    if (static_cast<int64_t>(rows_a.size()) < m * pairs) rows_a.resize(m * pairs);
    transpose_pairs(pa, a_pair, pairs, m, rows_a.data());
    brgemm_panels(m, n, pairs, rows_a.data(), pb, alpha, beta, c, ldc);
    return;
  }
  if (brgemm) {
    brgemm_panels(m, n, pairs, pa, pb, alpha, beta, c, ldc);
    return;
  }
  column_blocks(m, n, pairs, pa, a_row, a_pair, pb, pairs, 0, alpha, beta, c, ldc);
}

// Whether bf16_gemm takes the brgemm route: by default where oneDNN packs bfloat16 B for its
// brgemm (could_pack: the CPU has AMX-BF16); ATTNLAB_CPU_BRGEMM=1 takes it on any AVX512-BF16
// CPU (oneDNN's brgemm then runs vdpbf16ps on the same layout) and =0 never. Then only if a
// 19×45×37 product of every transpose of B through brgemm_panels agrees with the register
// blocks (else a warning, once, and the register blocks).
bool brgemm_route() {
  static const bool usable = [] {
    const char* env = std::getenv("ATTNLAB_CPU_BRGEMM");
    const bool forced = env != nullptr && std::strcmp(env, "1") == 0;
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    if (!forced && !at::native::cpublas::could_pack(at::kBFloat16)) return false;
    constexpr int64_t m = 19, n = 45, k = 37;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> a(m * k), b(k * n), ref(m * n), got(m * n);
    for (float& x : a) x = normal(rng);
    for (float& x : b) x = normal(rng);
    for (const bool trans_b : {false, true}) {
      const int64_t ldb = trans_b ? k : n;
      bf16_gemm_avx512(false, trans_b, m, n, k, 0.5f, a.data(), k, b.data(), ldb, 0.0f,
                       ref.data(), n, false);
      bf16_gemm_avx512(false, trans_b, m, n, k, 0.5f, a.data(), k, b.data(), ldb, 0.0f,
                       got.data(), n, true);
      for (int64_t i = 0; i < m * n; ++i) {
        // The same exact products summed in another order: float32 rounding apart.
        if (!(std::fabs(got[i] - ref[i]) <= 1e-4f * (1.0f + std::fabs(ref[i])))) {
          TORCH_WARN("attnlab: oneDNN's brgemm disagreed with attnlab's AVX512-BF16 kernel ",
                     "on a test product (", got[i], " vs ", ref[i], " at ", i,
                     "); bfloat16 attention runs on the latter");
          return false;
        }
      }
    }
    return true;
  }();
  return usable;
}

// Multiply-adds per time-stamp tick of a run of independent vdpbf16ps (32 per instruction) and
// of vfmadd231ps (16), each on twelve accumulators held in registers: the CPU's peak rate of
// either kind of product, whatever its clock. The two differ between CPUs that have both: an
// AMD Zen 4 core issues one 512-bit float FMA per cycle and vdpbf16ps at about the same rate
// (bfloat16 products twice as fast), an Intel Xeon (Emerald Rapids, measured) two FMAs per
// cycle and vdpbf16ps at one per two (bfloat16 products twice as slow: 18 against 38
// multiply-adds per tick, and the bfloat16 attention forward 1.3-1.9x slower than float32's).
constexpr int kProbeChains = 12;

ATTNLAB_BF16 __attribute__((noinline)) double bf16_products_per_tick(int64_t steps) {
  __m512 acc[kProbeChains];
  ATTNLAB_UNROLL
  for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f00);
  const uint64_t start = __rdtsc();
  for (int64_t s = 0; s < steps; ++s) {
    ATTNLAB_UNROLL
    for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  const uint64_t ticks = __rdtsc() - start;
  __m512 sum = acc[0];
  ATTNLAB_UNROLL
  for (int i = 1; i < kProbeChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  __asm__ volatile("" : : "v"(sum));
  return 32.0 * kProbeChains * static_cast<double>(steps) / static_cast<double>(ticks + 1);
}

ATTNLAB_BF16 __attribute__((noinline)) double f32_products_per_tick(int64_t steps) {
  __m512 acc[kProbeChains];
  ATTNLAB_UNROLL
  for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.5f);
  const uint64_t start = __rdtsc();
  for (int64_t s = 0; s < steps; ++s) {
    ATTNLAB_UNROLL
    for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  const uint64_t ticks = __rdtsc() - start;
  __m512 sum = acc[0];
  ATTNLAB_UNROLL
  for (int i = 1; i < kProbeChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  __asm__ volatile("" : : "v"(sum));
  return 16.0 * kProbeChains * static_cast<double>(steps) / static_cast<double>(ticks + 1);
}

}  // namespace

double bf16_product_speedup() {
  static const double speedup = [] {
    if (!bf16_gemm_available()) return 0.0;
    // The best of five short alternating runs (about 0.1 ms each), so that an interruption
    // of one (another process, a timer) does not decide.
    double bf16 = 0.0, f32 = 0.0;
    for (int round = 0; round < 5; ++round) {
      bf16 = std::max(bf16, bf16_products_per_tick(4000));
      f32 = std::max(f32, f32_products_per_tick(4000));
    }
    return bf16 / f32;
  }();
  return speedup;
}

bool bf16_products_pay() {
  static const bool pay = [] {
    if (!bf16_gemm_available()) return false;
    const char* env = std::getenv("ATTNLAB_CPU_BF16_PRODUCTS");
    if (env != nullptr && std::strcmp(env, "1") == 0) return true;
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    // AMX tiles (or oneDNN's brgemm, when forced) are taken for their own speed.
    if (brgemm_route()) return true;
    return bf16_product_speedup() >= kBf16ProductsMinSpeedup;
  }();
  return pay;
}

bool bf16_gemm_available() {
  static const bool available = has_avx512_core() && __builtin_cpu_supports("avx512bf16");
  return available;
}

bool bf16_prepacked_route() {
  return bf16_gemm_available() && (brgemm_route() || bf16_products_pay());
}

void bf16_prepacked_release() {
  if (bf16_gemm_available() && brgemm_route()) at::native::cpublas::brgemm_release(true);
}

const char* bf16_products() {
  if (!bf16_gemm_available()) return "float32";
  if (!brgemm_route()) return "avx512_bf16";
  return at::native::cpublas::could_pack(at::kBFloat16) ? "amx" : "onednn_brgemm";
}

int64_t bf16_packed_ld(int64_t n) { return round_up(n, kLanes16); }

int64_t bf16_packed_pairs(int64_t k, int64_t n) { return (k + 1) / 2 * round_up(n, kLanes16); }

// bf16_pack_b of a float32 or a bfloat16 B (the packers are overloaded by source type).
template <typename Src>
void pack_b(bool trans_b, int64_t k, int64_t n, const Src* b, int64_t ldb, uint32_t* packed) {
  if (trans_b) {
    pack_transposed_pairs(b, ldb, k, n, packed, bf16_packed_ld(n));
  } else {
    pack_row_pairs(b, ldb, k, n, packed, bf16_packed_ld(n));
  }
}

void bf16_pack_b(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb,
                 uint32_t* packed) {
  pack_b(trans_b, k, n, b, ldb, packed);
}

void bf16_pack_b(bool trans_b, int64_t k, int64_t n, const uint16_t* b, int64_t ldb,
                 uint32_t* packed) {
  pack_b(trans_b, k, n, b, ldb, packed);
}

void bf16_pack_rows16(int64_t m, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                      uint16_t* out, int64_t ldo) {
  TORCH_CHECK(alpha == 1.0f || bf16_exact_scale(alpha),
              "bf16_pack_rows16: alpha must be a power of two, got ", alpha);
  TORCH_CHECK(ldo >= round_up(k, 2), "bf16_pack_rows16: ldo ", ldo, " < k rounded up to even");
  pack_rows16(a, lda, k, m, alpha, out, ldo);
}

ATTNLAB_BF16 void bf16_gemm_prepacked16(int64_t m, int64_t n, int64_t k, float alpha,
                                        const uint16_t* a, int64_t lda, const uint32_t* packed,
                                        int64_t ldo, int64_t k0, int64_t n0, bool accumulate,
                                        float* c, int64_t ldc) {
  TORCH_CHECK(k0 % 2 == 0 && (alpha == 1.0f || !accumulate),
              "bf16_gemm_prepacked16: k0 must be even and alpha 1 when accumulating");
  if (m <= 0 || n <= 0) return;
  const int64_t even = k / 2 * 2;
  if (even > 0 && !brgemm_route()) {
    // attnlab's register blocks on the same layouts: A's rows read as pairs in place (the
    // attention's rows are), or copied to whole pairs first where they cannot be.
    const Pair* pa = reinterpret_cast<const Pair*>(a);
    int64_t a_row = lda / 2;
    if (lda % 2 != 0 || reinterpret_cast<uintptr_t>(a) % alignof(Pair) != 0) {
      thread_local AlignedVector<Pair> rows;
      a_row = even / 2;
      if (static_cast<int64_t>(rows.size()) < m * a_row) rows.resize(m * a_row);
      for (int64_t i = 0; i < m; ++i) std::memcpy(rows.data() + i * a_row, a + i * lda, 2 * even);
      pa = rows.data();
    }
    // An even k takes alpha in the blocks; an odd k's last term comes after, then alpha.
    column_blocks(m, n, even / 2, pa, a_row, 1, packed + (k0 / 2) * ldo + n0, 1, ldo,
                  k == even ? alpha : 1.0f, accumulate ? 1.0f : 0.0f, c, ldc);
    if (k == even) return;
  } else if (even > 0) {
    const auto* b = reinterpret_cast<const c10::BFloat16*>(packed + (k0 / 2) * ldo + n0);
    at::native::cpublas::brgemm(m, n, even, lda, ldo, ldc, accumulate,
                                reinterpret_cast<const c10::BFloat16*>(a), b, c, true);
    // The tiles stay configured for the next product (bf16_prepacked_release ends that).
  } else if (!accumulate) {  // nothing for brgemm: C starts from 0
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
  }
  if (k % 2 != 0) {
    // Row k0 + k − 1 of op(B) (even) is the low half of its pair: its term added on its own,
    // so that the pair's other half (the next row, whatever it holds) is never multiplied.
    add_last_column(m, n, a + (k - 1), lda, packed + ((k0 + k - 1) / 2) * ldo + n0,
                    accumulate || even > 0, c, ldc);
  }
  if (alpha != 1.0f) scale_block(m, n, alpha, c, ldc);
}

void bf16_gemm_prepacked(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                         int64_t lda, const uint32_t* packed, int64_t ldo, int64_t k0, int64_t n0,
                         bool accumulate, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;  // (bf16_gemm_prepacked16 checks k0 and alpha)
  thread_local AlignedVector<Pair> packed_a;
  const int64_t pairs = (k + 1) / 2;
  if (static_cast<int64_t>(packed_a.size()) < m * pairs) packed_a.resize(m * pairs);
  // A power-of-two alpha (the scale 1/√d at d = 4, 16, 64, 256, ...) goes into A exactly (but
  // for subnormal results); any other scales C after the product, which took 6 % of a
  // (8, 8, 512, 64) bfloat16 forward (perf, one thread, AMX Xeon).
  const bool exact_alpha = alpha != 1.0f && !accumulate && bf16_exact_scale(alpha);
  if (exact_alpha) {
    pack_rows_scaled(a, lda, k, m, alpha, packed_a.data(), pairs);
  } else {
    pack_rows(a, lda, k, m, packed_a.data(), pairs);
  }
  bf16_gemm_prepacked16(m, n, k, exact_alpha ? 1.0f : alpha,
                        reinterpret_cast<const uint16_t*>(packed_a.data()), 2 * pairs, packed,
                        ldo, k0, n0, accumulate, c, ldc);
}

#else

bool bf16_gemm_available() { return false; }

const char* bf16_products() { return "float32"; }

bool bf16_prepacked_route() { return false; }

void bf16_prepacked_release() {}

int64_t bf16_packed_ld(int64_t n) { return n; }

int64_t bf16_packed_pairs(int64_t, int64_t) { return 0; }

void bf16_pack_b(bool, int64_t, int64_t, const float*, int64_t, uint32_t*) {
  TORCH_CHECK(false, "bf16_pack_b: this build has no AVX512-BF16 kernels");
}

void bf16_gemm_prepacked(int64_t, int64_t, int64_t, float, const float*, int64_t,
                         const uint32_t*, int64_t, int64_t, int64_t, bool, float*, int64_t) {
  TORCH_CHECK(false, "bf16_gemm_prepacked: this build has no AVX512-BF16 kernels");
}

void bf16_pack_b(bool, int64_t, int64_t, const uint16_t*, int64_t, uint32_t*) {
  TORCH_CHECK(false, "bf16_pack_b: this build has no AVX512-BF16 kernels");
}

void bf16_pack_rows16(int64_t, int64_t, float, const uint16_t*, int64_t, uint16_t*, int64_t) {
  TORCH_CHECK(false, "bf16_pack_rows16: this build has no AVX512-BF16 kernels");
}

void bf16_gemm_prepacked16(int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                           const uint32_t*, int64_t, int64_t, int64_t, bool, float*, int64_t) {
  TORCH_CHECK(false, "bf16_gemm_prepacked16: this build has no AVX512-BF16 kernels");
}

double bf16_product_speedup() { return 0.0; }

bool bf16_products_pay() { return false; }

#endif

bool bf16_exact_scale(float alpha) {
  int exponent = 0;
  return std::frexp(alpha, &exponent) == 0.5f;
}

void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  TORCH_CHECK(bf16_gemm_available(), "bf16_gemm: needs bf16_gemm_available() "
              "(cpu::gemm_bf16_operands picks the route for any CPU)");
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    empty_sum_product(m, n, beta, c, ldc, c, ldc);
    return;
  }
#ifdef ATTNLAB_HAVE_BF16_KERNEL
  bf16_gemm_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                   brgemm_route());
#endif
}

}  // namespace attnlab::cpu

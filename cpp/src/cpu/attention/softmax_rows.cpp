#include "cpu/attention/softmax_rows.h"

// The whole-vector helpers (vec_lanes.h) pass 64-byte vectors by value, all inlined into the
// per-ISA clones: GCC's note that such an ABI differs between instruction sets does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <c10/util/Exception.h>

#include "cpu/gemm/gemm.h"
#include "cpu/isa/isa.h"
#include "cpu/isa/vec_lanes.h"
#include "cpu/isa/vec_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTNLAB_HAVE_AVX512_EXP 1
#include <immintrin.h>
#endif

namespace attnlab::cpu {
namespace {

constexpr uint16_t kBf16NaN = 0x7FC0;  // bfloat16's quiet NaN, as c10::BFloat16 rounds NaN

#ifdef ATTNLAB_HAVE_AVX512_EXP
#define ATTNLAB_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define ATTNLAB_AVX512_INLINE ATTNLAB_AVX512 inline __attribute__((always_inline))
#else
#define ATTNLAB_AVX512
#endif
#ifdef ATTNLAB_HAVE_AVX512_EXP

// exp(x − shift) for x − shift <= 0, 16 lanes, with AVX-512's own exponent instructions:
// x − shift = n·ln2 + r (n rounded by vrndscaleps, |r| <= ln2/2, ln2 in two parts), exp(r) from
// a degree-5 polynomial whose coefficients were fitted here for the least maximum relative
// error on that interval (1.7e-7 in float arithmetic, against 2e-7 for exp_nonpositive), and
// 2^n applied by vscalefps. Lanes below −87 (where exp underflows the normal range; −inf
// included) are 0, as exp_nonpositive gives, without producing subnormals; NaN stays NaN.
// 14 vector operations per 16 lanes where GCC's vectorization of exp_nonpositive takes 21.
ATTNLAB_AVX512_INLINE __m512 exp_shifted16(__m512 x, __m512 shift) {
  const __m512 d = _mm512_sub_ps(x, shift);
  const __mmask16 normal = _mm512_cmp_ps_mask(d, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
  const __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(1.44269504088896341f));
  // (the masked form: the unmasked one passes GCC 12 an uninitialized vector)
  const __m512 n = _mm512_mask_roundscale_ps(t, __mmask16(0xFFFF), t,
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), d);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(8.2903150469e-3f), r, _mm512_set1_ps(4.1897930205e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6667635739e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.9999150634e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.9999970198e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(normal, p, n);
}

// exp_shift_sum's contract (below) on exp_shifted16; a last partial vector is read and written
// under a lane mask. A call per row (GCC does not inline AVX-512 code into the generic helpers
// that lead here).
ATTNLAB_AVX512 float exp_shift_sum16(float* x, int64_t n, float shift) {
  const __m512 vshift = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {  // two running sums: one was a chain of dependent additions
    const __m512 e = exp_shifted16(_mm512_loadu_ps(x + c), vshift);
    const __m512 e1 = exp_shifted16(_mm512_loadu_ps(x + c + 16), vshift);
    _mm512_storeu_ps(x + c, e);
    _mm512_storeu_ps(x + c + 16, e1);
    sum = _mm512_add_ps(sum, e);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  sum = _mm512_add_ps(sum, sum1);
  for (; c + 16 <= n; c += 16) {
    const __m512 e = exp_shifted16(_mm512_loadu_ps(x + c), vshift);
    _mm512_storeu_ps(x + c, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (c < n) {
    const __mmask16 lanes = __mmask16((1u << (n - c)) - 1);
    const __m512 e = exp_shifted16(
        _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), lanes,
                             x + c),
        vshift);
    _mm512_mask_storeu_ps(x + c, lanes, e);
    sum = _mm512_add_ps(sum, e);
  }
  // In a tree: 16 lanes added one after the other were a chain of 16 dependent additions per
  // row, a cost that causal and short rows feel most.
  return _mm512_reduce_add_ps(sum);
}

// exp_shift_sum16 that also returns Σ e·(x − shift) in *dot: with the sum S, a row's entropy
// is log S − dot / S, free of the cancellation of lse − Σ p·x (the weight summaries'). Masked
// lanes (e = 0) add 0: x − shift is kept above −200 where exp is 0 already.
ATTNLAB_AVX512 float exp_shift_dot16(float* x, int64_t n, float shift, float* dot) {
  const __m512 vshift = _mm512_set1_ps(shift), floor = _mm512_set1_ps(-200.0f);
  const __m512 none = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 sum = _mm512_setzero_ps(), dots = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 lanes = n - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - c)) - 1);
    const __m512 xv = _mm512_mask_loadu_ps(none, lanes, x + c);
    const __m512 e = exp_shifted16(xv, vshift);
    _mm512_mask_storeu_ps(x + c, lanes, e);
    sum = _mm512_add_ps(sum, e);
    dots = _mm512_fmadd_ps(e, _mm512_max_ps(_mm512_sub_ps(xv, vshift), floor), dots);
  }
  *dot = _mm512_reduce_add_ps(dots);
  return _mm512_reduce_add_ps(sum);
}

#define ATTNLAB_AVX2_INLINE ATTNLAB_AVX2_TARGET inline __attribute__((always_inline))

// The float row passes in AVX2 intrinsics, run where avx2_without_avx512() (cpu/isa/isa.h): on an
// AMD EPYC Zen 3 the generic online_softmax_block took more time than the MKL products around
// it (30 % of a (8, 8, 512, 64) float32 forward against 27 %).
//
// exp_nonpositive (vec_math.h) over 8 lanes, the same formula step by step: x clamped below
// at -100 (NaN kept), x = n·ln2 + r, Cephes' degree-7 polynomial, 2^n from the exponent bits.
// Lanes below −87 are 0, as exp_shifted16 gives them (no subnormals); NaN stays NaN.
ATTNLAB_AVX2_INLINE __m256 exp_nonpositive8(__m256 x) {
  const __m256 xc = _mm256_max_ps(_mm256_set1_ps(-100.0f), x);  // (NaN: the 2nd operand)
  const __m256 round = _mm256_set1_ps(12582912.0f);
  const __m256 shifted = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), round);
  const __m256 n = _mm256_sub_ps(shifted, round);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_fmadd_ps(r, _mm256_set1_ps(1.9875691500e-4f), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  __m256i bits = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x4B400000 - 127));
  bits = _mm256_slli_epi32(_mm256_max_epi32(bits, _mm256_setzero_si256()), 23);
  const __m256 normal = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NLT_UQ);
  return _mm256_and_ps(normal, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

ATTNLAB_AVX2_INLINE float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp_shift_sum's contract on exp_nonpositive8: two running sums; a last partial vector
// through a −inf-padded copy.
ATTNLAB_AVX2_TARGET float exp_shift_sum8(float* x, int64_t n, float shift) {
  const __m256 vshift = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(x + c), vshift));
    const __m256 e1 = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), vshift));
    _mm256_storeu_ps(x + c, e);
    _mm256_storeu_ps(x + c + 8, e1);
    sum = _mm256_add_ps(sum, e);
    sum1 = _mm256_add_ps(sum1, e1);
  }
  sum = _mm256_add_ps(sum, sum1);
  for (; c + 8 <= n; c += 8) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(x + c), vshift));
    _mm256_storeu_ps(x + c, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (c < n) {
    alignas(32) float tail[8];
    for (int64_t j = 0; j < 8; ++j) {
      tail[j] = c + j < n ? x[c + j] : -std::numeric_limits<float>::infinity();
    }
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_load_ps(tail), vshift));
    _mm256_store_ps(tail, e);
    for (int64_t j = 0; c + j < n; ++j) x[c + j] = tail[j];
    sum = _mm256_add_ps(sum, e);
  }
  return sum8(sum);
}

// exp_shift_sum8 with Σ e·max(x − shift, −200) in *dot, as exp_shift_dot16.
ATTNLAB_AVX2_TARGET float exp_shift_dot8(float* x, int64_t n, float shift, float* dot) {
  const __m256 vshift = _mm256_set1_ps(shift), floor = _mm256_set1_ps(-200.0f);
  __m256 sum = _mm256_setzero_ps(), dots = _mm256_setzero_ps();
  alignas(32) float tail[8];
  for (int64_t c = 0; c < n; c += 8) {
    const bool whole = n - c >= 8;
    if (!whole) {
      for (int64_t j = 0; j < 8; ++j) {
        tail[j] = c + j < n ? x[c + j] : -std::numeric_limits<float>::infinity();
      }
    }
    float* at = whole ? x + c : tail;
    const __m256 shifted = _mm256_sub_ps(_mm256_loadu_ps(at), vshift);
    const __m256 e = exp_nonpositive8(shifted);
    _mm256_storeu_ps(at, e);
    sum = _mm256_add_ps(sum, e);
    dots = _mm256_fmadd_ps(e, _mm256_max_ps(shifted, floor), dots);
    if (!whole) {
      for (int64_t j = 0; c + j < n; ++j) x[c + j] = tail[j];
    }
  }
  *dot = sum8(dots);
  return sum8(sum);
}

// The largest of x[0, n), NaN skipped (−inf for none), in four running maxima.
ATTNLAB_AVX2_TARGET float max_of8(const float* x, int64_t n) {
  const __m256 none = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m = none, m1 = none, m2 = none, m3 = none;
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {  // NaN in x: the running max (vmaxps returns its 2nd operand)
    m = _mm256_max_ps(_mm256_loadu_ps(x + c), m);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + c + 8), m1);
    m2 = _mm256_max_ps(_mm256_loadu_ps(x + c + 16), m2);
    m3 = _mm256_max_ps(_mm256_loadu_ps(x + c + 24), m3);
  }
  m = _mm256_max_ps(_mm256_max_ps(m, m1), _mm256_max_ps(m2, m3));
  for (; c + 8 <= n; c += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + c), m);
  float result;
  {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    result = _mm_cvtss_f32(h);
  }
  for (; c < n; ++c) result = x[c] > result ? x[c] : result;
  return result;
}

#define ATTNLAB_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// exp(x − shift) for probabilities that are then rounded to bfloat16 (relative error up to 2^-8):
// 2^t with t = x·log2(e) − shift·log2(e) in one FMA, t = n + r (|r| <= 1/2) and 2^r from a
// degree-4 polynomial (fitted here: relative error 2.7e-6; t's rounding adds up to about 5e-6
// where |shift| < 64), 11 vector operations where exp_shifted16 takes 14. Lanes with t < −126
// are 0 (−inf included); NaN stays NaN.
ATTNLAB_AVX512_INLINE __m512 exp_shifted16_coarse(__m512 x, __m512 shift_log2e) {
  const __m512 t = _mm512_fmsub_ps(x, _mm512_set1_ps(1.44269504088896341f), shift_log2e);
  const __mmask16 normal = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_mask_roundscale_ps(t, __mmask16(0xFFFF), t,
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(t, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(9.570101276e-3f), r, _mm512_set1_ps(5.591786280e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402474433e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931217909e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.999992847e-1f));
  return _mm512_maskz_scalef_ps(normal, p, n);
}

ATTNLAB_AVX512_BF16 inline __attribute__((always_inline)) void store_bf16(uint16_t* out,
                                                                          __m512 e) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh(e));
}

// exp_shift_sum16 on exp_shifted16_coarse, writing the exps rounded to bfloat16 (to nearest
// even) into out16 instead of x; the sum is of the unrounded float32 values, in two running
// sums (one was a chain of dependent additions). Only on CPUs with AVX512-BF16.
ATTNLAB_AVX512_BF16 float exp_shift_sum16_bf16(const float* x, int64_t n, float shift,
                                               uint16_t* out16) {
  const __m512 vshift = _mm512_set1_ps(shift * 1.44269504088896341f);
  __m512 sum = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    const __m512 e = exp_shifted16_coarse(_mm512_loadu_ps(x + c), vshift);
    const __m512 e1 = exp_shifted16_coarse(_mm512_loadu_ps(x + c + 16), vshift);
    store_bf16(out16 + c, e);
    store_bf16(out16 + c + 16, e1);
    sum = _mm512_add_ps(sum, e);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  sum = _mm512_add_ps(sum, sum1);
  for (; c + 16 <= n; c += 16) {
    const __m512 e = exp_shifted16_coarse(_mm512_loadu_ps(x + c), vshift);
    store_bf16(out16 + c, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (c < n) {
    const __mmask16 lanes = __mmask16((1u << (n - c)) - 1);
    const __m512 e = exp_shifted16_coarse(
        _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), lanes,
                             x + c),
        vshift);
    _mm256_mask_storeu_epi16(out16 + c, lanes, (__m256i)_mm512_cvtneps_pbh(e));
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// The largest of x[0, n), NaN skipped (−inf for none): whole vectors, a last partial one under
// a lane mask, the lanes reduced in a tree.
ATTNLAB_AVX512 float max_of16(const float* x, int64_t n) {
  // Four running maxima over 64 columns at a time: with one, each vmaxps waited on the last
  // (4 cycles per 16 columns), 54 % of this pass in a bfloat16 (8, 8, 512, 64) forward.
  const __m512 none = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = none, m1 = none, m2 = none, m3 = none;
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {  // NaN in x: the running max (vmaxps returns its 2nd operand)
    m = _mm512_max_ps(_mm512_loadu_ps(x + c), m);
    m1 = _mm512_max_ps(_mm512_loadu_ps(x + c + 16), m1);
    m2 = _mm512_max_ps(_mm512_loadu_ps(x + c + 32), m2);
    m3 = _mm512_max_ps(_mm512_loadu_ps(x + c + 48), m3);
  }
  m = _mm512_max_ps(_mm512_max_ps(m, m1), _mm512_max_ps(m2, m3));
  for (; c + 16 <= n; c += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + c), m);
  if (c < n) {
    m = _mm512_mask_max_ps(m, __mmask16((1u << (n - c)) - 1), _mm512_loadu_ps(x + c), m);
  }
  return _mm512_reduce_max_ps(m);
}
#endif

ATTNLAB_INLINE int64_t visible_cols(int64_t visible_base, int64_t r, int64_t cols) {
  return std::clamp<int64_t>(visible_base + r, 0, cols);
}

// Elements per 64-byte vector: the row loops run in whole chunks of this many.
template <typename T>
constexpr int64_t kChunk = kLanes<T>;

// x[j] = exp(x[j] − shift) over one chunk, adding each result to its lane's running sum.
template <typename T>
ATTNLAB_INLINE void exp_shift_chunk(T* x, T shift, T* lane_sums) {
  for (int64_t j = 0; j < kChunk<T>; ++j) {
    const T e = exp_nonpositive(x[j] - shift);
    x[j] = e;
    lane_sums[j] += e;
  }
}

// The row loops run over whole chunks: GCC's loop remainders are scalar (and its max-reduction
// remainder stalls on store forwarding), while short rows (L = 10, 16, causal rows) are mostly
// remainder. A row's visible part is therefore padded with −inf up to a whole chunk when the
// row owns the room (`capacity` elements); otherwise the last chunk goes through a copy.
// Returns the length to process: a multiple of the chunk, or n itself without room.
template <typename T>
ATTNLAB_INLINE int64_t pad_to_chunks(T* x, int64_t n, int64_t capacity) {
  const int64_t padded = (n + kChunk<T> - 1) / kChunk<T> * kChunk<T>;
  if (padded > capacity) return n;
  for (int64_t c = n; c < padded; ++c) x[c] = -std::numeric_limits<T>::infinity();
  return padded;
}

// Applies `chunk_fn` to every whole chunk of x[0, n); a last partial chunk goes through a
// −inf-padded copy whose first n % chunk entries are copied back.
template <typename T, typename ChunkFn>
ATTNLAB_INLINE void for_each_chunk(T* x, int64_t n, ChunkFn&& chunk_fn) {
  constexpr int64_t L = kChunk<T>;
  int64_t c = 0;
  for (; c + L <= n; c += L) chunk_fn(x + c);
  if (c == n) return;
  T tail[L];
  for (int64_t j = 0; j < L; ++j) tail[j] = c + j < n ? x[c + j] : -std::numeric_limits<T>::infinity();
  chunk_fn(tail);
  for (int64_t j = 0; j < n - c; ++j) x[c + j] = tail[j];
}

template <typename T>
ATTNLAB_INLINE T max_of(T* x, int64_t n) {
#ifdef ATTNLAB_HAVE_AVX512_EXP
  if constexpr (std::is_same_v<T, float>) {
    if (avx2_without_avx512()) return max_of8(x, n);
  }
#endif
  Vec<T> lanes = {};
  lanes -= std::numeric_limits<T>::infinity();
  for_each_chunk(x, n, [&](const T* chunk) {
    Vec<T> v;
    std::memcpy(&v, chunk, sizeof(v));
    lanes = v > lanes ? v : lanes;
  });
  T result = lanes[0];
  for (int64_t j = 1; j < kChunk<T>; ++j) result = lanes[j] > result ? lanes[j] : result;
  return result;
}

// x[c] = exp(x[c] − shift) for c < n; returns the sum (lanes summed once, at the end).
// Avx512: on exp_shift_sum16 (float only, called from AVX-512 code only).
template <typename T, bool Avx512>
ATTNLAB_INLINE T exp_shift_sum(T* x, int64_t n, T shift) {
#ifdef ATTNLAB_HAVE_AVX512_EXP
  if constexpr (Avx512) return exp_shift_sum16(x, n, shift);
  if constexpr (std::is_same_v<T, float>) {
    if (avx2_without_avx512()) return exp_shift_sum8(x, n, shift);
  }
#endif
  T lane_sums[kChunk<T>] = {};
  for_each_chunk(x, n, [&](T* chunk) { exp_shift_chunk(chunk, shift, lane_sums); });
  T sum = 0;
  for (int64_t j = 0; j < kChunk<T>; ++j) sum += lane_sums[j];
  return sum;
}

// exp_shift_sum, with Σ e·(x − shift) in *dot (exp_shift_dot16 on AVX-512, exp_shift_dot8 on
// AVX2, chunks elsewhere: as one scalar loop it made the summaries' entropy cost 0.7–1.9× the
// forward's own time on an AMD EPYC Zen 3, benchmarks/summaries_cpu.py).
template <typename T, bool Avx512>
ATTNLAB_INLINE T exp_shift_dot(T* x, int64_t n, T shift, T* dot) {
#ifdef ATTNLAB_HAVE_AVX512_EXP
  if constexpr (Avx512) return exp_shift_dot16(x, n, shift, dot);
  if constexpr (std::is_same_v<T, float>) {
    if (avx2_without_avx512()) return exp_shift_dot8(x, n, shift, dot);
  }
#endif
  T lane_sums[kChunk<T>] = {}, lane_dots[kChunk<T>] = {};
  for_each_chunk(x, n, [&](T* chunk) {
    T shifted[kChunk<T>];
    for (int64_t j = 0; j < kChunk<T>; ++j) shifted[j] = std::max(chunk[j] - shift, T(-200));
    exp_shift_chunk(chunk, shift, lane_sums);
    for (int64_t j = 0; j < kChunk<T>; ++j) lane_dots[j] += chunk[j] * shifted[j];
  });
  T sum = 0, dots = 0;
  for (int64_t j = 0; j < kChunk<T>; ++j) {
    sum += lane_sums[j];
    dots += lane_dots[j];
  }
  *dot = dots;
  return sum;
}

template <typename T>
ATTNLAB_INLINE void zero_from(T* x, int64_t from, int64_t to) {
  for (int64_t c = from; c < to; ++c) x[c] = T(0);
}

// A -inf mask entry hides the key whatever its score: a NaN or inf score there stays out of
// the row instead of turning it into NaN (-inf + NaN would be NaN).
template <typename T>
ATTNLAB_INLINE void add_mask_row(T* x, const T* mask, int64_t n) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) x[c] = mask[c] == kNegInf ? kNegInf : x[c] + mask[c];
}

// probs16 (float on AVX-512 only; null otherwise): online_softmax_block_bf16's destination.
template <typename T, bool Avx512 = false>
ATTNLAB_INLINE void online_softmax_block_impl(T* s, int64_t rows, int64_t cols, int64_t ld,
                                              const T* mask, int64_t mask_ld,
                                              int64_t visible_base, T* row_max, T* row_sum,
                                              T* correction, const T* known_max,
                                              uint16_t* probs16 = nullptr, int64_t ld16 = 0,
                                              T* row_dot = nullptr) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    T* x = s + r * ld;
    uint16_t* x16 = probs16 ? probs16 + r * ld16 : nullptr;
    const int64_t visible = visible_cols(visible_base, r, cols);
    if (mask) add_mask_row(x, mask + r * mask_ld, visible);
    const int64_t width = pad_to_chunks(x, visible, ld);
    const T old_max = row_max[r];
    T block_max;
    if (known_max != nullptr && !std::isnan(known_max[r])) {
      block_max = known_max[r];  // (no max pass: 5 % of a causal (8, 8, 512, 64) forward)
    } else
#ifdef ATTNLAB_HAVE_AVX512_EXP
    if constexpr (Avx512) {
      block_max = max_of16(x, width);
    } else {
      block_max = max_of(x, width);
    }
#else
    block_max = max_of(x, width);
#endif
    const T new_max = block_max > old_max ? block_max : old_max;
    if (new_max == kNegInf) {
      // Nothing visible yet. The max skips NaN, so look for one: NaN must not turn into zeros.
      bool has_nan = false;
      for (int64_t c = 0; c < visible; ++c) has_nan |= std::isnan(x[c]);
      std::fill(x, x + std::max(width, cols), has_nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
      if (x16) std::fill(x16, x16 + std::max(width, cols), has_nan ? kBf16NaN : uint16_t(0));
      if (has_nan) row_sum[r] = std::numeric_limits<T>::quiet_NaN();
      correction[r] = T(1);
      if (row_dot) row_dot[r] = T(0);
      continue;
    }
    T sum;
    if (row_dot) {
      sum = exp_shift_dot<T, Avx512 && std::is_same_v<T, float>>(x, width, new_max, row_dot + r);
      zero_from(x, width, cols);
    } else
#ifdef ATTNLAB_HAVE_AVX512_EXP
    if constexpr (Avx512 && std::is_same_v<T, float>) {
      if (x16) {
        sum = exp_shift_sum16_bf16(x, width, new_max, x16);
        zero_from(x16, width, cols);
      } else {
        sum = exp_shift_sum<T, Avx512>(x, width, new_max);
        zero_from(x, width, cols);
      }
    } else
#endif
    {
      sum = exp_shift_sum<T, Avx512>(x, width, new_max);
      zero_from(x, width, cols);
    }
    // The first block of a row has nothing to rescale (and no exp to pay for).
    const T alpha = old_max == kNegInf ? T(0) : exp_nonpositive(old_max - new_max);
    correction[r] = alpha;
    row_sum[r] = row_sum[r] * alpha + sum;
    row_max[r] = new_max;
  }
}

template <typename T, bool Avx512 = false>
ATTNLAB_INLINE void probs_from_lse_impl(T* s, int64_t rows, int64_t cols, int64_t ld,
                                        const T* mask, int64_t mask_ld, int64_t visible_base,
                                        const T* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    T* x = s + r * ld;
    const T l = lse[r];
    const int64_t visible = l == -std::numeric_limits<T>::infinity()
                                ? 0
                                : visible_cols(visible_base, r, cols);
    if (mask) add_mask_row(x, mask + r * mask_ld, visible);
    const int64_t width = pad_to_chunks(x, visible, ld);
    exp_shift_sum<T, Avx512>(x, width, l);
    zero_from(x, width, cols);
  }
}

template <typename T>
ATTNLAB_INLINE void softmax_grad_block_impl(const T* p, int64_t ldp, T* dp, int64_t lddp,
                                            int64_t rows, int64_t cols, const T* delta) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = p + r * ldp;
    T* dr = dp + r * lddp;
    const T d = delta[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) dr[c] = pr[c] * (dr[c] - d);
  }
}

// A vector of rows at a time (the scalar loop, a log polynomial per row, took 2 % of a
// bfloat16 (8, 8, 512, 64) forward on an AMX Xeon).
template <typename T>
ATTNLAB_INLINE void row_normalizers_impl(int64_t rows, const T* row_max, const T* row_sum,
                                         T* inv_sum, T* lse) {
  constexpr int64_t L = kLanes<T>;
  const Vec<T> zero = {}, one = zero + T(1), minus_inf = zero - std::numeric_limits<T>::infinity();
  for (int64_t r0 = 0; r0 < rows; r0 += L) {
    const int64_t n = std::min(L, rows - r0);
    const Vec<T> sum = load_part(row_sum + r0, n);
    const auto none = sum == zero;  // a row that saw nothing (NaN compares unequal: kept)
    const Vec<T> safe = none ? one : sum;  // (log's domain)
    store_part(inv_sum + r0, none ? zero : one / safe, n);
    store_part(lse + r0, none ? minus_inf : load_part(row_max + r0, n) + log_positive_vec(safe), n);
  }
}

template <typename T>
ATTNLAB_INLINE void scale_rows_impl(T* x, int64_t rows, int64_t cols, int64_t ld,
                                    const T* factor) {
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * ld;
    const T f = factor[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) xr[c] *= f;
  }
}

template <typename T>
ATTNLAB_INLINE void row_dots_impl(const T* a, int64_t lda, const T* b, int64_t ldb,
                                  int64_t rows, int64_t cols, T* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* ar = a + r * lda;
    const T* br = b + r * ldb;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < cols; ++c) sum += ar[c] * br[c];
    out[r] = sum;
  }
}

// Whether the row operations run their AVX-512 forms (exp_shift_sum16, stream_scaled_row).
bool rows_on_avx512() {
#ifdef ATTNLAB_HAVE_AVX512_EXP
  return has_avx512_core();
#else
  return false;
#endif
}

// The row operations compiled for AVX-512 (where this build has it), float ones on
// exp_shift_sum16; called where rows_on_avx512().
template <typename T>
ATTNLAB_AVX512 void online_softmax_block16(T* s, int64_t rows, int64_t cols, int64_t ld,
                                           const T* mask, int64_t mask_ld, int64_t visible_base,
                                           T* row_max, T* row_sum, T* correction,
                                           const T* known_max, T* row_dot) {
  online_softmax_block_impl<T, std::is_same_v<T, float>>(s, rows, cols, ld, mask, mask_ld,
                                                         visible_base, row_max, row_sum,
                                                         correction, known_max, nullptr, 0,
                                                         row_dot);
}
ATTNLAB_AVX512 void online_softmax_block16_bf16(float* s, int64_t rows, int64_t cols,
                                                int64_t ld, const float* mask, int64_t mask_ld,
                                                int64_t visible_base, float* row_max,
                                                float* row_sum, float* correction,
                                                uint16_t* probs16, int64_t ld16) {
  online_softmax_block_impl<float, true>(s, rows, cols, ld, mask, mask_ld, visible_base,
                                         row_max, row_sum, correction, nullptr, probs16, ld16);
}
template <typename T>
ATTNLAB_AVX512 void probs_from_lse16(T* s, int64_t rows, int64_t cols, int64_t ld,
                                     const T* mask, int64_t mask_ld, int64_t visible_base,
                                     const T* lse) {
  probs_from_lse_impl<T, std::is_same_v<T, float>>(s, rows, cols, ld, mask, mask_ld,
                                                   visible_base, lse);
}

#ifdef ATTNLAB_HAVE_AVX512_EXP
// Columns [c, c + 16) of a stream_scaled_rows row, in `lanes`: src·factor before cols, 0 from
// there.
ATTNLAB_AVX512_INLINE __m512 scaled_or_zero16(const float* src, int64_t c, int64_t cols,
                                              __mmask16 lanes, __m512 factor) {
  const int64_t valid = std::clamp<int64_t>(cols - c, 0, 16);
  const __mmask16 in_src = lanes & __mmask16((1u << valid) - 1);
  return _mm512_maskz_mul_ps(in_src, _mm512_maskz_loadu_ps(in_src, src + c), factor);
}

// One row of stream_scaled_rows: a masked head up to dst's next 64-byte boundary, whole
// aligned vectors streamed, a masked tail.
ATTNLAB_AVX512_INLINE void stream_scaled_row(const float* src, float* dst, int64_t cols,
                                             int64_t width, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) / 4 % 16);
  int64_t c = 0;
  if (misaligned != 0) {
    const int64_t head = std::min<int64_t>(16 - misaligned, width);
    const __mmask16 lanes = __mmask16((1u << head) - 1);
    _mm512_mask_storeu_ps(dst, lanes, scaled_or_zero16(src, 0, cols, lanes, f));
    c = head;
  }
  for (; c + 16 <= width; c += 16) {
    _mm512_stream_ps(dst + c, scaled_or_zero16(src, c, cols, __mmask16(0xFFFF), f));
  }
  if (c < width) {
    const __mmask16 lanes = __mmask16((1u << (width - c)) - 1);
    _mm512_mask_storeu_ps(dst + c, lanes, scaled_or_zero16(src, c, cols, lanes, f));
  }
}

ATTNLAB_AVX512 void stream_scaled_rows16(const float* src, int64_t lds, float* dst, int64_t ldd,
                                         int64_t rows, int64_t cols, int64_t width,
                                         const float* factor) {
  for (int64_t r = 0; r < rows; ++r) {
    stream_scaled_row(src + r * lds, dst + r * ldd, cols, width, factor[r]);
  }
  _mm_sfence();  // the streamed lines are visible to other threads before this returns
}
#endif

}  // namespace

bool can_stream_rows() { return rows_on_avx512(); }

void online_softmax_block_bf16(float* s, int64_t rows, int64_t cols, int64_t ld,
                               const float* mask, int64_t mask_ld, int64_t visible_base,
                               float* row_max, float* row_sum, float* correction,
                               uint16_t* probs16, int64_t ld16) {
  TORCH_CHECK(rows_on_avx512() && bf16_gemm_available(),
              "online_softmax_block_bf16: needs a CPU with AVX512-BF16");
  TORCH_CHECK(ld16 >= ld, "online_softmax_block_bf16: ld16 ", ld16, " < ld ", ld);
#ifdef ATTNLAB_HAVE_AVX512_EXP
  online_softmax_block16_bf16(s, rows, cols, ld, mask, mask_ld, visible_base, row_max, row_sum,
                              correction, probs16, ld16);
#endif
}

#ifdef ATTNLAB_HAVE_AVX512_EXP
void stream_scaled_rows(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows,
                        int64_t cols, int64_t width, const float* factor) {
  stream_scaled_rows16(src, lds, dst, ldd, rows, cols, width, factor);
}
#else
void stream_scaled_rows(const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t,
                        const float*) {}
#endif

#define ATTNLAB_FOR_FLOAT_TYPES(X) X(float) X(double)

#define ATTNLAB_DEFINE_ROW_OPS(T)                                                              \
  ATTNLAB_ISA_CLONES void online_softmax_block(T* s, int64_t rows, int64_t cols, int64_t ld,   \
                                               const T* mask, int64_t mask_ld,                 \
                                               int64_t visible_base, T* row_max, T* row_sum,   \
                                               T* correction, const T* known_max,           \
                                               T* row_dot) {                                   \
    if (rows_on_avx512()) {                                                                    \
      online_softmax_block16(s, rows, cols, ld, mask, mask_ld, visible_base, row_max, row_sum, \
                             correction, known_max, row_dot);                                  \
      return;                                                                                  \
    }                                                                                          \
    online_softmax_block_impl(s, rows, cols, ld, mask, mask_ld, visible_base, row_max,         \
                              row_sum, correction, known_max, nullptr, 0, row_dot);           \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void probs_from_lse(T* s, int64_t rows, int64_t cols, int64_t ld,         \
                                         const T* mask, int64_t mask_ld, int64_t visible_base, \
                                         const T* lse) {                                       \
    if (rows_on_avx512()) {                                                                    \
      probs_from_lse16(s, rows, cols, ld, mask, mask_ld, visible_base, lse);                   \
      return;                                                                                  \
    }                                                                                          \
    probs_from_lse_impl(s, rows, cols, ld, mask, mask_ld, visible_base, lse);                  \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void softmax_grad_block(const T* p, int64_t ldp, T* dp, int64_t lddp,   \
                                             int64_t rows, int64_t cols, const T* delta) {     \
    softmax_grad_block_impl(p, ldp, dp, lddp, rows, cols, delta);                              \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void row_normalizers(int64_t rows, const T* row_max, const T* row_sum,     \
                                          T* inv_sum, T* lse) {                                \
    row_normalizers_impl(rows, row_max, row_sum, inv_sum, lse);                                \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void scale_rows(T* x, int64_t rows, int64_t cols, int64_t ld,             \
                                     const T* factor) {                                        \
    scale_rows_impl(x, rows, cols, ld, factor);                                                \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void row_dots(const T* a, int64_t lda, const T* b, int64_t ldb,           \
                                   int64_t rows, int64_t cols, T* out) {                       \
    row_dots_impl(a, lda, b, ldb, rows, cols, out);                                            \
  }

ATTNLAB_FOR_FLOAT_TYPES(ATTNLAB_DEFINE_ROW_OPS)

}  // namespace attnlab::cpu

#include "cpu/attention/small_sparse_attention.h"

// The helpers (vec_lanes.h) pass 64-byte vectors by value; they are all inlined into the
// per-ISA clones, so the note that such an ABI differs between instruction sets does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/attention/entmax_threshold.h"
#include "cpu/isa/isa.h"
#include "cpu/isa/vec_lanes.h"

namespace attnlab::cpu {
namespace {

template <typename T>
constexpr T kInf = std::numeric_limits<T>::infinity();
template <typename T>
constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();

// Rows go four at a time, as in small_attention.cpp: four independent multiply-add chains,
// and each key and value vector loaded serves four rows.
constexpr int64_t kGroup = 4;

// scale·s + mask on the row's visible keys, −inf elsewhere (a −inf mask entry hides the key
// whatever its score).
template <typename T>
ATTNLAB_INLINE Vec<T> row_scores(Vec<T> s, T scale, const T* mask_row, int64_t len_k,
                                 int64_t visible, const Vec<T>& lane) {
  s *= scale;
  if (mask_row) {
    const Vec<T> m = load_part(mask_row, len_k);
    s = m == -kInf<T> ? -kInf<T> : s + m;
  }
  return lane < static_cast<T>(visible) ? s : -kInf<T>;
}

using Doubles8 = Vec<double>;

// The float lanes of x as two vectors of eight doubles.
ATTNLAB_INLINE void halves(const Vec<float>& x, Doubles8* lo, Doubles8* hi) {
  typedef float Floats8 __attribute__((vector_size(32)));
  const Floats8 l = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7);
  const Floats8 h = __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  *lo = __builtin_convertvector(l, Doubles8);
  *hi = __builtin_convertvector(h, Doubles8);
}
ATTNLAB_INLINE Doubles8 halves_sum(const Vec<float>& x) {
  Doubles8 lo, hi;
  halves(x, &lo, &hi);
  return lo + hi;
}

// ---- α-entmax (any other α): the threshold by Newton steps and bisection, in double lanes ----

// A row of T lanes as kHalves<T> vectors of eight doubles, and back.
template <typename T>
constexpr int kHalves = sizeof(T) == sizeof(float) ? 2 : 1;
template <typename T>
ATTNLAB_INLINE void to_doubles(const Vec<T>& x, Doubles8* out) {
  if constexpr (sizeof(T) == sizeof(double)) {
    out[0] = x;
  } else {
    halves(x, &out[0], &out[1]);
  }
}
template <typename T>
ATTNLAB_INLINE Vec<T> from_doubles(const Doubles8* x) {
  if constexpr (sizeof(T) == sizeof(double)) {
    return x[0];
  } else {
    typedef float Floats8 __attribute__((vector_size(32)));
    const Floats8 lo = __builtin_convertvector(x[0], Floats8);
    const Floats8 hi = __builtin_convertvector(x[1], Floats8);
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
}

typedef int64_t Int64x8 __attribute__((vector_size(64)));

// ln 2 in two parts: the first has trailing zero bits, so n·kLn2High is exact for |n| < 2^11.
constexpr double kLn2High = 6.93147180369123816490e-01;
constexpr double kLn2Low = 1.90821492927058770002e-10;

// log(x) lane by lane for positive normal x, branch-free (vectorizes): x = m·2^e with m in
// [√½, √2), log m = 2·atanh(f) with f = (m − 1)/(m + 1), |f| <= 0.172, from its odd series up
// to f^23 (truncation below 1e-18 relative).
ATTNLAB_INLINE Doubles8 log_lanes(Doubles8 x) {
  Int64x8 bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const Int64x8 mantissa_bits = (bits & 0x000fffffffffffffLL) | 0x3ff0000000000000LL;
  Doubles8 m;
  std::memcpy(&m, &mantissa_bits, sizeof(m));  // in [1, 2)
  const Int64x8 exponent = ((bits >> 52) & 0x7ff) - 1023;
  Doubles8 e = __builtin_convertvector(exponent, Doubles8);
  e = m > 1.4142135623730951 ? e + 1.0 : e;
  m = m > 1.4142135623730951 ? 0.5 * m : m;
  const Doubles8 f = (m - 1.0) / (m + 1.0), f2 = f * f;
  Doubles8 series = Doubles8{} + 1.0 / 23;
  for (int k = 10; k >= 0; --k) series = series * f2 + 1.0 / (2 * k + 1);
  return e * kLn2High + (e * kLn2Low + 2.0 * f * series);
}

// exp(y) lane by lane, branch-free: y = n·ln2 + g with |g| <= ln2/2, exp(g) from its Taylor
// series to degree 13 (truncation below 1e-17 relative), 2^n from the exponent bits. 0 below
// −708 (no subnormal results), +inf above 709.
ATTNLAB_INLINE Doubles8 exp_lanes(Doubles8 y) {
  const Doubles8 yc = y < -708.0 ? -708.0 : (y > 709.0 ? 709.0 : y);
  // Adding 1.5·2^52 rounds to the nearest integer.
  constexpr double kRound = 6755399441055744.0;
  const Doubles8 n = (yc * 1.4426950408889634 + kRound) - kRound;
  const Doubles8 g = (yc - n * kLn2High) - n * kLn2Low;
  double inverse_factorial[14];
  inverse_factorial[0] = 1;
  for (int k = 1; k < 14; ++k) inverse_factorial[k] = inverse_factorial[k - 1] / k;
  Doubles8 poly = Doubles8{} + inverse_factorial[13];
  for (int k = 12; k >= 0; --k) poly = poly * g + inverse_factorial[k];
  const Int64x8 bits = (__builtin_convertvector(n, Int64x8) + 1023) << 52;
  Doubles8 two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  const Doubles8 result = poly * two_n;
  return y < -708.0 ? 0.0 : (y > 709.0 ? std::numeric_limits<double>::infinity() : result);
}

// x^e on the lanes where x > 0, 0 elsewhere (x below the normal range is taken at its bottom).
ATTNLAB_INLINE Doubles8 pow_positive_lanes(Doubles8 x, double e) {
  const Doubles8 safe = x > 0.0 ? (x < 2.2250738585072014e-308 ? 2.2250738585072014e-308 : x)
                                : 1.0;
  const Doubles8 power = exp_lanes(e * log_lanes(safe));
  return x > 0.0 ? power : 0.0;
}

// The α-entmax threshold of c (H vectors of doubles, −inf on hidden keys), as the blocked
// path's bisect_threshold: f(τ) = Σ_j [c_j − τ]_+^r − 1 on [−1, −(1/m)^{α−1}] (m: the row's
// visible keys), Newton steps kept inside the bracket and bisection otherwise, until the step or
// the bracket is below tol; each step is a few vector operations over the whole row.
template <int H>
ATTNLAB_INLINE double lane_bisect_threshold(const Doubles8* c, int64_t m, double am1, double r,
                                            double tol) {
  double lo, hi;
  if (!entmax_bracket(m, am1, lo, hi)) return lo;
  const auto add = [](Doubles8 a, Doubles8 b) { return a + b; };
  double t = lo;
  for (int step_count = 0; step_count < 200; ++step_count) {
    Doubles8 f_lanes = {}, df_lanes = {};  // Σ d^r and Σ d^{r−1} over d = c − t > 0
    for (int h = 0; h < H; ++h) {
      const Doubles8 d = c[h] - t;
      const Doubles8 pd = pow_positive_lanes(d, r);
      f_lanes += pd;
      df_lanes += d > 0.0 ? pd / d : 0.0;
    }
    const double f = reduce_lanes<double>(f_lanes, add) - 1;
    const double df = reduce_lanes<double>(df_lanes, add);
    bool done = false;
    t = entmax_threshold_step(t, f, df, r, tol, lo, hi, done);
    if (done) break;
  }
  return t;
}

// The threshold of one row of values c = (α − 1)·(z − max z) (−inf on hidden keys, 0 at the
// max), relative to the max: see the header. Returns τ (double), sets *in to the support (1 or
// 0 per lane) and *support_sum to Σ_j s_j there (sparsemax: the support's size; entmax-1.5:
// Σ_j [c_j − τ]_+).
template <typename T, bool kEntmax15>
ATTNLAB_INLINE double lane_threshold(const Vec<T>& c, int64_t len_k, Vec<T>* in,
                                     double* support_sum) {
  constexpr int64_t L = kLanes<T>;
  alignas(64) T values[L];
  std::memcpy(values, &c, sizeof(values));
  // For each lane j: the count, sum (and sum of squares) of the values >= c_j.
  Vec<T> count = {}, sum = {}, sum_sq = {};
  for (int64_t j = 0; j < len_k; ++j) {
    const T y = values[j];
    if (y == -kInf<T>) continue;  // a hidden key: in no candidate support
    // (Each comparison written into its select: a comparison kept as a value of its own is
    // lowered lane by lane.)
    count += y >= c ? T(1) : T(0);
    sum += y >= c ? y : T(0);
    if constexpr (kEntmax15) sum_sq += y >= c ? y * y : T(0);
  }
  const Vec<T> safe_c = c == -kInf<T> ? T(0) : c, safe_count = c == -kInf<T> ? T(1) : count;
  // Positive exactly for the support's lanes.
  Vec<T> test;
  if constexpr (kEntmax15) {
    // y_j above the closed-form threshold mean − sqrt((1 − ss)/k) of its candidate support:
    // k·(mean − y_j)² < 1 − ss (mean ≥ y_j there).
    const Vec<T> mean = sum / safe_count;
    const Vec<T> ss = sum_sq - sum * mean;
    const Vec<T> gap = mean - safe_c;
    test = (T(1) - ss) - safe_count * gap * gap;
  } else {
    test = (T(1) + safe_count * safe_c) - sum;
  }
  test = c == -kInf<T> ? T(-1) : test;
  const Vec<T> member = test > T(0) ? T(1) : T(0);
  *in = member;
  // τ from the support's sums, in double lanes (branch-free: hidden keys hold 0 in safe_c).
  Doubles8 n, s1, s2;
  if constexpr (sizeof(T) == sizeof(double)) {
    n = member;
    s1 = member * safe_c;
    s2 = s1 * safe_c;
  } else {
    n = halves_sum(member);
    Doubles8 lo, hi;
    halves(member * safe_c, &lo, &hi);
    s1 = lo + hi;
    s2 = lo * lo + hi * hi;
  }
  const auto add = [](Doubles8 a, Doubles8 b) { return a + b; };
  const double size = reduce_lanes<double>(n, add), sum1 = reduce_lanes<double>(s1, add);
  double tau;
  if constexpr (kEntmax15) {
    const double sum2 = reduce_lanes<double>(s2, add);
    const double mean = sum1 / size, ss = std::max(0.0, sum2 - sum1 * mean);
    tau = mean - std::sqrt(std::max(0.0, 1 - ss) / size);
    *support_sum = sum1 - size * tau;  // Σ_j [c_j − τ]_+
  } else {
    tau = (sum1 - 1) / size;
    *support_sum = size;
  }
  return tau;
}

// kEntmax15: α = 1.5; kBisect: any other α but 2 (alpha), by lane_bisect_threshold.
template <typename T, bool kEntmax15, bool kBisect = false>
ATTNLAB_INLINE void small_sparse_rows_impl(double alpha, int64_t rows, int64_t len_k, int64_t dim_qk,
                                           int64_t dim_v, const T* q, int64_t ldq, const T* k,
                                           int64_t ldk, const T* v, int64_t ldv, const T* mask,
                                           int64_t mask_ld, int64_t visible_base, T scale,
                                           T* out, T* tau, T* support_value, T* weights,
                                           int64_t ld_weights) {
  constexpr int64_t L = kLanes<T>;
  const double am1 = kBisect ? alpha - 1 : (kEntmax15 ? 0.5 : 1.0);  // α − 1
  alignas(64) Vec<T> kt[kSmallAttentionMaxDim];  // Kᵀ: feature e of every key, one per lane
  transpose_rows(k, ldk, len_k, dim_qk, kt);
  // vp[j·value_vectors + c]: value row j in whole vectors, zero-padded.
  const int64_t value_vectors = (dim_v + L - 1) / L;
  alignas(64) Vec<T> vp[kSmallAttentionMaxDim];  // len_k·value_vectors <= L·(256 / L)
  for (int64_t j = 0; j < len_k; ++j) row_vectors(v + j * ldv, dim_v, vp + j * value_vectors);
  const Vec<T> lane = lane_index<T>();
  const auto max_op = [](Vec<T> a, Vec<T> b) { return a > b ? a : b; };

  for (int64_t r0 = 0; r0 < rows; r0 += kGroup) {
    const int64_t group = std::min(kGroup, rows - r0);
    const T* qr[kGroup];
    for (int64_t i = 0; i < kGroup; ++i) qr[i] = q + std::min(r0 + i, rows - 1) * ldq;
    Vec<T> s[kGroup];
    group_row_products<T, kGroup>(qr, kt, dim_qk, s);
    // P and S/ΣS of each row (zero for the group's unused rows and rows without values).
    alignas(64) T p[kGroup][L] = {};
    alignas(64) T sn[kGroup][L] = {};
    bool row_live[kGroup] = {};
    for (int64_t i = 0; i < group; ++i) {
      const int64_t r = r0 + i;
      const int64_t visible = std::clamp<int64_t>(visible_base + r, 0, len_k);
      const Vec<T> z =
          row_scores(s[i], scale, mask ? mask + r * mask_ld : nullptr, len_k, visible, lane);
      // A NaN counts as +inf here: either makes the row NaN (a +inf score has no finite
      // threshold).
      const T row_max = reduce_lanes<T>(z == z ? z : kInf<T>, max_op);
      T* w = weights ? weights + r * ld_weights : nullptr;
      if (row_max == kInf<T> || row_max == -kInf<T>) {
        // NaN out, or nothing visible: zeros and τ = +inf.
        const bool nan = row_max == kInf<T>;
        const T fill = nan ? kNaN<T> : T(0);
        std::fill(out + r * dim_v, out + (r + 1) * dim_v, fill);
        std::fill(support_value + r * dim_v, support_value + (r + 1) * dim_v, fill);
        tau[r] = nan ? kNaN<T> : kInf<T>;
        if (w) {
          std::fill(w, w + len_k, T(0));
          if (nan) std::fill(w, w + visible, kNaN<T>);
        }
        continue;
      }
      row_live[i] = true;
      const Vec<T> c = static_cast<T>(am1) * (z - row_max);
      double tau_rel;
      Vec<T> pi, si;
      if constexpr (kBisect) {
        // p = d^r/Σ d^r and s = d^{r−1}/Σ d^{r−1} for d = c − τ > 0, in double.
        constexpr int H = kHalves<T>;
        const double r = 1 / am1;
        Doubles8 cd[H], pd[H], sd[H];
        to_doubles<T>(c, cd);
        tau_rel = lane_bisect_threshold<H>(cd, visible, am1, r, sizeof(T) == 4 ? 1e-10 : 1e-15);
        Doubles8 sum_p = {}, sum_s = {};
        for (int h = 0; h < H; ++h) {
          const Doubles8 d = cd[h] - tau_rel;
          pd[h] = pow_positive_lanes(d, r);
          sd[h] = d > 0.0 ? pd[h] / d : 0.0;
          sum_p += pd[h];
          sum_s += sd[h];
        }
        const auto add = [](Doubles8 a, Doubles8 b) { return a + b; };
        pi = from_doubles<T>(pd) * static_cast<T>(1 / reduce_lanes<double>(sum_p, add));
        si = from_doubles<T>(sd) * static_cast<T>(1 / reduce_lanes<double>(sum_s, add));
      } else {
        Vec<T> in;
        double support_sum;
        tau_rel = lane_threshold<T, kEntmax15>(c, len_k, &in, &support_sum);
        const Vec<T> d = c - static_cast<T>(tau_rel);
        const Vec<T> dp = in * (d > T(0) ? d : T(0));  // in: 1 on the support, else 0
        if constexpr (kEntmax15) {
          pi = dp * dp;
          si = dp;
        } else {
          pi = dp;
          si = dp > T(0) ? T(1) : T(0);
        }
        si *= static_cast<T>(1 / support_sum);
      }
      std::memcpy(p[i], &pi, sizeof(pi));
      std::memcpy(sn[i], &si, sizeof(si));
      if (w) store_part(w, pi, len_k);
      tau[r] = static_cast<T>(tau_rel + am1 * static_cast<double>(row_max));
    }
    // out = P·V and U = S·V/ΣS, four rows at a time.
    for (int64_t c = 0; c < value_vectors; ++c) {
      Vec<T> acc_out[kGroup] = {}, acc_u[kGroup] = {};
      for (int64_t j = 0; j < len_k; ++j) {
        const Vec<T> value = vp[j * value_vectors + c];
        for (int64_t i = 0; i < kGroup; ++i) {
          acc_out[i] += p[i][j] * value;
          acc_u[i] += sn[i][j] * value;
        }
      }
      const int64_t n = std::min(L, dim_v - c * L);
      for (int64_t i = 0; i < group; ++i) {
        if (!row_live[i]) continue;
        store_part(out + (r0 + i) * dim_v + c * L, acc_out[i], n);
        store_part(support_value + (r0 + i) * dim_v + c * L, acc_u[i], n);
      }
    }
  }
}

template <typename T, bool kEntmax15, bool kBisect = false>
ATTNLAB_INLINE void small_sparse_backward_impl(
    double alpha, int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const T* q, int64_t ldq,
    const T* k, int64_t ldk, const T* v, int64_t ldv, const T* mask, int64_t mask_ld,
    int64_t visible_base, T scale, const T* dout, int64_t ld_dout, const T* tau, const T* delta,
    const T* probs, T* dq, T* dk, T* dv, T* dmask) {
  constexpr int64_t L = kLanes<T>;
  constexpr int H = kHalves<T>;
  const T am1 = kBisect ? static_cast<T>(alpha - 1) : (kEntmax15 ? T(0.5) : T(1));  // α − 1
  const int64_t qk_vectors = (dim_qk + L - 1) / L;
  alignas(64) Vec<T> kt[kSmallAttentionMaxDim];  // Kᵀ, to recompute the scores
  alignas(64) Vec<T> vt[kSmallAttentionMaxDim];  // Vᵀ: dP_i = Σ_c dO[i, c]·vt[c]
  alignas(64) Vec<T> kp[kSmallAttentionMaxDim];  // K's rows as vectors: dQ_i = Σ_j dZ_ij·K_j
  // dZ and P of every row, for dK and dV after the row loop.
  alignas(64) T dz_all[kSmallBackwardMaxRows][L];
  alignas(64) T p_all[kSmallBackwardMaxRows][L];
  if (!probs) transpose_rows(k, ldk, len_k, dim_qk, kt);
  transpose_rows(v, ldv, len_k, dim_v, vt);
  for (int64_t j = 0; j < len_k; ++j) row_vectors(k + j * ldk, dim_qk, kp + j * qk_vectors);
  const Vec<T> lane = lane_index<T>();
  const Vec<T> row_nan = lane < static_cast<T>(len_k) ? kNaN<T> : T(0);

  for (int64_t r0 = 0; r0 < len_q; r0 += kGroup) {
    const int64_t group = std::min(kGroup, len_q - r0);
    const T* qr[kGroup];
    const T* dor[kGroup];
    for (int64_t i = 0; i < kGroup; ++i) {
      const int64_t r = std::min(r0 + i, len_q - 1);
      qr[i] = q + r * ldq;
      dor[i] = dout + r * ld_dout;
    }
    // P, and s = p^{2−α} (unnormalised: dz = s·(dP − delta) with delta = dO·U).
    Vec<T> prob[kGroup], sup[kGroup];
    if (probs) {
      for (int64_t i = 0; i < kGroup; ++i) {
        prob[i] = load_part(probs + std::min(r0 + i, len_q - 1) * len_k, len_k);
        if constexpr (kBisect) {
          // s = p^{2−α} in double where p > 0 (0 stays 0, NaN stays NaN).
          Doubles8 pd[H];
          to_doubles<T>(prob[i], pd);
          for (int h = 0; h < H; ++h) {
            pd[h] = pd[h] > 0.0 ? pow_positive_lanes(pd[h], 2 - alpha) : pd[h];
          }
          sup[i] = from_doubles<T>(pd);
        } else if constexpr (kEntmax15) {
          alignas(64) T root[L];
          std::memcpy(root, &prob[i], sizeof(root));
          for (int64_t j = 0; j < L; ++j) root[j] = std::sqrt(root[j]);
          std::memcpy(&sup[i], root, sizeof(root));
        } else {
          sup[i] = prob[i] > T(0) ? T(1) : prob[i];  // 0 stays 0, NaN stays NaN
        }
      }
    } else {
      Vec<T> s[kGroup];
      group_row_products<T, kGroup>(qr, kt, dim_qk, s);
      for (int64_t i = 0; i < kGroup; ++i) {
        const int64_t r = std::min(r0 + i, len_q - 1);
        const T t = tau[r];
        if (t != t) {  // the forward's row was NaN
          prob[i] = sup[i] = row_nan;
          continue;
        }
        const int64_t visible = std::clamp<int64_t>(visible_base + r, 0, len_k);
        const Vec<T> z =
            row_scores(s[i], scale, mask ? mask + r * mask_ld : nullptr, len_k, visible, lane);
        const Vec<T> d = am1 * z - t;
        const Vec<T> dp = d > T(0) ? d : T(0);
        if constexpr (kBisect) {
          // p = d^r and s = d^{r−1} in double, as the blocked backward (no renormalising).
          Doubles8 dd[H], pd[H], sd[H];
          to_doubles<T>(d, dd);
          for (int h = 0; h < H; ++h) {
            pd[h] = pow_positive_lanes(dd[h], 1 / (alpha - 1));
            sd[h] = dd[h] > 0.0 ? pd[h] / dd[h] : 0.0;
          }
          prob[i] = from_doubles<T>(pd);
          sup[i] = from_doubles<T>(sd);
        } else if constexpr (kEntmax15) {
          prob[i] = dp * dp;
          sup[i] = dp;
        } else {
          prob[i] = dp;
          sup[i] = d > T(0) ? T(1) : T(0);
        }
      }
    }
    // dP_i = dO_i·Vᵀ over the keys, then dZ_i = s_i ⊙ (dP_i − delta_i).
    Vec<T> dp[kGroup];
    group_row_products<T, kGroup>(dor, vt, dim_v, dp);
    alignas(64) T dz[kGroup][L];
    for (int64_t i = 0; i < kGroup; ++i) {
      const int64_t r = std::min(r0 + i, len_q - 1);
      const Vec<T> dzi = sup[i] * (dp[i] - delta[r]);
      std::memcpy(dz[i], &dzi, sizeof(dzi));
      if (i < group) {
        std::memcpy(dz_all[r], &dzi, sizeof(dzi));
        std::memcpy(p_all[r], &prob[i], sizeof(prob[i]));
        if (dmask) store_part(dmask + r * len_k, dzi, len_k);
      }
    }
    // dQ_i = scale·Σ_j dZ_ij·K_j
    group_query_grads<T, kGroup>(dz, kp, len_k, dim_qk, scale, group, dq + r0 * dim_qk);
  }
  // dK_j = scale·Σ_i dZ_ij·Q_i and dV_j = Σ_i P_ij·dO_i.
  small_key_sums<T>(dz_all[0], len_q, len_k, q, ldq, dim_qk, scale, dk, dim_qk);
  small_key_sums<T>(p_all[0], len_q, len_k, dout, ld_dout, dim_v, T(1), dv, dim_v);
}

template <typename T>
ATTNLAB_INLINE void small_sparse_rows_dispatch(double alpha, int64_t rows, int64_t len_k,
                                               int64_t dim_qk, int64_t dim_v, const T* q,
                                               int64_t ldq, const T* k, int64_t ldk, const T* v,
                                               int64_t ldv, const T* mask, int64_t mask_ld,
                                               int64_t visible_base, T scale, T* out, T* tau,
                                               T* support_value, T* weights,
                                               int64_t ld_weights) {
  // (Called directly, not through a pointer: the always-inline kernels must be inlined into
  // each per-ISA clone, or they would be compiled once for the baseline instruction set.)
#define ATTNLAB_SMALL_SPARSE_ROWS(...)                                                         \
  small_sparse_rows_impl<__VA_ARGS__>(alpha, rows, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, \
                                      mask, mask_ld, visible_base, scale, out, tau,           \
                                      support_value, weights, ld_weights)
  if (alpha == 2.0) {
    ATTNLAB_SMALL_SPARSE_ROWS(T, false);
  } else if (alpha == 1.5) {
    ATTNLAB_SMALL_SPARSE_ROWS(T, true);
  } else {
    ATTNLAB_SMALL_SPARSE_ROWS(T, false, true);
  }
#undef ATTNLAB_SMALL_SPARSE_ROWS
}

template <typename T>
ATTNLAB_INLINE void small_sparse_backward_dispatch(
    double alpha, int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const T* q,
    int64_t ldq, const T* k, int64_t ldk, const T* v, int64_t ldv, const T* mask,
    int64_t mask_ld, int64_t visible_base, T scale, const T* dout, int64_t ld_dout,
    const T* tau, const T* delta, const T* probs, T* dq, T* dk, T* dv, T* dmask) {
#define ATTNLAB_SMALL_SPARSE_BACKWARD(...)                                                      \
  small_sparse_backward_impl<__VA_ARGS__>(alpha, len_q, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, \
                                          ldv, mask, mask_ld, visible_base, scale, dout,        \
                                          ld_dout, tau, delta, probs, dq, dk, dv, dmask)
  if (alpha == 2.0) {
    ATTNLAB_SMALL_SPARSE_BACKWARD(T, false);
  } else if (alpha == 1.5) {
    ATTNLAB_SMALL_SPARSE_BACKWARD(T, true);
  } else {
    ATTNLAB_SMALL_SPARSE_BACKWARD(T, false, true);
  }
#undef ATTNLAB_SMALL_SPARSE_BACKWARD
}

}  // namespace

#define ATTNLAB_DEFINE_SMALL_SPARSE(TYPE)                                                      \
  ATTNLAB_ISA_CLONES void small_sparse_rows(                                                   \
      double alpha, int64_t rows, int64_t len_k, int64_t dim_qk, int64_t dim_v, const TYPE* q, \
      int64_t ldq, const TYPE* k, int64_t ldk, const TYPE* v, int64_t ldv, const TYPE* mask,   \
      int64_t mask_ld, int64_t visible_base, TYPE scale, TYPE* out, TYPE* tau,                 \
      TYPE* support_value, TYPE* weights, int64_t ld_weights) {                                \
    small_sparse_rows_dispatch(alpha, rows, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask, \
                               mask_ld, visible_base, scale, out, tau, support_value, weights, \
                               ld_weights);                                                    \
  }                                                                                            \
  ATTNLAB_ISA_CLONES void small_sparse_backward(                                               \
      double alpha, int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v,               \
      const TYPE* q, int64_t ldq, const TYPE* k, int64_t ldk, const TYPE* v, int64_t ldv,      \
      const TYPE* mask, int64_t mask_ld, int64_t visible_base, TYPE scale, const TYPE* dout,   \
      int64_t ld_dout, const TYPE* tau, const TYPE* delta, const TYPE* probs, TYPE* dq,        \
      TYPE* dk, TYPE* dv, TYPE* dmask) {                                                       \
    small_sparse_backward_dispatch(alpha, len_q, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, \
                                   mask, mask_ld, visible_base, scale, dout, ld_dout, tau,     \
                                   delta, probs, dq, dk, dv, dmask);                           \
  }

ATTNLAB_DEFINE_SMALL_SPARSE(float)
ATTNLAB_DEFINE_SMALL_SPARSE(double)

#undef ATTNLAB_DEFINE_SMALL_SPARSE

}  // namespace attnlab::cpu

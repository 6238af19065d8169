#include "cpu/sparse_attention_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>

#include "cpu/blas.h"
#include "cpu/entmax_threshold.h"
#include "cpu/isa.h"
#include "cpu/small_sparse_attention.h"
#include "cpu/softmax_rows.h"
#include "cpu/task_ranges.h"

namespace attnlab::cpu {

// ---- the normalizer --------------------------------------------------------------------------

enum class SparseKind { kSparsemax, kEntmax15, kBisect };

struct SparseNormalizer {
  SparseKind kind;
  double alpha;
  double am1;  // α − 1: scores enter as (α − 1)·z
  double r;    // 1/(α − 1): p = d^r with d = (α − 1)·z − τ > 0; s = p^{2−α} = d^{r−1}
};

namespace {

SparseNormalizer normalizer_of(double alpha) {
  const SparseKind kind = alpha == 2.0   ? SparseKind::kSparsemax
                          : alpha == 1.5 ? SparseKind::kEntmax15
                                         : SparseKind::kBisect;
  return {kind, alpha, alpha - 1.0, 1.0 / (alpha - 1.0)};
}

template <typename T>
constexpr T kInf = std::numeric_limits<T>::infinity();
template <typename T>
constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();

ATTNLAB_INLINE int64_t visible_cols(int64_t visible_base, int64_t r, int64_t cols) {
  return std::clamp<int64_t>(visible_base + r, 0, cols);
}

// A −inf mask entry hides the key whatever its score (a NaN or inf score there stays out).
template <typename T>
ATTNLAB_INLINE void add_mask(T* x, const T* mask, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) x[c] = mask[c] == -kInf<T> ? -kInf<T> : x[c] + mask[c];
}

template <typename T>
ATTNLAB_INLINE void fill(T* x, int64_t from, int64_t to, T value) {
  for (int64_t c = from; c < to; ++c) x[c] = value;
}

// ---- thresholds --------------------------------------------------------------------------
// The candidates c (values y = (α − 1)·(z − max z) > −1, so in (−1, 0]) hold the support: the
// largest p is at most 1, so τ ≥ max y − 1 = −1, and keys at y ≤ −1 get p = 0. Thresholds are
// relative to the row's max, where sums are well conditioned.

constexpr int kNewtonSteps = 64;

// Sparsemax and entmax-1.5 from the candidates sorted in decreasing order: the support is the
// longest prefix whose own threshold lies below its last element.
template <typename T, SparseKind K>
double sorted_threshold(T* c, int64_t m) {
  std::sort(c, c + m, std::greater<T>());
  double sum = 0, sum_sq = 0, tau = -1;
  for (int64_t k = 1; k <= m; ++k) {
    const double y = c[k - 1];
    sum += y;
    sum_sq += y * y;
    double t;
    if constexpr (K == SparseKind::kSparsemax) {
      t = (sum - 1) / static_cast<double>(k);
    } else {
      const double mean = sum / static_cast<double>(k);
      const double ss = std::max(0.0, sum_sq - sum * mean);
      if (ss > 1) break;
      t = mean - std::sqrt((1 - ss) / static_cast<double>(k));
    }
    if (!(y > t)) break;
    tau = t;
  }
  return tau;
}

// Eight values in double lanes (GCC vector extension), loaded from T (floats are widened).
using Lanes8 = Vec<double>;
typedef float Floats8 __attribute__((vector_size(32)));

// (By reference: 64-byte vectors by value would depend on the instruction set's ABI.)
template <typename T>
ATTNLAB_INLINE void load8(const T* x, Lanes8& v) {
  if constexpr (sizeof(T) == sizeof(double)) {
    std::memcpy(&v, x, sizeof(v));
  } else {
    Floats8 f;
    std::memcpy(&f, x, sizeof(f));
    v = __builtin_convertvector(f, Lanes8);
  }
}

ATTNLAB_INLINE double lanes_sum(const Lanes8& v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}
ATTNLAB_INLINE double lanes_min(const Lanes8& v) {
  const auto lo = [](double a, double b) { return b < a ? b : a; };
  return lo(lo(lo(v[0], v[4]), lo(v[2], v[6])), lo(lo(v[1], v[5]), lo(v[3], v[7])));
}
ATTNLAB_INLINE double lanes_max(const Lanes8& v) {
  const auto hi = [](double a, double b) { return b > a ? b : a; };
  return hi(hi(hi(v[0], v[4]), hi(v[2], v[6])), hi(hi(v[1], v[5]), hi(v[3], v[7])));
}

// f(τ) = Σ_j [c_j − τ]_+^r − 1 is convex and decreasing for r = 1 (sparsemax) and r = 2
// (entmax-1.5): Newton steps from τ = −1 (where f ≥ 0) stay below the root and reach it from
// the left. Each step first tries the closed-form threshold on the current support
// {c > τ}; it is the answer once it lies between the largest excluded and the smallest
// included value (the KKT conditions). For sparsemax the Newton step is that solve itself
// (Michelot's algorithm). Sums in double lanes; c holds m values padded with −inf to a
// multiple of 8. w: scratch for m values. *support_sum receives Σ_j s_j at the threshold
// (sparsemax: the support's size; entmax-1.5: Σ_j [c_j − τ]_+).
template <typename T, SparseKind K>
ATTNLAB_INLINE double exact_threshold(const T* c, int64_t m, T* w, double* support_sum) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const int64_t chunks = (m + 7) / 8;
  double t = -1;
  for (int step_count = 0; step_count < kNewtonSteps; ++step_count) {
    // Eight lanes of each sum, whole chunks only (c is padded), reduced once at the end.
    const Lanes8 zero = {}, one = zero + 1.0, tv = zero + t, lane_inf = zero + inf;
    Lanes8 vn = zero, vs1 = zero, vs2 = zero, vmin = lane_inf, vout = -lane_inf;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      Lanes8 d;
      load8(c + 8 * ch, d);
      d -= tv;
      const auto in = d > zero;
      const Lanes8 kept = in ? d : zero;
      vn += in ? one : zero;
      vs1 += kept;
      vs2 += kept * kept;
      const Lanes8 inside = in ? d : lane_inf, outside = in ? -lane_inf : d;
      vmin = inside < vmin ? inside : vmin;
      vout = outside > vout ? outside : vout;
    }
    const double n = lanes_sum(vn), s1 = lanes_sum(vs1), s2 = lanes_sum(vs2);
    const double d_min = lanes_min(vmin), d_out = lanes_max(vout);
    double step;
    if constexpr (K == SparseKind::kSparsemax) {
      step = (s1 - 1) / n;
      if (d_out <= step && step < d_min) {
        *support_sum = n;
        return t + step;
      }
    } else {
      const double mean = s1 / n, ss = std::max(0.0, s2 - s1 * mean);
      if (ss <= 1) {
        const double solved = mean - std::sqrt((1 - ss) / n);
        if (d_out <= solved && solved < d_min) {
          *support_sum = s1 - n * solved;
          return t + solved;
        }
      }
      step = (s2 - 1) / (2 * s1);
    }
    if (!(step > 0)) break;  // rounding stalled the steps (ties at the threshold): sort
    t += step;
  }
  std::copy(c, c + m, w);
  const double tau = sorted_threshold<T, K>(w, m);
  double sum = 0;
  for (int64_t j = 0; j < m; ++j) {
    const double d = static_cast<double>(c[j]) - tau;
    if (d > 0) sum += K == SparseKind::kSparsemax ? 1.0 : d;
  }
  *support_sum = sum;
  return tau;
}

// α-entmax: f(τ) = Σ_j [c_j − τ]_+^r − 1 on the bracket [−1, −(1/m)^{α−1}] (the largest p is
// at least 1/m), by Newton steps kept inside the bracket and bisection otherwise, in double,
// until the step or the bracket is below tol.
template <typename T>
ATTNLAB_INLINE double bisect_threshold(const T* c, int64_t m, const SparseNormalizer& nz,
                                       double tol) {
  double lo, hi;
  if (!entmax_bracket(m, nz.am1, lo, hi)) return lo;
  double t = lo;
  for (int step_count = 0; step_count < 200; ++step_count) {
    double f = -1, df = 0;  // f(t) and −f'(t)/r
    for (int64_t j = 0; j < m; ++j) {
      const double d = static_cast<double>(c[j]) - t;
      if (d > 0) {
        const double pd = std::pow(d, nz.r);
        f += pd;
        df += pd / d;
      }
    }
    bool done = false;
    t = entmax_threshold_step(t, f, df, nz.r, tol, lo, hi, done);
    if (done) break;
  }
  return t;
}

// ---- rows of the forward ---------------------------------------------------------------------

}  // namespace

// Each row's support as a list: the keys with p > 0, their p and s/Σs. Row r's entries start
// at start[r]; state[r] is kRowValues, kRowEmpty (no visible key: zeros) or kRowNaN.
template <typename T>
struct SupportLists {
  int32_t* index;
  T* p;
  T* s;
  int64_t* start;
  int64_t* count;
  int8_t* state;
};
constexpr int8_t kRowValues = 0, kRowEmpty = 1, kRowNaN = 2;

// Scratch of one row: candidate values and keys, and the threshold's working set.
template <typename T>
struct RowScratch {
  T* value;
  int32_t* key;
  T* work;
};

namespace {

// One row of scores x[0, visible) (masked in place): its threshold and support list.
template <typename T, SparseKind K>
ATTNLAB_INLINE void forward_row(T* x, int64_t visible, const T* mask, const SparseNormalizer& nz,
                                T* tau, const RowScratch<T>& scratch, const SupportLists<T>& out,
                                int64_t r) {
  out.count[r] = 0;
  if (mask) add_mask(x, mask, visible);
  T x_max = -kInf<T>;
  int bad = 0;
#pragma omp simd reduction(max : x_max) reduction(| : bad)
  for (int64_t j = 0; j < visible; ++j) {
    x_max = x[j] > x_max ? x[j] : x_max;
    bad |= x[j] != x[j];
  }
  if (bad || x_max == kInf<T>) {  // NaN in, NaN out (a +inf score has no finite threshold)
    out.state[r] = kRowNaN;
    *tau = kNaN<T>;
    return;
  }
  if (x_max == -kInf<T>) {  // nothing visible: zeros
    out.state[r] = kRowEmpty;
    *tau = kInf<T>;
    return;
  }
  out.state[r] = kRowValues;
  // Candidates: y = (α − 1)·(x − max) > −1, i.e. x > max − 1/(α − 1) (taken as >=: the cut
  // may round to max itself, which must stay in). Chunks without one are skipped after a
  // vector compare; the rest are compacted branch-free.
  const T am1 = static_cast<T>(nz.am1);
  const T cut = x_max - static_cast<T>(1.0 / nz.am1);
  T* cand = scratch.value;
  int32_t* cand_key = scratch.key;
  int64_t m = 0;
  constexpr int64_t L = kLanes<T>;
  for (int64_t c0 = 0; c0 < visible; c0 += L) {
    const T* xc = x + c0;
    const int64_t n = std::min(L, visible - c0);
    int any = 0;
    if (n == L) {
#pragma omp simd reduction(| : any)
      for (int64_t j = 0; j < L; ++j) any |= xc[j] >= cut;
    } else {
      for (int64_t j = 0; j < n; ++j) any |= xc[j] >= cut;
    }
    if (!any) continue;
    for (int64_t j = 0; j < n; ++j) {
      cand[m] = am1 * (xc[j] - x_max);
      cand_key[m] = static_cast<int32_t>(c0 + j);
      m += xc[j] >= cut;
    }
  }
  for (int64_t j = m; j < (m + 7) / 8 * 8; ++j) cand[j] = -kInf<T>;  // whole chunks of 8
  double tau_rel;
  if constexpr (K == SparseKind::kBisect) {
    tau_rel = bisect_threshold(cand, m, nz, sizeof(T) == 4 ? 1e-10 : 1e-15);
  } else {
    double unused;
    tau_rel = exact_threshold<T, K>(cand, m, scratch.work, &unused);
  }
  // The support: p = d^r and s = d^{r−1} for d = y − τ > 0.
  int32_t* index = out.index + out.start[r];
  T* pv = out.p + out.start[r];
  T* sv = out.s + out.start[r];
  double sum_p = 0, sum_s = 0;
  int64_t k = 0;
  for (int64_t j = 0; j < m; ++j) {
    const double d = static_cast<double>(cand[j]) - tau_rel;
    if (!(d > 0)) continue;
    double p, s;
    if constexpr (K == SparseKind::kSparsemax) {
      p = d;
      s = 1;
    } else if constexpr (K == SparseKind::kEntmax15) {
      p = d * d;
      s = d;
    } else {
      p = std::pow(d, nz.r);
      s = p / d;
    }
    index[k] = cand_key[j];
    pv[k] = static_cast<T>(p);
    sv[k] = static_cast<T>(s);
    sum_p += p;
    sum_s += s;
    ++k;
  }
  const T inv_s = static_cast<T>(1 / sum_s);
  for (int64_t j = 0; j < k; ++j) sv[j] *= inv_s;
  if constexpr (K == SparseKind::kBisect) {  // bisection: renormalise to sum 1
    const T inv_p = static_cast<T>(1 / sum_p);
    for (int64_t j = 0; j < k; ++j) pv[j] *= inv_p;
  }
  out.count[r] = k;
  *tau = static_cast<T>(tau_rel + nz.am1 * static_cast<double>(x_max));
}

// One short row of scores x[0, cols) → probabilities in place and s/Σs into sup, without
// lists: every visible key is a candidate. cand: room for cols + 8 values; work: cols.
template <typename T, SparseKind K>
ATTNLAB_INLINE void forward_row_dense(T* x, T* sup, int64_t visible, int64_t cols,
                                      const T* mask, const SparseNormalizer& nz, T* tau, T* cand,
                                      T* work) {
  if (mask) add_mask(x, mask, visible);
  T x_max = -kInf<T>;
  int bad = 0;
#pragma omp simd reduction(max : x_max) reduction(| : bad)
  for (int64_t j = 0; j < visible; ++j) {
    x_max = x[j] > x_max ? x[j] : x_max;
    bad |= x[j] != x[j];
  }
  if (bad || x_max == kInf<T> || x_max == -kInf<T>) {  // NaN row, or nothing visible
    const bool nan = x_max != -kInf<T> || bad;
    fill(x, 0, cols, nan ? kNaN<T> : T(0));
    fill(sup, 0, cols, nan ? kNaN<T> : T(0));
    *tau = nan ? kNaN<T> : kInf<T>;
    return;
  }
  const T am1 = static_cast<T>(nz.am1);
#pragma omp simd
  for (int64_t j = 0; j < visible; ++j) cand[j] = am1 * (x[j] - x_max);
  for (int64_t j = visible; j < (visible + 7) / 8 * 8; ++j) cand[j] = -kInf<T>;
  double tau_rel;
  if constexpr (K == SparseKind::kBisect) {
    tau_rel = bisect_threshold(cand, visible, nz, sizeof(T) == 4 ? 1e-10 : 1e-15);
    double sum_p = 0, sum_s = 0;
    for (int64_t j = 0; j < visible; ++j) {
      const double d = static_cast<double>(cand[j]) - tau_rel;
      double p = 0, sv = 0;
      if (d > 0) {
        p = std::pow(d, nz.r);
        sv = p / d;
      }
      sum_p += p;
      sum_s += sv;
      x[j] = static_cast<T>(p);
      sup[j] = static_cast<T>(sv);
    }
    const T inv_p = static_cast<T>(1 / sum_p), inv_s = static_cast<T>(1 / sum_s);
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j) {
      x[j] *= inv_p;
      sup[j] *= inv_s;
    }
  } else {
    double sum_s;
    tau_rel = exact_threshold<T, K>(cand, visible, work, &sum_s);
    const T t = static_cast<T>(tau_rel);
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j) {
      const T d = cand[j] - t;
      const T dp = d > T(0) ? d : T(0);
      T p, sv;
      if constexpr (K == SparseKind::kSparsemax) {
        p = dp;
        sv = d > T(0) ? T(1) : T(0);
      } else {
        p = dp * dp;
        sv = dp;
      }
      x[j] = p;
      sup[j] = sv;
    }
    const T inv_s = static_cast<T>(1 / sum_s);
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j) sup[j] *= inv_s;
  }
  fill(x, visible, cols, T(0));
  fill(sup, visible, cols, T(0));
  *tau = static_cast<T>(tau_rel + nz.am1 * static_cast<double>(x_max));
}

template <typename T, SparseKind K>
ATTNLAB_INLINE void forward_rows_dense_impl(T* x, int64_t ldx, T* sup, int64_t lds, int64_t rows,
                                            int64_t cols, const T* mask, int64_t mask_ld,
                                            int64_t visible_base, const SparseNormalizer& nz,
                                            T* tau, const RowScratch<T>& scratch) {
  for (int64_t r = 0; r < rows; ++r) {
    forward_row_dense<T, K>(x + r * ldx, sup + r * lds, visible_cols(visible_base, r, cols), cols,
                            mask ? mask + r * mask_ld : nullptr, nz, tau + r, scratch.value,
                            scratch.work);
  }
}

template <typename T, SparseKind K>
ATTNLAB_INLINE int64_t forward_rows_impl(T* x, int64_t ldx, int64_t rows, int64_t cols,
                                         const T* mask, int64_t mask_ld, int64_t visible_base,
                                         const SparseNormalizer& nz, T* tau,
                                         const RowScratch<T>& scratch,
                                         const SupportLists<T>& out) {
  int64_t total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    out.start[r] = total;
    forward_row<T, K>(x + r * ldx, visible_cols(visible_base, r, cols),
                      mask ? mask + r * mask_ld : nullptr, nz, tau + r, scratch, out, r);
    total += out.count[r];
  }
  return total;
}

// The lists as dense rows [rows, cols] at leading dimension ld: p, or s/Σs when support.
template <typename T>
ATTNLAB_INLINE void dense_rows_impl(const SupportLists<T>& lists, int64_t rows, int64_t cols,
                                    T* dst, int64_t ld, bool support) {
  const T* values = support ? lists.s : lists.p;
  for (int64_t r = 0; r < rows; ++r) {
    T* row = dst + r * ld;
    fill(row, 0, cols, lists.state[r] == kRowNaN ? kNaN<T> : T(0));
    const int64_t begin = lists.start[r], n = lists.count[r];
    for (int64_t e = 0; e < n; ++e) row[lists.index[begin + e]] = values[begin + e];
  }
}

// out_r = Σ_e p_e·v[index_e] and u_r = Σ_e s_e·v[index_e] over each row's list: the products
// P·V and S·V touching only the support.
template <typename T>
ATTNLAB_INLINE void gather_rows_impl(const SupportLists<T>& lists, int64_t rows, const T* v,
                                     int64_t ldv, int64_t dim_v, T* out, T* u) {
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out + r * dim_v;
    T* ur = u + r * dim_v;
    const T fill_value = lists.state[r] == kRowNaN ? kNaN<T> : T(0);
    fill(o, 0, dim_v, fill_value);
    fill(ur, 0, dim_v, fill_value);
    const int64_t begin = lists.start[r], n = lists.count[r];
    for (int64_t e = 0; e < n; ++e) {
      const T* vj = v + static_cast<int64_t>(lists.index[begin + e]) * ldv;
      const T pe = lists.p[begin + e], se = lists.s[begin + e];
#pragma omp simd
      for (int64_t c = 0; c < dim_v; ++c) {
        o[c] += pe * vj[c];
        ur[c] += se * vj[c];
      }
    }
  }
}

// ---- rows of the backward --------------------------------------------------------------------

// Scores x → p in place and s = p^{2−α} into s (unnormalised), from the stored τ. Returns
// the number of non-zero entries (a NaN row counts in full).
template <typename T, SparseKind K>
ATTNLAB_INLINE int64_t backward_rows_impl(T* x, int64_t ldx, T* s, int64_t lds, int64_t rows,
                                          int64_t cols, const T* mask, int64_t mask_ld,
                                          int64_t visible_base, const SparseNormalizer& nz,
                                          const T* tau) {
  const T am1 = static_cast<T>(nz.am1);
  int64_t nonzeros = 0;
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * ldx;
    T* sr = s + r * lds;
    const T t = tau[r];
    const int64_t visible = visible_cols(visible_base, r, cols);
    if (t != t) {  // the forward's row was NaN
      fill(xr, 0, cols, kNaN<T>);
      fill(sr, 0, cols, kNaN<T>);
      nonzeros += cols;
      continue;
    }
    if (mask) add_mask(xr, mask + r * mask_ld, visible);
    int64_t count = 0;
    if constexpr (K == SparseKind::kBisect) {
      for (int64_t j = 0; j < visible; ++j) {
        const double d = static_cast<double>(am1 * xr[j] - t);
        double p = 0, sv = 0;
        if (d > 0) {
          p = std::pow(d, nz.r);
          sv = p / d;
          ++count;
        }
        xr[j] = static_cast<T>(p);
        sr[j] = static_cast<T>(sv);
      }
    } else {
#pragma omp simd reduction(+ : count)
      for (int64_t j = 0; j < visible; ++j) {
        const T d = am1 * xr[j] - t;
        const T dp = d > T(0) ? d : T(0);
        if constexpr (K == SparseKind::kSparsemax) {
          xr[j] = dp;
          sr[j] = d > T(0) ? T(1) : T(0);
        } else {
          xr[j] = dp * dp;
          sr[j] = dp;
        }
        count += d > T(0) ? 1 : 0;
      }
    }
    nonzeros += count;
    fill(xr, visible, cols, T(0));
    fill(sr, visible, cols, T(0));
  }
  return nonzeros;
}

// s = p^{2−α} from the forward's probabilities. Returns the number of non-zero p.
template <typename T, SparseKind K>
ATTNLAB_INLINE int64_t support_from_probs_impl(const T* p, int64_t ldp, T* s, int64_t lds,
                                               int64_t rows, int64_t cols,
                                               const SparseNormalizer& nz) {
  int64_t nonzeros = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = p + r * ldp;
    T* sr = s + r * lds;
    int64_t count = 0;
    if constexpr (K == SparseKind::kBisect) {
      for (int64_t j = 0; j < cols; ++j) {
        const T v = pr[j];
        sr[j] = v > T(0) ? static_cast<T>(std::pow(static_cast<double>(v), 2.0 - nz.alpha)) : v;
        count += v != T(0) ? 1 : 0;
      }
    } else {
#pragma omp simd reduction(+ : count)
      for (int64_t j = 0; j < cols; ++j) {
        const T v = pr[j];
        if constexpr (K == SparseKind::kSparsemax) {
          sr[j] = v > T(0) ? T(1) : v;  // 0 stays 0, NaN stays NaN
        } else {
          sr[j] = std::sqrt(v);
        }
        count += v != T(0) ? 1 : 0;
      }
    }
    nonzeros += count;
  }
  return nonzeros;
}

// The gradients of one block from its non-zero entries only (the dense products' work at
// each (r, c) with p_rc ≠ 0, skipping the zeros):
//   dz = s·(dO_r·v_c − delta_r); dV_c += p·dO_r; dK_c += scale·dz·q_r; dQ_r += scale·dz·k_c;
// grad_mask (when not null) receives dz. dq, dk, dv: rows of E, E, Ev (contiguous).
template <typename T>
ATTNLAB_INLINE void backward_sparse_block_impl(
    const T* probs, int64_t ldp, const T* s, int64_t lds, int64_t rows, int64_t cols,
    const T* dout, int64_t ld_dout, const T* q, int64_t ldq, const T* k, int64_t ldk,
    const T* v, int64_t ldv, const T* delta, T scale, int64_t E, int64_t Ev, T* dq, T* dk,
    T* dv, T* grad_mask, int64_t ld_mask) {
  constexpr int64_t L = kLanes<T>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = probs + r * ldp;
    const T* dor = dout + r * ld_dout;
    const T* qr = q + r * ldq;
    T* dqr = dq + r * E;
    for (int64_t c0 = 0; c0 < cols; c0 += L) {
      const int64_t n = std::min(L, cols - c0);
      int any = 0;
      for (int64_t j = 0; j < n; ++j) any |= pr[c0 + j] != T(0);
      if (!any) continue;
      for (int64_t c = c0; c < c0 + n; ++c) {
        const T p = pr[c];
        if (p == T(0)) continue;
        const T* vc = v + c * ldv;
        const T* kc = k + c * ldk;
        T dp = 0;
#pragma omp simd reduction(+ : dp)
        for (int64_t e = 0; e < Ev; ++e) dp += dor[e] * vc[e];
        const T dz = s[r * lds + c] * (dp - delta[r]);
        if (grad_mask) grad_mask[r * ld_mask + c] = dz;
        T* dvc = dv + c * Ev;
#pragma omp simd
        for (int64_t e = 0; e < Ev; ++e) dvc[e] += p * dor[e];
        const T g = scale * dz;
        T* dkc = dk + c * E;
#pragma omp simd
        for (int64_t e = 0; e < E; ++e) {
          dkc[e] += g * qr[e];
          dqr[e] += g * kc[e];
        }
      }
    }
  }
}

}  // namespace

// The row loops, compiled per instruction set (isa.h), one loop nest per normalizer.
#define ATTNLAB_SPARSE_DISPATCH(fn, ...)                                         \
  switch (nz.kind) {                                                             \
    case SparseKind::kSparsemax: return fn<T, SparseKind::kSparsemax>(__VA_ARGS__); \
    case SparseKind::kEntmax15: return fn<T, SparseKind::kEntmax15>(__VA_ARGS__);   \
    default: return fn<T, SparseKind::kBisect>(__VA_ARGS__);                        \
  }

#define ATTNLAB_DEFINE_SPARSE_ROWS(TYPE)                                                      \
  ATTNLAB_ISA_CLONES int64_t sparse_forward_rows(                                             \
      TYPE* x, int64_t ldx, int64_t rows, int64_t cols, const TYPE* mask, int64_t mask_ld,    \
      int64_t visible_base, const SparseNormalizer& nz, TYPE* tau,                            \
      const RowScratch<TYPE>& scratch, const SupportLists<TYPE>& out) {                       \
    using T = TYPE;                                                                           \
    ATTNLAB_SPARSE_DISPATCH(forward_rows_impl, x, ldx, rows, cols, mask, mask_ld,             \
                            visible_base, nz, tau, scratch, out)                              \
  }                                                                                           \
  ATTNLAB_ISA_CLONES void sparse_forward_rows_dense(                                          \
      TYPE* x, int64_t ldx, TYPE* sup, int64_t lds, int64_t rows, int64_t cols,                \
      const TYPE* mask, int64_t mask_ld, int64_t visible_base, const SparseNormalizer& nz,     \
      TYPE* tau, const RowScratch<TYPE>& scratch) {                                           \
    using T = TYPE;                                                                           \
    ATTNLAB_SPARSE_DISPATCH(forward_rows_dense_impl, x, ldx, sup, lds, rows, cols, mask,      \
                            mask_ld, visible_base, nz, tau, scratch)                          \
  }                                                                                           \
  ATTNLAB_ISA_CLONES void sparse_dense_rows(const SupportLists<TYPE>& lists, int64_t rows,    \
                                            int64_t cols, TYPE* dst, int64_t ld,              \
                                            bool support) {                                   \
    dense_rows_impl(lists, rows, cols, dst, ld, support);                                     \
  }                                                                                           \
  ATTNLAB_ISA_CLONES void sparse_gather_rows(const SupportLists<TYPE>& lists, int64_t rows,   \
                                             const TYPE* v, int64_t ldv, int64_t dim_v,       \
                                             TYPE* out, TYPE* u) {                            \
    gather_rows_impl(lists, rows, v, ldv, dim_v, out, u);                                     \
  }                                                                                           \
  ATTNLAB_ISA_CLONES int64_t sparse_backward_rows(                                            \
      TYPE* x, int64_t ldx, TYPE* s, int64_t lds, int64_t rows, int64_t cols,                  \
      const TYPE* mask, int64_t mask_ld, int64_t visible_base, const SparseNormalizer& nz,     \
      const TYPE* tau) {                                                                       \
    using T = TYPE;                                                                           \
    ATTNLAB_SPARSE_DISPATCH(backward_rows_impl, x, ldx, s, lds, rows, cols, mask, mask_ld,    \
                            visible_base, nz, tau)                                            \
  }                                                                                           \
  ATTNLAB_ISA_CLONES int64_t sparse_support_from_probs(                                       \
      const TYPE* p, int64_t ldp, TYPE* s, int64_t lds, int64_t rows, int64_t cols,            \
      const SparseNormalizer& nz) {                                                            \
    using T = TYPE;                                                                           \
    ATTNLAB_SPARSE_DISPATCH(support_from_probs_impl, p, ldp, s, lds, rows, cols, nz)          \
  }                                                                                           \
  ATTNLAB_ISA_CLONES void sparse_backward_block(                                              \
      const TYPE* probs, int64_t ldp, const TYPE* s, int64_t lds, int64_t rows, int64_t cols,  \
      const TYPE* dout, int64_t ld_dout, const TYPE* q, int64_t ldq, const TYPE* k,            \
      int64_t ldk, const TYPE* v, int64_t ldv, const TYPE* delta, TYPE scale, int64_t E,       \
      int64_t Ev, TYPE* dq, TYPE* dk, TYPE* dv, TYPE* grad_mask, int64_t ld_mask) {            \
    backward_sparse_block_impl(probs, ldp, s, lds, rows, cols, dout, ld_dout, q, ldq, k, ldk,  \
                               v, ldv, delta, scale, E, Ev, dq, dk, dv, grad_mask, ld_mask);   \
  }

ATTNLAB_DEFINE_SPARSE_ROWS(float)
ATTNLAB_DEFINE_SPARSE_ROWS(double)

#undef ATTNLAB_DEFINE_SPARSE_ROWS
#undef ATTNLAB_SPARSE_DISPATCH

// ---- the blocked forward and backward --------------------------------------------------------

namespace {

// The backward's blocks, as in the softmax backward (attention_kernel.cpp).
constexpr int64_t kBackwardQueryBlock = 64;
constexpr int64_t kBackwardKeyBlock = 128;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// The forward holds a whole row of scores per query (the threshold needs all of them), and s
// beside it: query blocks of up to 64 rows, fewer for long rows so that both stay in L2.
int64_t forward_query_block(int64_t len_k) {
  int64_t rows = 64;
  while (rows > 8 && rows * len_k > 32768) rows /= 2;
  return rows;
}

// The support lists replace dense P·V and S·V products unless they hold more than
// 1/kDenseFactor of the block's scores.
constexpr int64_t kDenseFactor = 4;
// Rows of at most this many keys skip the lists: P and S are made dense directly.
constexpr int64_t kShortRow = 64;
// A backward block with fewer than 1/kSparseBackwardFactor non-zeros is done entry by entry.
constexpr int64_t kSparseBackwardFactor = 8;

template <typename T>
int64_t key_end(const AttentionProblem<T>& p, int64_t i0, int64_t rows) {
  return p.causal ? std::min(p.len_k, i0 + rows) : p.len_k;
}

template <typename T>
int64_t visible_base(const AttentionProblem<T>& p, int64_t i0, int64_t j0) {
  return p.causal ? i0 - j0 + 1 : kAllVisible;
}

template <typename T>
const T* mask_block(const AttentionProblem<T>& p, int64_t b, int64_t i0, int64_t j0) {
  return p.mask.data ? p.mask.row(b, i0) + j0 : nullptr;
}

}  // namespace

template <typename T>
void sparse_attention_forward(const AttentionProblem<T>& p, double alpha, T* output, T* tau,
                              T* support_value, T* weights) {
  const SparseNormalizer nz = normalizer_of(alpha);
  const int64_t block_q = std::min(forward_query_block(p.len_k), std::max<int64_t>(p.len_q, 1));
  const int64_t q_blocks = ceil_div(p.len_q, block_q);
  if (small_sparse_fits<T>(alpha, p.len_k, p.dim_qk, p.dim_v)) {
    // Every key in one vector (the tutorials' L = 10 and 16): whole rows in registers.
    parallel_tasks(p.batch * q_blocks, [&](const auto& next_task) {
      for (int64_t task = next_task(); task >= 0; task = next_task()) {
        const int64_t b = task / q_blocks, i0 = (task % q_blocks) * block_q;
        const int64_t rows = std::min(block_q, p.len_q - i0);
        small_sparse_rows(alpha, rows, p.len_k, p.dim_qk, p.dim_v, p.query.row(b, i0),
                          p.query.row_stride, p.key.row(b, 0), p.key.row_stride,
                          p.value.row(b, 0), p.value.row_stride, mask_block(p, b, i0, 0),
                          p.mask.row_stride, visible_base(p, i0, 0), p.scale,
                          output + (b * p.len_q + i0) * p.dim_v, tau + b * p.len_q + i0,
                          support_value + (b * p.len_q + i0) * p.dim_v,
                          weights ? weights + (b * p.len_q + i0) * p.len_k : nullptr, p.len_k);
      }
    });
    return;
  }
  const int64_t ld = round_up(std::max<int64_t>(p.len_k, 1), kLanes<T>);
  parallel_tasks(p.batch * q_blocks, [&](const auto& next_task) {
    SequentialBlasScope sequential_blas;
    // Scores (unless they go straight into the weights), s for the dense path, the support
    // lists (at most every score) and one row's scratch.
    std::vector<T> scores(weights ? 0 : 2 * block_q * ld), dense_s, stacked_out,
        list_p(block_q * ld),
        list_s(block_q * ld), cand(ld + 8), work(ld);
    std::vector<int32_t> list_index(block_q * ld), cand_key(ld);
    std::vector<int64_t> start(block_q), count(block_q);
    std::vector<int8_t> state(block_q);
    const SupportLists<T> lists{list_index.data(), list_p.data(), list_s.data(),
                                start.data(),      count.data(),  state.data()};
    const RowScratch<T> scratch{cand.data(), cand_key.data(), work.data()};
    for (int64_t task = next_task(); task >= 0; task = next_task()) {
      const int64_t b = task / q_blocks, i0 = (task % q_blocks) * block_q;
      const int64_t rows = std::min(block_q, p.len_q - i0);
      const int64_t kv_end = key_end(p, i0, rows);
      T* out = output + (b * p.len_q + i0) * p.dim_v;
      T* u = support_value + (b * p.len_q + i0) * p.dim_v;
      T* t = tau + b * p.len_q + i0;
      T* x = weights ? weights + (b * p.len_q + i0) * p.len_k : scores.data();
      const int64_t ldx = weights ? p.len_k : ld;
      if (kv_end == 0) {  // no key at all: zeros, τ = +inf
        std::fill(out, out + rows * p.dim_v, T(0));
        std::fill(u, u + rows * p.dim_v, T(0));
        std::fill(t, t + rows, kInf<T>);
        if (weights) std::fill(x, x + rows * p.len_k, T(0));
        continue;
      }
      gemm(false, true, rows, kv_end, p.dim_qk, p.scale, p.query.row(b, i0), p.query.row_stride,
           p.key.row(b, 0), p.key.row_stride, T(0), x, ldx);
      if (kv_end <= kShortRow) {  // short rows: dense P and S, no lists
        // Without weights, S goes right below P in the scores buffer: [P; S]·V is one product.
        if (weights) dense_s.resize(block_q * ld);
        T* sup = weights ? dense_s.data() : x + rows * ld;
        sparse_forward_rows_dense(x, ldx, sup, ld, rows, kv_end, mask_block(p, b, i0, 0),
                                  p.mask.row_stride, visible_base(p, i0, 0), nz, t, scratch);
        if (weights) {
          for (int64_t r = 0; r < rows; ++r) std::fill(x + r * ldx + kv_end, x + (r + 1) * ldx, T(0));
          gemm(false, false, rows, p.dim_v, kv_end, T(1), x, ldx, p.value.row(b, 0),
               p.value.row_stride, T(0), out, p.dim_v);
          gemm(false, false, rows, p.dim_v, kv_end, T(1), dense_s.data(), ld, p.value.row(b, 0),
               p.value.row_stride, T(0), u, p.dim_v);
        } else {
          stacked_out.resize(2 * block_q * p.dim_v);
          gemm(false, false, 2 * rows, p.dim_v, kv_end, T(1), x, ld, p.value.row(b, 0),
               p.value.row_stride, T(0), stacked_out.data(), p.dim_v);
          std::copy(stacked_out.data(), stacked_out.data() + rows * p.dim_v, out);
          std::copy(stacked_out.data() + rows * p.dim_v,
                    stacked_out.data() + 2 * rows * p.dim_v, u);
        }
        continue;
      }
      const int64_t nonzeros =
          sparse_forward_rows(x, ldx, rows, kv_end, mask_block(p, b, i0, 0), p.mask.row_stride,
                              visible_base(p, i0, 0), nz, t, scratch, lists);
      // P·V and S·V: over the support lists when they are short, else as dense products.
      const bool dense = nonzeros * kDenseFactor > rows * kv_end;
      if (weights) sparse_dense_rows(lists, rows, p.len_k, x, ldx, false);
      if (dense) {
        dense_s.resize(block_q * ld);
        if (!weights) sparse_dense_rows(lists, rows, kv_end, x, ldx, false);
        sparse_dense_rows(lists, rows, kv_end, dense_s.data(), ld, true);
        gemm(false, false, rows, p.dim_v, kv_end, T(1), x, ldx, p.value.row(b, 0),
             p.value.row_stride, T(0), out, p.dim_v);
        gemm(false, false, rows, p.dim_v, kv_end, T(1), dense_s.data(), ld, p.value.row(b, 0),
             p.value.row_stride, T(0), u, p.dim_v);
      } else {
        sparse_gather_rows(lists, rows, p.value.row(b, 0), p.value.row_stride, p.dim_v, out, u);
      }
    }
  });
}

template <typename T>
void sparse_attention_backward(const AttentionProblem<T>& p, double alpha,
                               const BatchedRows<T>& grad_output, const T* tau,
                               const T* support_value, const T* weights, T* grad_query,
                               T* grad_key, T* grad_value, T* grad_mask) {
  const SparseNormalizer nz = normalizer_of(alpha);
  const int64_t E = p.dim_qk, Ev = p.dim_v;
  // Every key in one vector: one register-resident pass per batch entry, which writes every
  // gradient entry itself.
  const bool small = p.len_q > 0 && p.len_q <= kSmallBackwardMaxRows &&
                     small_sparse_fits<T>(alpha, p.len_k, E, Ev);
  if (!small) {
    std::fill(grad_query, grad_query + p.batch * p.len_q * E, T(0));
    std::fill(grad_key, grad_key + p.batch * p.len_k * E, T(0));
    std::fill(grad_value, grad_value + p.batch * p.len_k * Ev, T(0));
    if (grad_mask) std::fill(grad_mask, grad_mask + p.batch * p.len_q * p.len_k, T(0));
  }
  if (p.batch == 0 || p.len_q == 0 || p.len_k == 0) return;

  // delta_i = dO_i·U_i = Σ_j s_ij·dP_ij / Σ_j s_ij.
  std::vector<T> delta(p.batch * p.len_q);
  at::parallel_for(0, p.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      row_dots(grad_output.row(b, 0), grad_output.row_stride, support_value + b * p.len_q * Ev,
               Ev, p.len_q, Ev, delta.data() + b * p.len_q);
    }
  });

  if (small) {
    parallel_tasks(p.batch, [&](const auto& next_task) {
      for (int64_t b = next_task(); b >= 0; b = next_task()) {
        const int64_t rows = b * p.len_q;
        small_sparse_backward(
            alpha, p.len_q, p.len_k, E, Ev, p.query.row(b, 0), p.query.row_stride,
            p.key.row(b, 0), p.key.row_stride, p.value.row(b, 0), p.value.row_stride,
            mask_block(p, b, 0, 0), p.mask.row_stride, visible_base(p, 0, 0), p.scale,
            grad_output.row(b, 0), grad_output.row_stride, tau + rows, delta.data() + rows,
            weights ? weights + rows * p.len_k : nullptr, grad_query + rows * E,
            grad_key + b * p.len_k * E, grad_value + b * p.len_k * Ev,
            grad_mask ? grad_mask + rows * p.len_k : nullptr);
      }
    });
    return;
  }

  // Work split as in the softmax backward: each task owns the key blocks of one chunk of one
  // batch entry (dK, dV unshared); dQ parts of extra chunks are summed at the end.
  const int64_t k_blocks = ceil_div(p.len_k, kBackwardKeyBlock);
  const int64_t threads = at::get_num_threads();
  const int64_t chunks =
      p.batch >= threads ? 1 : std::max<int64_t>(1, std::min(k_blocks, ceil_div(threads, p.batch)));
  const int64_t dq_size = p.batch * p.len_q * E;
  std::vector<T> dq_parts((chunks - 1) * dq_size, T(0));

  parallel_tasks(p.batch * chunks, [&](const auto& next_task) {
    SequentialBlasScope sequential_blas;
    constexpr int64_t ld = kBackwardKeyBlock;
    std::vector<T> probs(weights ? 0 : kBackwardQueryBlock * ld);
    std::vector<T> support(kBackwardQueryBlock * ld), dprobs(kBackwardQueryBlock * ld);
    for (int64_t task = next_task(); task >= 0; task = next_task()) {
      const int64_t b = task / chunks, chunk = task % chunks;
      T* dq = (chunk == 0 ? grad_query : dq_parts.data() + (chunk - 1) * dq_size) +
              b * p.len_q * E;
      const int64_t first_block = chunk * k_blocks / chunks;
      const int64_t last_block = (chunk + 1) * k_blocks / chunks;
      for (int64_t kb = first_block; kb < last_block; ++kb) {
        const int64_t j0 = kb * kBackwardKeyBlock;
        const int64_t cols = std::min(kBackwardKeyBlock, p.len_k - j0);
        T* dk = grad_key + (b * p.len_k + j0) * E;
        T* dv = grad_value + (b * p.len_k + j0) * Ev;
        const int64_t i_start = p.causal ? (j0 / kBackwardQueryBlock) * kBackwardQueryBlock : 0;
        for (int64_t i0 = i_start; i0 < p.len_q; i0 += kBackwardQueryBlock) {
          const int64_t rows = std::min(kBackwardQueryBlock, p.len_q - i0);
          const T* q = p.query.row(b, i0);
          const T* dout = grad_output.row(b, i0);
          const T* probs_ij = probs.data();
          int64_t ld_probs = ld;
          int64_t nonzeros;
          if (weights) {
            probs_ij = weights + (b * p.len_q + i0) * p.len_k + j0;
            ld_probs = p.len_k;
            nonzeros = sparse_support_from_probs(probs_ij, ld_probs, support.data(), ld, rows,
                                                 cols, nz);
          } else {
            gemm(false, true, rows, cols, E, p.scale, q, p.query.row_stride, p.key.row(b, j0),
                 p.key.row_stride, T(0), probs.data(), ld);
            nonzeros = sparse_backward_rows(probs.data(), ld, support.data(), ld, rows, cols,
                                            mask_block(p, b, i0, j0), p.mask.row_stride,
                                            visible_base(p, i0, j0), nz, tau + b * p.len_q + i0);
          }
          if (nonzeros == 0) continue;  // p = s = 0 on the whole block: it adds nothing
          if (nonzeros * kSparseBackwardFactor < rows * cols) {
            // Few non-zeros: the gradients entry by entry instead of four dense products.
            sparse_backward_block(probs_ij, ld_probs, support.data(), ld, rows, cols, dout,
                                  grad_output.row_stride, q, p.query.row_stride,
                                  p.key.row(b, j0), p.key.row_stride, p.value.row(b, j0),
                                  p.value.row_stride, delta.data() + b * p.len_q + i0, p.scale,
                                  E, Ev, dq + i0 * E, dk, dv,
                                  grad_mask ? grad_mask + (b * p.len_q + i0) * p.len_k + j0
                                            : nullptr,
                                  p.len_k);
            continue;
          }
          // dV_j += Pᵀ·dO_i
          gemm(true, false, cols, Ev, rows, T(1), probs_ij, ld_probs, dout,
               grad_output.row_stride, T(1), dv, Ev);
          // dP = dO_i·V_jᵀ, then dZ = s ⊙ (dP − delta)
          gemm(false, true, rows, cols, Ev, T(1), dout, grad_output.row_stride,
               p.value.row(b, j0), p.value.row_stride, T(0), dprobs.data(), ld);
          softmax_grad_block(support.data(), ld, dprobs.data(), ld, rows, cols,
                             delta.data() + b * p.len_q + i0);
          if (grad_mask) {
            T* gm = grad_mask + (b * p.len_q + i0) * p.len_k + j0;
            for (int64_t r = 0; r < rows; ++r) {
              std::copy(dprobs.data() + r * ld, dprobs.data() + r * ld + cols, gm + r * p.len_k);
            }
          }
          // dK_j += scale·dZᵀ·Q_i ;  dQ_i += scale·dZ·K_j
          gemm(true, false, cols, E, rows, p.scale, dprobs.data(), ld, q, p.query.row_stride,
               T(1), dk, E);
          gemm(false, false, rows, E, cols, p.scale, dprobs.data(), ld, p.key.row(b, j0),
               p.key.row_stride, T(1), dq + i0 * E, E);
        }
      }
    }
  });

  if (chunks > 1) {
    at::parallel_for(0, dq_size, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t c = 1; c < chunks; ++c) {
        const T* part = dq_parts.data() + (c - 1) * dq_size;
        for (int64_t i = begin; i < end; ++i) grad_query[i] += part[i];
      }
    });
  }
}

template void sparse_attention_forward<float>(const AttentionProblem<float>&, double, float*,
                                              float*, float*, float*);
template void sparse_attention_forward<double>(const AttentionProblem<double>&, double,
                                               double*, double*, double*, double*);
template void sparse_attention_backward<float>(const AttentionProblem<float>&, double,
                                               const BatchedRows<float>&, const float*,
                                               const float*, const float*, float*, float*,
                                               float*, float*);
template void sparse_attention_backward<double>(const AttentionProblem<double>&, double,
                                                const BatchedRows<double>&, const double*,
                                                const double*, const double*, double*, double*,
                                                double*, double*);

}  // namespace attnlab::cpu

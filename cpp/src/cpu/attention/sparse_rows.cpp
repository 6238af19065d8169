#include "cpu/attention/sparse_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "cpu/attention/entmax_threshold.h"
#include "cpu/isa/isa.h"
#include "cpu/isa/vec_math.h"

namespace attnlab::cpu {

SparseNormalizer sparse_normalizer(double alpha) {
  const SparseKind kind = alpha == 2.0   ? SparseKind::kSparsemax
                          : alpha == 1.5 ? SparseKind::kEntmax15
                                         : SparseKind::kBisect;
  return {kind, alpha, alpha - 1.0, 1.0 / (alpha - 1.0)};
}

namespace {

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
    T* dv, T* grad_mask, int64_t ld_mask, const T* extra_dp, int64_t ld_extra) {
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
        if (extra_dp) dp += extra_dp[r * ld_extra + c];
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

#define ATTNLAB_SPARSE_BODY(T, fn, ...)                                         \
  {                                                                             \
    switch (nz.kind) {                                                          \
      case SparseKind::kSparsemax: return fn<T, SparseKind::kSparsemax>(__VA_ARGS__); \
      case SparseKind::kEntmax15: return fn<T, SparseKind::kEntmax15>(__VA_ARGS__);   \
      default: return fn<T, SparseKind::kBisect>(__VA_ARGS__);                        \
    }                                                                           \
  }
#define ATTNLAB_PLAIN_BODY(...) \
  { __VA_ARGS__; }
ATTNLAB_SPARSE_ROWS_API(ATTNLAB_ISA_CLONES, float)
ATTNLAB_SPARSE_ROWS_API(ATTNLAB_ISA_CLONES, double)

#undef ATTNLAB_SPARSE_BODY
#undef ATTNLAB_PLAIN_BODY

}  // namespace attnlab::cpu

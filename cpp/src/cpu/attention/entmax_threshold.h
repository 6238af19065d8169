#pragma once
// The α-entmax threshold solve shared by the blocked kernel's sparse rows (sparse_rows.cpp)
// and the register-resident one (small_sparse_attention.cpp): each evaluates
// f(τ) = Σ_j [c_j − τ]_+^r − 1 its own way; the bracket and the step rule live here.

#include <cmath>
#include <cstdint>

#include "cpu/isa/isa.h"

namespace attnlab::cpu {

// The bracket [lo, hi] = [−1, −(1/m)^{α−1}] of τ for m visible keys (the largest p is at least
// 1/m). False when it is empty (m = 1: the one candidate takes everything, τ = lo).
ATTNLAB_INLINE bool entmax_bracket(int64_t m, double am1, double& lo, double& hi) {
  lo = -1;
  hi = -std::pow(1.0 / static_cast<double>(m), am1);
  return hi > lo;
}

// One step from t, where f = f(t) and df = −f'(t)/r: the bracket narrowed by the sign of f, then
// a Newton step kept inside it, else its midpoint. done: f(t) = 0 (t is returned) or the step or
// the bracket is below tol.
ATTNLAB_INLINE double entmax_threshold_step(double t, double f, double df, double r, double tol,
                                            double& lo, double& hi, bool& done) {
  if (f > 0) {
    lo = t;
  } else if (f < 0) {
    hi = t;
  } else {
    done = true;
    return t;
  }
  double next = t + f / (r * df);
  if (!(next > lo && next < hi)) next = 0.5 * (lo + hi);
  done = std::abs(next - t) <= tol || hi - lo <= tol;
  return next;
}

}  // namespace attnlab::cpu

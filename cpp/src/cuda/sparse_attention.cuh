#pragma once
// Sparse attention kernels (sparsemax, entmax-1.5, α-entmax) on CUDA cores, float32 arithmetic
// whatever the storage type. Written for clarity first, in the style of sdpa_generic.cuh: a block
// has 4 warps, each warp owns 4 rows of one side (queries in the forward and the dQ pass, keys in
// the dK/dV pass) and its 32 lanes take 32 rows of the other side, one each; tiles are staged in
// shared memory as float. See sparse_kernels.h for the definitions of τ, p, s and U.
//
//   forward   one block per (batch entry, 16 queries), in waves (sparse_forward):
//             1. x_ij = (α−1)·z_ij for all keys the block can see, into a global-memory
//                workspace of [16][len_k] floats per block; per row the max m and the number of
//                visible keys n;
//             2. per row (by its warp): the threshold, in the frame shifted by the row max
//                (t = τ − m, d_j = (x_j − m) − t): bisection on t in [−1, −(1/n)^(α−1)], then
//                for α ≤ 2 Newton steps from below (exact for sparsemax: Michelot's steps);
//                Σ_j p_j at the result, to renormalise;
//             3. one more pass over the keys: weights p/Σp, output Σ p·V / Σp, and
//                U = Σ s·V / Σ s.
//   backward  delta_i = dO_i·U_i, then two kernels that recompute x and p, s from τ
//             (d = x − τ): one per query block (dQ, and the mask's gradient dz), one per key
//             block (dK, dV). dz = s ⊙ (dO·Vᵀ − delta). No atomics: every gradient element has
//             one owner.
//
// Every kernel computes x_ij with the same explicitly rounded operations (sparse_score), so the
// backward's scores are bit-for-bit those the forward stored.
//
// Instantiate with ATTNLAB_INSTANTIATE_SPARSE(T, kHead) in one translation unit per dtype.

#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda/sdpa_generic.cuh"  // MaskView, key_end
#include "cuda/sparse_kernels.h"

namespace attnlab::cuda::detail {

constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <int kHead>
struct SparseTiles {
  static_assert(kHead % 32 == 0, "head-size families are multiples of the warp size");
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = 4;
  static constexpr int kRows = kWarps * kRowsPerWarp;  // rows owned by one block
  static constexpr int kCols = 32;                     // rows of the other side per tile
  static constexpr int kPerLane = kHead / 32;          // features per lane in accumulators
  // Tiles read down a column by the 32 lanes get one float of padding per row (bank conflicts).
  static constexpr int kPadded = kHead + 1;
  // The forward stages Q [kRows][kHead], K [kCols][kPadded] and V [kCols][kHead]; each
  // backward kernel two [kRows][kHead] and two [kCols][kPadded] tiles. launch() opts in above
  // 48 KiB; sm_80 allows 163 KiB per block.
  static constexpr size_t kForwardSharedBytes =
      sizeof(float) * (kRows * kHead + kCols * kPadded + kCols * kHead);
  static constexpr size_t kBackwardSharedBytes =
      sizeof(float) * 2 * (kRows * kHead + kCols * kPadded);
  static_assert(kForwardSharedBytes <= 163 * 1024 && kBackwardSharedBytes <= 163 * 1024);
  static_assert(kRows == kSparseRowsPerBlock, "the workspace is sized by kSparseRowsPerBlock");
};

// Bisection steps before Newton takes over (α ≤ 2): the bracket is then 2^-20 of its width,
// and Newton needs one or two steps. Alone (α > 2) bisection runs until the bracket's ends are
// adjacent floats, at most kMaxBisection steps.
constexpr int kBisectionBeforeNewton = 20;
constexpr int kMaxBisection = 100;
constexpr int kMaxNewton = 50;

// x_ij = (α−1)·(scale·(q_i·k_j) + mask_ij), or −inf where query i may not see key j (out of
// range, causal, mask false or −inf: a −inf mask hides the key whatever its score). Explicitly
// rounded operations (no contraction into FMAs that the compiler might choose differently in
// another kernel): every kernel gets the same bits for the same pair.
__device__ __forceinline__ float sparse_score(float dot_qk, const SdpaProblem& p,
                                              const MaskView& mask, float alpha_minus_one,
                                              int64_t i, int64_t j) {
  if (i >= p.len_q || j >= p.len_k || (p.causal && j > i)) return kNegInf;
  float z;
  if (mask.base == nullptr) {
    z = __fmul_rn(dot_qk, p.scale);
  } else {
    const float m = mask.at(i, j);
    if (m == kNegInf) return kNegInf;
    z = __fmaf_rn(dot_qk, p.scale, m);
  }
  return __fmul_rn(alpha_minus_one, z);
}

// p = d^(1/(α−1)) and s = d^((2−α)/(α−1)) = p^(2−α) of a key at d = x − τ > 0 above the
// threshold.
__device__ __forceinline__ float entmax_prob(const EntmaxParams& e, float d) {
  switch (e.kind) {
    case EntmaxParams::kSparsemax: return d;
    case EntmaxParams::kEntmax15: return __fmul_rn(d, d);
    default: return powf(d, e.exponent);
  }
}

__device__ __forceinline__ float entmax_slope(const EntmaxParams& e, float d) {
  switch (e.kind) {
    case EntmaxParams::kSparsemax: return 1.f;
    case EntmaxParams::kEntmax15: return d;
    default: return powf(d, e.slope_exponent);
  }
}

// (p, s) of a pair in the backward, from the stored threshold τ: d = x − τ. Hidden pairs
// (x = −inf) give zeros even in a row whose τ is NaN; otherwise a NaN τ or x gives NaN. A row
// that sees no key has τ = +inf, hence d = −inf and zeros.
struct ProbSlope {
  float p, s;
};

__device__ __forceinline__ ProbSlope entmax_from_tau(const EntmaxParams& e, float x, float tau) {
  if (x == kNegInf) return {0.f, 0.f};
  const float d = __fsub_rn(x, tau);
  if (d > 0.f) return {entmax_prob(e, d), entmax_slope(e, d)};
  if (isnan(d)) return {kNaN, kNaN};
  return {0.f, 0.f};
}

// One query row's threshold state after the forward's solve.
struct RowThreshold {
  float max;       // m: the largest visible x (finite for a regular row)
  float shifted;   // t = τ − m
  float inv_norm;  // 1 / Σ_j p_j at t (renormalisation)
  bool empty;      // no visible key: τ = +inf, p = 0
  bool bad;        // a visible x is NaN or +inf: τ, p and the outputs are NaN
};

// (p, s) of a pair in the forward, in the row-max frame: d = (x − m) − t. p is not yet
// renormalised.
__device__ __forceinline__ ProbSlope entmax_in_row(const EntmaxParams& e, float x,
                                                   const RowThreshold& row) {
  if (x == kNegInf || row.empty) return {0.f, 0.f};
  if (row.bad) return {kNaN, kNaN};
  const float d = __fsub_rn(__fsub_rn(x, row.max), row.shifted);
  if (d > 0.f) return {entmax_prob(e, d), entmax_slope(e, d)};
  return {0.f, 0.f};
}

// Σ_j p_j and Σ_j s_j over x[0, len) at the shifted threshold t of a row with max m, summed over
// the warp (xor-butterfly: every lane gets bitwise the same sums, so the callers' branches on
// them are uniform across the warp). Called by all 32 lanes.
struct RowSums {
  float p, s;
};

__device__ inline RowSums row_sums(const EntmaxParams& e, const float* x, int64_t len, float m, float t,
                            int lane) {
  float sum_p = 0.f, sum_s = 0.f;
  for (int64_t j = lane; j < len; j += 32) {
    const float d = __fsub_rn(__fsub_rn(x[j], m), t);
    if (d > 0.f) {
      sum_p += entmax_prob(e, d);
      sum_s += entmax_slope(e, d);
    }
  }
  return {warp_sum(sum_p), warp_sum(sum_s)};
}

// The shifted threshold t = τ − m of a row with n ≥ 1 visible keys, all finite, whose largest is
// m: Σ_j [(x_j − m) − t]_+^(1/(α−1)) = 1. Called by all 32 lanes of the warp that owns the row.
__device__ inline float solve_shifted_threshold(const EntmaxParams& e, const float* x, int64_t len,
                                         float m, int64_t n, int lane) {
  // The root lies in [lo, hi]: at t = −1 the largest key alone has p = 1, so Σp ≥ 1; at
  // t = −(1/n)^(α−1) every key has d ≤ (1/n)^(α−1), so p ≤ 1/n and Σp ≤ 1.
  const float count = static_cast<float>(n);
  float upper;
  switch (e.kind) {
    case EntmaxParams::kSparsemax: upper = 1.f / count; break;
    case EntmaxParams::kEntmax15: upper = 1.f / sqrtf(count); break;
    default: upper = expf(-e.alpha_minus_one * logf(count)); break;
  }
  float lo = -1.f;
  float hi = fmaxf(-upper, lo);  // n = 1: hi = lo = −1, the answer
  // Invariant: Σp(lo) ≥ 1 > Σp(hi) as computed (up to the rounding of the bracket's ends).
  const int steps = e.newton ? kBisectionBeforeNewton : kMaxBisection;
  for (int step = 0; step < steps; ++step) {
    const float mid = 0.5f * (lo + hi);
    if (!(mid > lo && mid < hi)) break;  // the ends are adjacent floats
    if (row_sums(e, x, len, m, mid, lane).p >= 1.f) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  float t = lo;
  if (e.newton) {
    // For α ≤ 2, f(t) = Σp(t) − 1 is convex and decreasing: a Newton step from a point with
    // f ≥ 0 lands between it and the root, so the steps climb to the root from below. f'(t) =
    // −Σ_j p'(d_j) = −exponent·Σ_j s_j. For sparsemax the step is Michelot's
    // t + (Σ_S d − 1)/|S|, exact once the support S is found.
    for (int step = 0; step < kMaxNewton; ++step) {
      const RowSums sums = row_sums(e, x, len, m, t, lane);
      const float f = sums.p - 1.f;
      if (!(f > 0.f) || !(sums.s > 0.f)) break;  // at (or, by rounding, just past) the root
      const float next = t + f / (e.exponent * sums.s);
      if (!(next > t)) break;  // no progress left in float32
      t = next;
    }
  }
  return t;
}

// Forward; see the file comment. Block blockIdx.x handles forward block first_block +
// blockIdx.x and uses workspace rows [blockIdx.x·kRows, (blockIdx.x + 1)·kRows) of len_k floats.
template <typename T, int kHead>
__global__ void __launch_bounds__(SparseTiles<kHead>::kThreads)
    sparse_forward_kernel(SdpaProblem p, EntmaxParams e, int64_t first_block, float* workspace,
                          T* output, float* tau, float* support_value, T* weights) {
  using Tiles = SparseTiles<kHead>;
  constexpr int R = Tiles::kRowsPerWarp;
  extern __shared__ float smem[];
  float* q_tile = smem;                                    // [kRows][kHead]
  float* k_tile = q_tile + Tiles::kRows * kHead;           // [kCols][kPadded]
  float* v_tile = k_tile + Tiles::kCols * Tiles::kPadded;  // [kCols][kHead]

  const int64_t block = first_block + blockIdx.x;
  const int64_t q_blocks = ceil_div(p.len_q, Tiles::kRows);
  const int64_t b = block / q_blocks;
  const int64_t i0 = block % q_blocks * Tiles::kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const MatrixView<T> query(p.query, p.shape, b), key(p.key, p.shape, b),
      value(p.value, p.shape, b);
  const MaskView mask(p, b);
  // This block's scores: row r (0 ≤ r < kRows) at ws + r·len_k, keys [0, keys).
  float* ws = workspace + static_cast<int64_t>(blockIdx.x) * Tiles::kRows * p.len_k;
  const int64_t keys = key_end(p, i0, Tiles::kRows);

  load_tile(q_tile, kHead, Tiles::kRows, kHead, query, i0, p.len_q, p.dim_qk);

  // ---- 1. scores into the workspace; per row (lane partials): max, visible count, bad.
  float lane_max[R];
  int64_t lane_count[R];
  bool lane_bad[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    lane_max[rr] = kNegInf;
    lane_count[rr] = 0;
    lane_bad[rr] = false;
  }
  for (int64_t j0 = 0; j0 < keys; j0 += Tiles::kCols) {
    __syncthreads();  // the previous k_tile is read (and, the first time, q_tile is written)
    load_tile(k_tile, Tiles::kPadded, Tiles::kCols, kHead, key, j0, p.len_k, p.dim_qk);
    __syncthreads();
    const int64_t j = j0 + lane;
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const float x = sparse_score(dot(q_tile + r * kHead, k_tile + lane * Tiles::kPadded, p.dim_qk),
                                   p, mask, e.alpha_minus_one, i0 + r, j);
      if (j < keys) ws[r * p.len_k + j] = x;
      if (x != kNegInf) {
        ++lane_count[rr];
        if (isnan(x) || x == kPosInf) {
          lane_bad[rr] = true;
        } else {
          lane_max[rr] = fmaxf(lane_max[rr], x);
        }
      }
    }
  }
  // Block-wide barrier: the workspace writes above are visible to the whole block (each row is
  // read back by the warp that wrote it, but by other lanes).
  __syncthreads();

  // ---- 2. thresholds, one row at a time per warp.
  RowThreshold row[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int r = warp * R + rr;
    const int64_t i = i0 + r;
    const float m = warp_max(lane_max[rr]);
    int64_t n = lane_count[rr];
    for (int offset = 16; offset > 0; offset /= 2) n += __shfl_xor_sync(kFullWarp, n, offset);
    const bool bad = __any_sync(kFullWarp, lane_bad[rr]);
    row[rr] = {m, 0.f, 0.f, n == 0, bad && n > 0};
    if (i >= p.len_q || row[rr].empty || row[rr].bad) {
      if (i < p.len_q && lane == 0) tau[b * p.len_q + i] = row[rr].empty ? kPosInf : kNaN;
      if (row[rr].bad) row[rr].inv_norm = kNaN;
      continue;  // uniform across the warp
    }
    const float* x = ws + r * p.len_k;
    const float t = solve_shifted_threshold(e, x, keys, m, n, lane);
    const float sum_p = row_sums(e, x, keys, m, t, lane).p;
    row[rr].shifted = t;
    // sum_p ≥ p(largest key) = (−t)^(1/(α−1)) ≥ 1/n > 0, since t ≤ −(1/n)^(α−1).
    row[rr].inv_norm = sum_p > 0.f ? 1.f / sum_p : 0.f;
    if (lane == 0) tau[b * p.len_q + i] = m + t;
  }

  // ---- 3. weights, output Σ p·V / Σp and support value Σ s·V / Σ s.
  float acc_out[R][Tiles::kPerLane], acc_sup[R][Tiles::kPerLane], lane_sum_s[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    lane_sum_s[rr] = 0.f;
#pragma unroll
    for (int c = 0; c < Tiles::kPerLane; ++c) acc_out[rr][c] = acc_sup[rr][c] = 0.f;
  }
  for (int64_t j0 = 0; j0 < keys; j0 += Tiles::kCols) {
    __syncthreads();  // the previous v_tile is read
    load_tile(v_tile, kHead, Tiles::kCols, kHead, value, j0, p.len_k, p.dim_v);
    __syncthreads();
    const int64_t j = j0 + lane;
    float prob[R], slope[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const int64_t i = i0 + r;
      const float x = j < keys ? ws[r * p.len_k + j] : kNegInf;
      const ProbSlope ps = entmax_in_row(e, x, row[rr]);
      // Renormalised. A hidden key's p is 0 also in a bad row (whose inv_norm is NaN).
      prob[rr] = x == kNegInf ? 0.f : ps.p * row[rr].inv_norm;
      slope[rr] = ps.s;
      lane_sum_s[rr] += ps.s;
      if (weights != nullptr && i < p.len_q && j < p.len_k) {
        weights[(b * p.len_q + i) * p.len_k + j] = from_float<T>(prob[rr]);
      }
    }
    // Key jj's p and s are held by lane jj; keys past len_k have zeros in v_tile and p = s = 0.
#pragma unroll 4
    for (int jj = 0; jj < Tiles::kCols; ++jj) {
      float p_j[R], s_j[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        p_j[rr] = __shfl_sync(kFullWarp, prob[rr], jj);
        s_j[rr] = __shfl_sync(kFullWarp, slope[rr], jj);
      }
#pragma unroll
      for (int c = 0; c < Tiles::kPerLane; ++c) {
        const float v = v_tile[jj * kHead + lane + 32 * c];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          acc_out[rr][c] = fmaf(p_j[rr], v, acc_out[rr][c]);
          acc_sup[rr][c] = fmaf(s_j[rr], v, acc_sup[rr][c]);
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t i = i0 + warp * R + rr;
    const float sum_s = warp_sum(lane_sum_s[rr]);  // all lanes take part
    if (i >= p.len_q) continue;
    // An empty row has zeros everywhere; elsewhere Σs ≥ s(largest key) > 0 (NaN in a bad row).
    const float inv_sum_s = row[rr].empty ? 0.f : 1.f / sum_s;
    T* out = output + (b * p.len_q + i) * p.dim_v;
    float* sup = support_value + (b * p.len_q + i) * p.dim_v;
#pragma unroll
    for (int c = 0; c < Tiles::kPerLane; ++c) {
      const int col = lane + 32 * c;
      if (col < p.dim_v) {
        out[col] = from_float<T>(acc_out[rr][c]);
        sup[col] = acc_sup[rr][c] * inv_sum_s;
      }
    }
    // Keys past the causal end of the block were never scored: zero weights.
    if (weights != nullptr) {
      for (int64_t j = keys + lane; j < p.len_k; j += 32) {
        weights[(b * p.len_q + i) * p.len_k + j] = from_float<T>(0.f);
      }
    }
  }
}

// delta_i = Σ_c dO_ic·U_ic, one warp per query row.
template <typename T>
__global__ void sparse_delta_kernel(SdpaProblem p, MatrixOperand grad_output,
                                    const float* support_value, float* delta) {
  constexpr int kWarps = 8;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.batch * p.len_q) return;  // whole warps leave together
  const int64_t b = row / p.len_q, i = row % p.len_q;
  const MatrixView<T> dout(grad_output, p.shape, b);
  const float* sup = support_value + row * p.dim_v;
  float sum = 0.f;
  for (int c = lane; c < p.dim_v; c += 32) sum = fmaf(dout.at(i, c), sup[c], sum);
  sum = warp_sum(sum);
  if (lane == 0) delta[row] = sum;
}

// dz_ij = s_ij·(dp_ij − delta_i); zero where s is (a pair off the support, even when dp is not
// finite), NaN where s is (a row whose τ is NaN).
__device__ __forceinline__ float entmax_grad_score(float s, float dp, float delta_i) {
  return s == 0.f ? 0.f : s * (dp - delta_i);
}

// dQ_i = scale·Σ_j dz_ij·K_j; one block per query block, looping over key tiles. Also writes
// dz into grad_mask.
template <typename T, int kHead>
__global__ void __launch_bounds__(SparseTiles<kHead>::kThreads)
    sparse_grad_query_kernel(SdpaProblem p, EntmaxParams e, MatrixOperand grad_output,
                             const float* tau, const float* delta, T* grad_query,
                             float* grad_mask) {
  using Tiles = SparseTiles<kHead>;
  constexpr int R = Tiles::kRowsPerWarp;
  extern __shared__ float smem[];
  float* q_tile = smem;                                     // [kRows][kHead]
  float* do_tile = q_tile + Tiles::kRows * kHead;           // [kRows][kHead]
  float* k_tile = do_tile + Tiles::kRows * kHead;           // [kCols][kPadded]
  float* v_tile = k_tile + Tiles::kCols * Tiles::kPadded;   // [kCols][kPadded]

  const int64_t q_blocks = ceil_div(p.len_q, Tiles::kRows);
  const int64_t b = blockIdx.x / q_blocks;
  const int64_t i0 = blockIdx.x % q_blocks * Tiles::kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const MatrixView<T> query(p.query, p.shape, b), key(p.key, p.shape, b),
      value(p.value, p.shape, b), dout(grad_output, p.shape, b);
  const MaskView mask(p, b);

  load_tile(q_tile, kHead, Tiles::kRows, kHead, query, i0, p.len_q, p.dim_qk);
  load_tile(do_tile, kHead, Tiles::kRows, kHead, dout, i0, p.len_q, p.dim_v);

  float row_tau[R], row_delta[R], dq[R][Tiles::kPerLane];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t i = i0 + warp * R + rr;
    row_tau[rr] = i < p.len_q ? tau[b * p.len_q + i] : kPosInf;
    row_delta[rr] = i < p.len_q ? delta[b * p.len_q + i] : 0.f;
#pragma unroll
    for (int c = 0; c < Tiles::kPerLane; ++c) dq[rr][c] = 0.f;
  }

  const int64_t keys = key_end(p, i0, Tiles::kRows);
  for (int64_t j0 = 0; j0 < keys; j0 += Tiles::kCols) {
    __syncthreads();
    load_tile(k_tile, Tiles::kPadded, Tiles::kCols, kHead, key, j0, p.len_k, p.dim_qk);
    load_tile(v_tile, Tiles::kPadded, Tiles::kCols, kHead, value, j0, p.len_k, p.dim_v);
    __syncthreads();

    const int64_t j = j0 + lane;
    float dz[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const int64_t i = i0 + r;
      const float x = sparse_score(dot(q_tile + r * kHead, k_tile + lane * Tiles::kPadded, p.dim_qk),
                                   p, mask, e.alpha_minus_one, i, j);
      const ProbSlope ps = entmax_from_tau(e, x, row_tau[rr]);
      const float dp = dot(do_tile + r * kHead, v_tile + lane * Tiles::kPadded, p.dim_v);
      dz[rr] = entmax_grad_score(ps.s, dp, row_delta[rr]);
      if (grad_mask != nullptr && i < p.len_q && j < p.len_k) {
        grad_mask[(b * p.len_q + i) * p.len_k + j] = dz[rr];
      }
    }
    // Keys past len_k have s = 0, hence dz = 0, and zero rows in k_tile.
#pragma unroll 4
    for (int jj = 0; jj < Tiles::kCols; ++jj) {
      float dz_j[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) dz_j[rr] = __shfl_sync(kFullWarp, dz[rr], jj);
#pragma unroll
      for (int c = 0; c < Tiles::kPerLane; ++c) {
        const float k = k_tile[jj * Tiles::kPadded + lane + 32 * c];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) dq[rr][c] = fmaf(dz_j[rr], k, dq[rr][c]);
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t i = i0 + warp * R + rr;
    if (i >= p.len_q) continue;
    T* out = grad_query + (b * p.len_q + i) * p.dim_qk;
#pragma unroll
    for (int c = 0; c < Tiles::kPerLane; ++c) {
      const int col = lane + 32 * c;
      if (col < p.dim_qk) out[col] = from_float<T>(dq[rr][c] * p.scale);
    }
  }
}

// dV_j = Σ_i p_ij·dO_i and dK_j = scale·Σ_i dz_ij·Q_i; one block per key block, looping over the
// query tiles that can see it.
template <typename T, int kHead>
__global__ void __launch_bounds__(SparseTiles<kHead>::kThreads)
    sparse_grad_key_value_kernel(SdpaProblem p, EntmaxParams e, MatrixOperand grad_output,
                                 const float* tau, const float* delta, T* grad_key,
                                 T* grad_value) {
  using Tiles = SparseTiles<kHead>;
  constexpr int R = Tiles::kRowsPerWarp;
  extern __shared__ float smem[];
  float* k_tile = smem;                                      // [kRows][kHead]
  float* v_tile = k_tile + Tiles::kRows * kHead;             // [kRows][kHead]
  float* q_tile = v_tile + Tiles::kRows * kHead;             // [kCols][kPadded]
  float* do_tile = q_tile + Tiles::kCols * Tiles::kPadded;   // [kCols][kPadded]

  const int64_t k_blocks = ceil_div(p.len_k, Tiles::kRows);
  const int64_t b = blockIdx.x / k_blocks;
  const int64_t j0 = blockIdx.x % k_blocks * Tiles::kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const MatrixView<T> query(p.query, p.shape, b), key(p.key, p.shape, b),
      value(p.value, p.shape, b), dout(grad_output, p.shape, b);
  const MaskView mask(p, b);

  load_tile(k_tile, kHead, Tiles::kRows, kHead, key, j0, p.len_k, p.dim_qk);
  load_tile(v_tile, kHead, Tiles::kRows, kHead, value, j0, p.len_k, p.dim_v);

  float dk[R][Tiles::kPerLane], dv[R][Tiles::kPerLane];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
#pragma unroll
    for (int c = 0; c < Tiles::kPerLane; ++c) dk[rr][c] = dv[rr][c] = 0.f;
  }

  // Under the causal mask, queries before j0 see none of these keys.
  const int64_t first_query = p.causal ? j0 : 0;
  for (int64_t q0 = first_query; q0 < p.len_q; q0 += Tiles::kCols) {
    __syncthreads();
    load_tile(q_tile, Tiles::kPadded, Tiles::kCols, kHead, query, q0, p.len_q, p.dim_qk);
    load_tile(do_tile, Tiles::kPadded, Tiles::kCols, kHead, dout, q0, p.len_q, p.dim_v);
    __syncthreads();

    // Lane l takes query q0 + l against each of the warp's keys.
    const int64_t i = q0 + lane;
    const float tau_i = i < p.len_q ? tau[b * p.len_q + i] : kPosInf;
    const float delta_i = i < p.len_q ? delta[b * p.len_q + i] : 0.f;
    float prob[R], dz[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const float x = sparse_score(dot(q_tile + lane * Tiles::kPadded, k_tile + r * kHead, p.dim_qk),
                                   p, mask, e.alpha_minus_one, i, j0 + r);
      const ProbSlope ps = entmax_from_tau(e, x, tau_i);
      prob[rr] = ps.p;
      const float dp = dot(do_tile + lane * Tiles::kPadded, v_tile + r * kHead, p.dim_v);
      dz[rr] = entmax_grad_score(ps.s, dp, delta_i);
    }
    // Queries past len_q have p = dz = 0 and zero rows in q_tile and do_tile.
#pragma unroll 4
    for (int ii = 0; ii < Tiles::kCols; ++ii) {
      float p_i[R], dz_i[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        p_i[rr] = __shfl_sync(kFullWarp, prob[rr], ii);
        dz_i[rr] = __shfl_sync(kFullWarp, dz[rr], ii);
      }
#pragma unroll
      for (int c = 0; c < Tiles::kPerLane; ++c) {
        const float dout_ic = do_tile[ii * Tiles::kPadded + lane + 32 * c];
        const float q_ic = q_tile[ii * Tiles::kPadded + lane + 32 * c];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          dv[rr][c] = fmaf(p_i[rr], dout_ic, dv[rr][c]);
          dk[rr][c] = fmaf(dz_i[rr], q_ic, dk[rr][c]);
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t j = j0 + warp * R + rr;
    if (j >= p.len_k) continue;
#pragma unroll
    for (int c = 0; c < Tiles::kPerLane; ++c) {
      const int col = lane + 32 * c;
      if (col < p.dim_qk) grad_key[(b * p.len_k + j) * p.dim_qk + col] = from_float<T>(dk[rr][c] * p.scale);
      if (col < p.dim_v) grad_value[(b * p.len_k + j) * p.dim_v + col] = from_float<T>(dv[rr][c]);
    }
  }
}

}  // namespace attnlab::cuda::detail

namespace attnlab::cuda {

template <typename T, int kHead>
void sparse_forward(const SdpaProblem& p, const EntmaxParams& e, float* workspace,
                    int64_t wave_blocks, T* output, float* tau, float* support_value, T* weights,
                    cudaStream_t stream) {
  using Tiles = detail::SparseTiles<kHead>;
  const int64_t blocks = sparse_forward_blocks(p);
  if (blocks == 0) return;
  if (wave_blocks <= 0 || wave_blocks > blocks) wave_blocks = blocks;
  // Waves run one after the other on the stream, so each reuses the workspace from the start.
  for (int64_t first = 0; first < blocks; first += wave_blocks) {
    const int64_t count = std::min(wave_blocks, blocks - first);
    detail::launch(detail::sparse_forward_kernel<T, kHead>, count, Tiles::kThreads,
                   Tiles::kForwardSharedBytes, stream, p, e, first, workspace, output, tau,
                   support_value, weights);
  }
}

template <typename T, int kHead>
void sparse_backward(const SdpaProblem& p, const EntmaxParams& e,
                     const MatrixOperand& grad_output, const float* tau,
                     const float* support_value, float* delta, T* grad_query, T* grad_key,
                     T* grad_value, float* grad_mask, cudaStream_t stream) {
  using Tiles = detail::SparseTiles<kHead>;
  constexpr int kDeltaRowsPerBlock = 8;
  detail::launch(detail::sparse_delta_kernel<T>,
                 detail::ceil_div(p.batch * p.len_q, kDeltaRowsPerBlock), kDeltaRowsPerBlock * 32,
                 0, stream, p, grad_output, support_value, delta);
  constexpr size_t smem = Tiles::kBackwardSharedBytes;
  detail::launch(detail::sparse_grad_query_kernel<T, kHead>,
                 p.batch * detail::ceil_div(p.len_q, Tiles::kRows), Tiles::kThreads, smem, stream,
                 p, e, grad_output, tau, static_cast<const float*>(delta), grad_query, grad_mask);
  detail::launch(detail::sparse_grad_key_value_kernel<T, kHead>,
                 p.batch * detail::ceil_div(p.len_k, Tiles::kRows), Tiles::kThreads, smem, stream,
                 p, e, grad_output, tau, static_cast<const float*>(delta), grad_key, grad_value);
}

}  // namespace attnlab::cuda

#define ATTNLAB_INSTANTIATE_SPARSE(T, kHead)                                                  \
  namespace attnlab::cuda {                                                                   \
  template void sparse_forward<T, kHead>(const SdpaProblem&, const EntmaxParams&, float*,     \
                                         int64_t, T*, float*, float*, T*, cudaStream_t);      \
  template void sparse_backward<T, kHead>(const SdpaProblem&, const EntmaxParams&,            \
                                          const MatrixOperand&, const float*, const float*,   \
                                          float*, T*, T*, T*, float*, cudaStream_t);          \
  }

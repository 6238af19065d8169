#pragma once
// Tiled scaled dot-product attention for any head size up to kHead, on CUDA cores with float32
// arithmetic whatever the storage type. Written for clarity first: one warp owns a few rows of
// one side (queries in the forward and the dQ pass, keys in the dK/dV pass) and its 32 lanes
// take 32 rows of the other side, one each; tiles are staged in shared memory as float.
//
//   forward   online softmax over key tiles; keeps the log-sum-exp; with need_weights a second
//             pass over the same tiles writes exp(s − max)/sum.
//   backward  two kernels that recompute the probabilities as exp(s − max)/sum: one per
//             query block (each row's max, sum and delta_i = Σ_j P_ij·dP_ij in a first pass
//             over the key tiles, then dQ and the mask's gradient), one per key block (dK,
//             dV). No atomics: every gradient element has one owner.
//
// Instantiate with ATTNLAB_INSTANTIATE_SDPA_GENERIC(T, kHead) in one translation unit per
// (dtype, head-size family).

#include "cuda/device_common.cuh"

namespace attnlab::cuda::detail {

template <int kHead>
struct GenericTiles {
  static_assert(kHead % 32 == 0, "head-size families are multiples of the warp size");
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = 4;
  static constexpr int kRows = kWarps * kRowsPerWarp;  // rows owned by one block
  static constexpr int kCols = 32;                     // rows of the other side per tile
  static constexpr int kPerLane = kHead / 32;          // features per lane in accumulators
  // Tiles read down a column by the 32 lanes get one float of padding per row, so that the
  // lanes hit 32 different banks.
  static constexpr int kPadded = kHead + 1;
  // Dynamic shared memory: the forward stages Q [kRows][kHead], K [kCols][kPadded] and
  // V [kCols][kHead]; each backward kernel two [kRows][kHead] and two [kCols][kPadded] tiles.
  // Above 48 KiB (D = 128 backward, D = 256) launch() opts in; sm_80 allows 163 KiB per block.
  static constexpr size_t kForwardSharedBytes =
      sizeof(float) * (kRows * kHead + kCols * kPadded + kCols * kHead);
  static constexpr size_t kBackwardSharedBytes =
      sizeof(float) * 2 * (kRows * kHead + kCols * kPadded);
  static_assert(kForwardSharedBytes <= 163 * 1024 && kBackwardSharedBytes <= 163 * 1024);
};

// The mask of one batch entry as an additive value; base == nullptr for no mask.
struct MaskView {
  const void* base;
  bool is_bool;
  int64_t row_stride, col_stride;

  __device__ MaskView(const SdpaProblem& p, int64_t b)
      : base(p.mask.data == nullptr
                 ? nullptr
                 : static_cast<const char*>(p.mask.data) +
                       batch_offset(p.shape, p.mask.batch_stride, b) *
                           (p.mask_is_bool ? sizeof(bool) : sizeof(float))),
        is_bool(p.mask_is_bool),
        row_stride(p.mask.row_stride),
        col_stride(p.mask.col_stride) {}

  __device__ float at(int64_t i, int64_t j) const {
    const int64_t offset = i * row_stride + j * col_stride;
    if (is_bool) return static_cast<const bool*>(base)[offset] ? 0.f : kNegInf;
    return static_cast<const float*>(base)[offset];
  }
};

// scale·(q_i·k_j) + mask(i, j), or −inf where query i may not see key j (out of range or
// causal). Out-of-range pairs read nothing.
__device__ __forceinline__ float masked_score(float dot_qk, const SdpaProblem& p,
                                              const MaskView& mask, int64_t i, int64_t j) {
  if (i >= p.len_q || j >= p.len_k || (p.causal && j > i)) return kNegInf;
  if (mask.base == nullptr) return dot_qk * p.scale;
  // A −inf mask entry hides the key whatever its score, as on the CPU: a NaN or inf score
  // plus −inf would be NaN and poison the whole row.
  const float m = mask.at(i, j);
  return m == kNegInf ? kNegInf : dot_qk * p.scale + m;
}

// exp(s − max)/sum, as the forward normalizes: 0 for invisible pairs and for queries with
// every key masked (max = −inf). A NaN score stays NaN.
__device__ __forceinline__ float normalized_prob(float s, float row_max, float inv_sum) {
  return s == kNegInf || row_max == kNegInf ? 0.f : expf(s - row_max) * inv_sum;
}

// What the dQ kernel finds of each query row and the dK/dV kernel reads, [batch·len_q] each.
struct BackwardRowStats {
  float* row_max;
  float* inv_sum;
  float* delta;
};

// Keys a query block [i0, i0 + rows) can see: all, or under the causal mask those up to its
// last row.
__device__ __forceinline__ int64_t key_end(const SdpaProblem& p, int64_t i0, int rows) {
  return p.causal && i0 + rows < p.len_k ? i0 + rows : p.len_k;
}

template <typename T, int kHead>
__global__ void __launch_bounds__(GenericTiles<kHead>::kThreads)
    sdpa_forward_kernel(SdpaProblem p, T* output, float* logsumexp, T* weights) {
  using Tiles = GenericTiles<kHead>;
  constexpr int R = Tiles::kRowsPerWarp;
  extern __shared__ float smem[];
  float* q_tile = smem;                                // [kRows][kHead]
  float* k_tile = q_tile + Tiles::kRows * kHead;       // [kCols][kPadded]
  float* v_tile = k_tile + Tiles::kCols * Tiles::kPadded;  // [kCols][kHead]

  const int64_t q_blocks = ceil_div(p.len_q, Tiles::kRows);
  const int64_t b = blockIdx.x / q_blocks;
  const int64_t i0 = blockIdx.x % q_blocks * Tiles::kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const MatrixView<T> query(p.query, p.shape, b), key(p.key, p.shape, b),
      value(p.value, p.shape, b);
  const MaskView mask(p, b);

  load_tile(q_tile, kHead, Tiles::kRows, kHead, query, i0, p.len_q, p.dim_qk);

  float row_max[R], row_sum[R], acc[R][Tiles::kPerLane];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    row_max[rr] = kNegInf;
    row_sum[rr] = 0.f;
#pragma unroll
    for (int t = 0; t < Tiles::kPerLane; ++t) acc[rr][t] = 0.f;
  }

  const int64_t keys = key_end(p, i0, Tiles::kRows);
  for (int64_t j0 = 0; j0 < keys; j0 += Tiles::kCols) {
    __syncthreads();  // the previous tiles are read (and, the first time, q_tile is written)
    load_tile(k_tile, Tiles::kPadded, Tiles::kCols, kHead, key, j0, p.len_k, p.dim_qk);
    load_tile(v_tile, kHead, Tiles::kCols, kHead, value, j0, p.len_k, p.dim_v);
    __syncthreads();

    // Lane l scores key j0 + l against each of the warp's rows.
    float prob[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const float s = masked_score(dot(q_tile + r * kHead, k_tile + lane * Tiles::kPadded, p.dim_qk),
                                   p, mask, i0 + r, j0 + lane);
      const float new_max = fmaxf(row_max[rr], warp_max(s));
      prob[rr] = s == kNegInf ? 0.f : expf(s - new_max);
      // What the sums so far are worth under the new max (nothing was visible before: 0).
      const float correction = row_max[rr] == kNegInf ? 0.f : expf(row_max[rr] - new_max);
      row_sum[rr] = row_sum[rr] * correction + warp_sum(prob[rr]);
      row_max[rr] = new_max;
#pragma unroll
      for (int t = 0; t < Tiles::kPerLane; ++t) acc[rr][t] *= correction;
    }
    // acc += P·V; key jj's probability is held by lane jj. Keys past the end have P = 0 and
    // zero rows in v_tile.
#pragma unroll 4
    for (int jj = 0; jj < Tiles::kCols; ++jj) {
      float p_j[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) p_j[rr] = __shfl_sync(kFullWarp, prob[rr], jj);
#pragma unroll
      for (int t = 0; t < Tiles::kPerLane; ++t) {
        const float v = v_tile[jj * kHead + lane + 32 * t];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) acc[rr][t] = fmaf(p_j[rr], v, acc[rr][t]);
      }
    }
  }

  float inv_sum[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t i = i0 + warp * R + rr;
    const bool none_visible = row_sum[rr] == 0.f;
    inv_sum[rr] = none_visible ? 0.f : 1.f / row_sum[rr];
    if (i >= p.len_q) continue;
    T* out = output + (b * p.len_q + i) * p.dim_v;
#pragma unroll
    for (int t = 0; t < Tiles::kPerLane; ++t) {
      const int c = lane + 32 * t;
      if (c < p.dim_v) out[c] = from_float<T>(acc[rr][t] * inv_sum[rr]);
    }
    if (lane == 0) {
      logsumexp[b * p.len_q + i] = none_visible ? kNegInf : row_max[rr] + logf(row_sum[rr]);
    }
  }
  if (weights == nullptr) return;

  // The normalized weights, recomputed tile by tile with the final max and sum; keys past the
  // causal end get zeros without being read.
  for (int64_t j0 = 0; j0 < p.len_k; j0 += Tiles::kCols) {
    const bool visible_tile = j0 < keys;  // the same for the whole block
    if (visible_tile) {
      __syncthreads();
      load_tile(k_tile, Tiles::kPadded, Tiles::kCols, kHead, key, j0, p.len_k, p.dim_qk);
      __syncthreads();
    }
    const int64_t j = j0 + lane;
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const int64_t i = i0 + r;
      if (i >= p.len_q || j >= p.len_k) continue;
      float w = 0.f;
      if (visible_tile) {
        const float s = masked_score(dot(q_tile + r * kHead, k_tile + lane * Tiles::kPadded, p.dim_qk),
                                     p, mask, i, j);
        w = s == kNegInf ? 0.f : expf(s - row_max[rr]) * inv_sum[rr];
      }
      weights[(b * p.len_q + i) * p.len_k + j] = from_float<T>(w);
    }
  }
}

// dQ_i = scale·Σ_j dS_ij·K_j with dS = P ⊙ (dP − delta), dP = dO·Vᵀ; one block per query
// block, looping over key tiles as the forward does. Also writes dS into grad_mask.
//
// The probabilities are recomputed as the forward made them, exp(s − max_i)/sum_i, from a row
// max and sum that a first pass over the key tiles finds again (an online softmax per lane,
// merged across the warp), not from the forward's log-sum-exp: max_i + log(sum_i) rounds to
// the ulp of the scores (about 2e-6 where |s| ≈ 30), so exp(s − lse) scales the whole row by up
// to 1 ± 1e-5 and its probabilities do not sum to 1. Where a row's probability sits on one key
// that made dS = P·(dP − Σ P·dP) = P·(1 − P)·dP nonzero where it is exactly 0: the CUDA-vs-CPU
// fuzz (tests/python/test_cuda_vs_cpu_properties.py) on an NVIDIA H200 found 1.4e-5 (relative) in dQ at one query over two keys, head size
// 164, scale 2, and 2.8e-5 in float16 at scale −2.6 (torch: 9.6e-7). The same pass sums
// delta_i = Σ_j P_ij·dP_ij from the very dP values that dP − delta cancels against (through
// Σ_c dO_ic·O_ic it went wrong on the first GPU runs: in float16/bfloat16 O is rounded to 16
// bits; in float32 the two sums are rounded in different orders). The row max, 1/sum and delta
// go to scratch for the dK/dV kernel.
template <typename T, int kHead>
__global__ void __launch_bounds__(GenericTiles<kHead>::kThreads)
    sdpa_grad_query_kernel(SdpaProblem p, MatrixOperand grad_output, BackwardRowStats stats,
                           T* grad_query, float* grad_mask) {
  using Tiles = GenericTiles<kHead>;
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

  float row_max[R], row_inv_sum[R], row_delta[R], dq[R][Tiles::kPerLane];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    row_max[rr] = kNegInf;
    row_inv_sum[rr] = row_delta[rr] = 0.f;
#pragma unroll
    for (int t = 0; t < Tiles::kPerLane; ++t) dq[rr][t] = 0.f;
  }

  const int64_t keys = key_end(p, i0, Tiles::kRows);
  // The K and V tiles of keys [j0, j0 + 32), for both passes below.
  const auto load_key_tiles = [&](int64_t j0) {
    __syncthreads();  // every warp is done with the previous tiles
    load_tile(k_tile, Tiles::kPadded, Tiles::kCols, kHead, key, j0, p.len_k, p.dim_qk);
    load_tile(v_tile, Tiles::kPadded, Tiles::kCols, kHead, value, j0, p.len_k, p.dim_v);
    __syncthreads();
  };
  // Lane l keeps, for each of the warp's rows, the max of its keys' scores (row_max), the sum
  // of exp(s − max) (row_inv_sum, inverted below) and of exp(s − max)·dP (row_delta), rescaled
  // when the max grows. As in the reference's Σ_j P_ij·dP_ij, a NaN in a V row reaches delta
  // even where P is 0 (0·NaN); a NaN score makes the row's sum NaN, as in the forward.
  for (int64_t j0 = 0; j0 < keys; j0 += Tiles::kCols) {
    load_key_tiles(j0);
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const float s = masked_score(dot(q_tile + r * kHead, k_tile + lane * Tiles::kPadded,
                                       p.dim_qk), p, mask, i0 + r, j0 + lane);
      const float dp = dot(do_tile + r * kHead, v_tile + lane * Tiles::kPadded, p.dim_v);
      if (s > row_max[rr]) {
        const float c = row_max[rr] == kNegInf ? 0.f : expf(row_max[rr] - s);
        row_inv_sum[rr] = fmaf(row_inv_sum[rr], c, 1.f);
        row_delta[rr] = fmaf(row_delta[rr], c, dp);
        row_max[rr] = s;
      } else {
        const float e = s == kNegInf ? 0.f : expf(s - row_max[rr]);
        row_inv_sum[rr] += e;
        row_delta[rr] = fmaf(e, dp, row_delta[rr]);
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    // Merge the lanes: each one's sums rescaled to the row's max (a lane that saw only hidden
    // keys has 0, or NaN from 0·NaN, and keeps it).
    const float m = warp_max(row_max[rr]);
    const float c = row_max[rr] == m ? 1.f : expf(row_max[rr] - m);
    const float sum = warp_sum(row_inv_sum[rr] * c);
    row_inv_sum[rr] = sum == 0.f ? 0.f : 1.f / sum;  // 0 where every key is hidden
    row_delta[rr] = warp_sum(row_delta[rr] * c) * row_inv_sum[rr];
    row_max[rr] = m;
    const int64_t i = i0 + warp * R + rr;
    if (lane == 0 && i < p.len_q) {
      const int64_t row = b * p.len_q + i;
      stats.row_max[row] = m;
      stats.inv_sum[row] = row_inv_sum[rr];
      stats.delta[row] = row_delta[rr];
    }
  }
  for (int64_t j0 = 0; j0 < keys; j0 += Tiles::kCols) {
    load_key_tiles(j0);

    const int64_t j = j0 + lane;
    float ds[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const int64_t i = i0 + r;
      const float s = masked_score(dot(q_tile + r * kHead, k_tile + lane * Tiles::kPadded, p.dim_qk),
                                   p, mask, i, j);
      const float prob = normalized_prob(s, row_max[rr], row_inv_sum[rr]);
      const float dp = dot(do_tile + r * kHead, v_tile + lane * Tiles::kPadded, p.dim_v);
      ds[rr] = prob * (dp - row_delta[rr]);
      if (grad_mask != nullptr && i < p.len_q && j < p.len_k) {
        grad_mask[(b * p.len_q + i) * p.len_k + j] = ds[rr];
      }
    }
#pragma unroll 4
    for (int jj = 0; jj < Tiles::kCols; ++jj) {
      float ds_j[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) ds_j[rr] = __shfl_sync(kFullWarp, ds[rr], jj);
#pragma unroll
      for (int t = 0; t < Tiles::kPerLane; ++t) {
        const float k = k_tile[jj * Tiles::kPadded + lane + 32 * t];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) dq[rr][t] = fmaf(ds_j[rr], k, dq[rr][t]);
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t i = i0 + warp * R + rr;
    if (i >= p.len_q) continue;
    T* out = grad_query + (b * p.len_q + i) * p.dim_qk;
#pragma unroll
    for (int t = 0; t < Tiles::kPerLane; ++t) {
      const int c = lane + 32 * t;
      if (c < p.dim_qk) out[c] = from_float<T>(dq[rr][t] * p.scale);
    }
  }
}

// dV_j = Σ_i P_ij·dO_i and dK_j = scale·Σ_i dS_ij·Q_i; one block per key block, looping over
// the query tiles that can see it.
template <typename T, int kHead>
__global__ void __launch_bounds__(GenericTiles<kHead>::kThreads)
    sdpa_grad_key_value_kernel(SdpaProblem p, MatrixOperand grad_output, BackwardRowStats stats,
                               T* grad_key, T* grad_value) {
  using Tiles = GenericTiles<kHead>;
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
    for (int t = 0; t < Tiles::kPerLane; ++t) dk[rr][t] = dv[rr][t] = 0.f;
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
    const int64_t row = b * p.len_q + i;
    const float max_i = i < p.len_q ? stats.row_max[row] : kNegInf;
    const float inv_sum_i = i < p.len_q ? stats.inv_sum[row] : 0.f;
    const float delta_i = i < p.len_q ? stats.delta[row] : 0.f;
    float prob[R], ds[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int r = warp * R + rr;
      const float s = masked_score(dot(q_tile + lane * Tiles::kPadded, k_tile + r * kHead, p.dim_qk),
                                   p, mask, i, j0 + r);
      prob[rr] = normalized_prob(s, max_i, inv_sum_i);
      const float dp = dot(do_tile + lane * Tiles::kPadded, v_tile + r * kHead, p.dim_v);
      ds[rr] = prob[rr] * (dp - delta_i);
    }
#pragma unroll 4
    for (int ii = 0; ii < Tiles::kCols; ++ii) {
      float p_i[R], ds_i[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        p_i[rr] = __shfl_sync(kFullWarp, prob[rr], ii);
        ds_i[rr] = __shfl_sync(kFullWarp, ds[rr], ii);
      }
#pragma unroll
      for (int t = 0; t < Tiles::kPerLane; ++t) {
        const float dout_ic = do_tile[ii * Tiles::kPadded + lane + 32 * t];
        const float q_ic = q_tile[ii * Tiles::kPadded + lane + 32 * t];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          dv[rr][t] = fmaf(p_i[rr], dout_ic, dv[rr][t]);
          dk[rr][t] = fmaf(ds_i[rr], q_ic, dk[rr][t]);
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t j = j0 + warp * R + rr;
    if (j >= p.len_k) continue;
#pragma unroll
    for (int t = 0; t < Tiles::kPerLane; ++t) {
      const int c = lane + 32 * t;
      if (c < p.dim_qk) grad_key[(b * p.len_k + j) * p.dim_qk + c] = from_float<T>(dk[rr][t] * p.scale);
      if (c < p.dim_v) grad_value[(b * p.len_k + j) * p.dim_v + c] = from_float<T>(dv[rr][t]);
    }
  }
}

}  // namespace attnlab::cuda::detail

namespace attnlab::cuda {

template <typename T, int kHead>
void sdpa_forward(const SdpaProblem& p, T* output, float* logsumexp, T* weights,
                  cudaStream_t stream) {
  using Tiles = detail::GenericTiles<kHead>;
  detail::launch(detail::sdpa_forward_kernel<T, kHead>,
                 p.batch * detail::ceil_div(p.len_q, Tiles::kRows), Tiles::kThreads,
                 Tiles::kForwardSharedBytes, stream, p, output, logsumexp, weights);
}

template <typename T, int kHead>
void sdpa_backward(const SdpaProblem& p, const MatrixOperand& grad_output, float* row_scratch,
                   T* grad_query, T* grad_key, T* grad_value, float* grad_mask,
                   cudaStream_t stream) {
  using Tiles = detail::GenericTiles<kHead>;
  // The dQ kernel finds each row's max, sum and delta itself, from the scores (see it).
  const int64_t rows = p.batch * p.len_q;
  const detail::BackwardRowStats stats{row_scratch, row_scratch + rows, row_scratch + 2 * rows};
  constexpr size_t smem = Tiles::kBackwardSharedBytes;
  detail::launch(detail::sdpa_grad_query_kernel<T, kHead>,
                 p.batch * detail::ceil_div(p.len_q, Tiles::kRows), Tiles::kThreads, smem, stream,
                 p, grad_output, stats, grad_query, grad_mask);
  detail::launch(detail::sdpa_grad_key_value_kernel<T, kHead>,
                 p.batch * detail::ceil_div(p.len_k, Tiles::kRows), Tiles::kThreads, smem, stream,
                 p, grad_output, stats, grad_key, grad_value);
}

}  // namespace attnlab::cuda

#define ATTNLAB_INSTANTIATE_SDPA_GENERIC(T, kHead)                                           \
  namespace attnlab::cuda {                                                                   \
  template void sdpa_forward<T, kHead>(const SdpaProblem&, T*, float*, T*, cudaStream_t);     \
  template void sdpa_backward<T, kHead>(const SdpaProblem&, const MatrixOperand&, float*,     \
                                        T*, T*, T*, float*, cudaStream_t);                    \
  }

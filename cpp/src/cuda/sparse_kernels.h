#pragma once
// CUDA sparse attention (sparsemax, entmax-1.5, α-entmax) over raw device pointers. The operator
// layer (cuda/sparse_ops.cpp) validates, broadcasts and lays out the tensors; these launchers
// only compute, on the stream they are given. Plain C++: included by host code and the .cu files.
//
// Per query row i, with x_ij = (α−1)·z_ij and z_ij = scale·q_i·k_j + mask_ij:
//   p_ij = [x_ij − τ_i]_+^(1/(α−1)),  τ_i such that Σ_j p_ij = 1,
//   s_ij = p_ij^(2−α) on the support (p_ij > 0), 0 off it,
//   U_i  = Σ_j s_ij·V_j / Σ_j s_ij   (the support value the backward needs).
// τ_i is +inf, and p, U and the output are 0, for a query that sees no key.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/sdpa_kernels.h"

namespace attnlab::cuda {

// Query rows per forward block: the forward's workspace holds kSparseRowsPerBlock·len_k floats
// per block in flight.
constexpr int kSparseRowsPerBlock = 16;

// The mapping from scores to probabilities, prepared on the host from α (> 1).
struct EntmaxParams {
  enum Kind : int { kSparsemax = 0, kEntmax15 = 1, kGeneral = 2 };
  int kind = kSparsemax;        // α == 2, α == 1.5, anything else
  float alpha_minus_one = 1.f;  // x = (α−1)·z
  float exponent = 1.f;         // p = d^exponent with d = x − τ > 0: 1/(α−1)
  float slope_exponent = 0.f;   // s = p^(2−α) = d^slope_exponent: (2−α)/(α−1)
  // α ≤ 2: Σ_j p_j is convex in τ, so Newton steps from below converge to the threshold
  // (Michelot's algorithm for sparsemax). α > 2: bisection alone.
  bool newton = true;
};

// EntmaxParams for α (the caller checks that α is finite and > 1). The exponents are computed
// in double and rounded once.
inline EntmaxParams entmax_params(double alpha) {
  EntmaxParams e;
  e.kind = alpha == 2.0   ? EntmaxParams::kSparsemax
           : alpha == 1.5 ? EntmaxParams::kEntmax15
                          : EntmaxParams::kGeneral;
  e.alpha_minus_one = static_cast<float>(alpha - 1.0);
  e.exponent = static_cast<float>(1.0 / (alpha - 1.0));
  e.slope_exponent = static_cast<float>((2.0 - alpha) / (alpha - 1.0));
  e.newton = alpha <= 2.0;
  return e;
}

// Forward. Outputs are contiguous at the flattened batch: output [batch, len_q, dim_v] (T),
// tau [batch, len_q] (float32), support_value [batch, len_q, dim_v] (float32), weights
// [batch, len_q, len_k] (T, may be null). `workspace` holds at least
// wave_blocks·kSparseRowsPerBlock·len_k floats: the blocks (batch entry, 16 queries) are
// launched in waves of at most wave_blocks, one after the other on `stream`.
template <typename T, int kHead>
void sparse_forward(const SdpaProblem& p, const EntmaxParams& e, float* workspace,
                    int64_t wave_blocks, T* output, float* tau, float* support_value, T* weights,
                    cudaStream_t stream);

// Number of forward blocks for a problem (batch entries × query blocks).
inline int64_t sparse_forward_blocks(const SdpaProblem& p) {
  return p.batch * ((p.len_q + kSparseRowsPerBlock - 1) / kSparseRowsPerBlock);
}

// Backward. Gradients at the flattened batch, contiguous, written (not accumulated):
// grad_query [batch, len_q, dim_qk], grad_key [batch, len_k, dim_qk], grad_value
// [batch, len_k, dim_v] (T); grad_mask (float32 [batch, len_q, len_k], zero-filled by the
// caller, may be null) receives dz for every pair a query can see. tau [batch, len_q] and
// support_value [batch, len_q, dim_v] are the forward's (float32, contiguous); delta is float32
// scratch of [batch, len_q]. grad_output is indexed like the query.
template <typename T, int kHead>
void sparse_backward(const SdpaProblem& p, const EntmaxParams& e,
                     const MatrixOperand& grad_output, const float* tau,
                     const float* support_value, float* delta, T* grad_query, T* grad_key,
                     T* grad_value, float* grad_mask, cudaStream_t stream);

}  // namespace attnlab::cuda

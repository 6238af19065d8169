#pragma once
// Blocked attention with sparse normalizers on the CPU, over raw pointers: sparsemax (α = 2),
// entmax-1.5 (α = 1.5) and α-entmax for any α > 1. The operator layer
// (ops/sparse_attention.cpp) broadcasts, validates and lays out the tensors; these functions
// only compute.
//
// Per query row, with scores z_j = scale·q·k_jᵀ + mask_j (−inf where masked or hidden by the
// causal mask):
//   p_j = [(α − 1)·z_j − τ]_+^{1/(α − 1)},  τ such that Σ_j p_j = 1,
// the maximiser of ⟨p, z⟩ + H_α(p) over the simplex (Tsallis entropy H_α). Keys below the
// threshold get exactly 0. The backward needs s_j = p_j^{2 − α} on the support (0 off it):
// dz_j = s_j·(dp_j − δ), δ = Σ_j s_j·dp_j / Σ_j s_j = dO·U with U = Σ_j s_j·v_j / Σ_j s_j,
// which the forward computes (one more product with V) so that the backward needs one pass.

#include <cstdint>

#include "cpu/attention_kernel.h"

namespace attnlab::cpu {

// alpha == 2: sparsemax; alpha == 1.5: entmax-1.5, both with exact thresholds (Newton steps
// from below on the convex threshold equation, ended by the closed-form solve on the found
// support, a sort as fallback); any other alpha > 1: threshold by bracketed Newton/bisection
// to below the float resolution, probabilities then renormalised.
//
// Outputs, contiguous at the broadcast batch shape:
//   output [batch, len_q, dim_v] = P·V;
//   tau [batch, len_q]: the threshold τ above (+inf for a row that sees no key, so p = 0;
//     NaN when the row's scores hold NaN or +inf, whose output is NaN);
//   support_value [batch, len_q, dim_v] = U (zeros for a row that sees no key);
//   weights, when not null, P [batch, len_q, len_k].
// Memory beyond the outputs: two query block × len_k buffers per thread.
template <typename T>
void sparse_attention_forward(const AttentionProblem<T>& p, double alpha, T* output, T* tau,
                              T* support_value, T* weights);

// Gradients, contiguous at the broadcast batch shape, written (not accumulated):
// grad_query [batch, len_q, dim_qk], grad_key [batch, len_k, dim_qk], grad_value
// [batch, len_k, dim_v]; grad_mask, when not null, [batch, len_q, len_k] (dz). tau and
// support_value are the forward's; weights, when not null, its P, read instead of recomputing
// the probabilities from tau.
template <typename T>
void sparse_attention_backward(const AttentionProblem<T>& p, double alpha,
                               const BatchedRows<T>& grad_output, const T* tau,
                               const T* support_value, const T* weights, T* grad_query,
                               T* grad_key, T* grad_value, T* grad_mask);

}  // namespace attnlab::cpu

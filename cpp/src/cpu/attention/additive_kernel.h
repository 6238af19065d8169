#pragma once
// Additive (Bahdanau) attention scores on the CPU, over raw contiguous pointers:
//   scores[b, q, k] = Σ_j weight[j] · tanh(query_proj[b, q, j] + key_proj[b, k, j])
// with query_proj [batch, len_q, hidden] and key_proj [batch, len_k, hidden]. Neither pass holds
// the [batch, len_q, len_k, hidden] tensor: tanh is recomputed where it is needed.

#include <cstdint>

namespace attnlab::cpu {

template <typename T>
void additive_scores_forward(const T* query_proj, const T* key_proj, const T* weight,
                             int64_t batch, int64_t len_q, int64_t len_k, int64_t hidden,
                             T* scores);

// Writes grad_query_proj, grad_key_proj (shaped as their inputs) and grad_weight [hidden].
template <typename T>
void additive_scores_backward(const T* grad_scores, const T* query_proj, const T* key_proj,
                              const T* weight, int64_t batch, int64_t len_q, int64_t len_k,
                              int64_t hidden, T* grad_query_proj, T* grad_key_proj,
                              T* grad_weight);

}  // namespace attnlab::cpu

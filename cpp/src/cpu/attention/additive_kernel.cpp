#include "cpu/attention/additive_kernel.h"

#include <algorithm>
#include <vector>

#include <ATen/Parallel.h>

#include "cpu/isa/isa.h"
#include "cpu/isa/vec_math.h"

namespace attnlab::cpu {
namespace {

// One query row against len_k keys: scores[k] = Σ_j w[j]·tanh(a[j] + c[k, j]).
template <typename T>
ATTNLAB_INLINE void score_row_impl(const T* a, const T* keys, const T* w, int64_t len_k,
                                   int64_t hidden, T* scores) {
  for (int64_t k = 0; k < len_k; ++k) {
    const T* c = keys + k * hidden;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < hidden; ++j) sum += w[j] * tanh_vectorizable(a[j] + c[j]);
    scores[k] = sum;
  }
}

// One query row's share of the gradients. With t = tanh(a + c_k) and u = g_k·w ⊙ (1 − t²):
// da += u, dc_k += u, dw += g_k·t.
template <typename T>
ATTNLAB_INLINE void grad_row_impl(const T* g, const T* a, const T* keys, const T* w,
                                  int64_t len_k, int64_t hidden, T* da, T* dkeys, T* dw) {
  for (int64_t k = 0; k < len_k; ++k) {
    const T gk = g[k];
    const T* c = keys + k * hidden;
    T* dc = dkeys + k * hidden;
#pragma omp simd
    for (int64_t j = 0; j < hidden; ++j) {
      const T t = tanh_vectorizable(a[j] + c[j]);
      const T u = gk * w[j] * (T(1) - t * t);
      da[j] += u;
      dc[j] += u;
      dw[j] += gk * t;
    }
  }
}

ATTNLAB_ISA_CLONES void score_row(const float* a, const float* keys, const float* w,
                                  int64_t len_k, int64_t hidden, float* scores) {
  score_row_impl(a, keys, w, len_k, hidden, scores);
}
ATTNLAB_ISA_CLONES void score_row(const double* a, const double* keys, const double* w,
                                  int64_t len_k, int64_t hidden, double* scores) {
  score_row_impl(a, keys, w, len_k, hidden, scores);
}
ATTNLAB_ISA_CLONES void grad_row(const float* g, const float* a, const float* keys,
                                 const float* w, int64_t len_k, int64_t hidden, float* da,
                                 float* dkeys, float* dw) {
  grad_row_impl(g, a, keys, w, len_k, hidden, da, dkeys, dw);
}
ATTNLAB_ISA_CLONES void grad_row(const double* g, const double* a, const double* keys,
                                 const double* w, int64_t len_k, int64_t hidden, double* da,
                                 double* dkeys, double* dw) {
  grad_row_impl(g, a, keys, w, len_k, hidden, da, dkeys, dw);
}

}  // namespace

template <typename T>
void additive_scores_forward(const T* query_proj, const T* key_proj, const T* weight,
                             int64_t batch, int64_t len_q, int64_t len_k, int64_t hidden,
                             T* scores) {
  at::parallel_for(0, batch * len_q, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / len_q;
      score_row(query_proj + row * hidden, key_proj + b * len_k * hidden, weight, len_k, hidden,
                scores + row * len_k);
    }
  });
}

template <typename T>
void additive_scores_backward(const T* grad_scores, const T* query_proj, const T* key_proj,
                              const T* weight, int64_t batch, int64_t len_q, int64_t len_k,
                              int64_t hidden, T* grad_query_proj, T* grad_key_proj,
                              T* grad_weight) {
  std::fill(grad_query_proj, grad_query_proj + batch * len_q * hidden, T(0));
  std::fill(grad_key_proj, grad_key_proj + batch * len_k * hidden, T(0));
  // A task owns whole batch entries (their key gradients); the weight's gradient is summed
  // from one partial per task.
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(batch, at::get_num_threads()));
  std::vector<T> weight_parts(tasks * hidden, T(0));
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      T* dw = weight_parts.data() + task * hidden;
      for (int64_t b = task * batch / tasks; b < (task + 1) * batch / tasks; ++b) {
        for (int64_t q = 0; q < len_q; ++q) {
          const int64_t row = b * len_q + q;
          grad_row(grad_scores + row * len_k, query_proj + row * hidden,
                   key_proj + b * len_k * hidden, weight, len_k, hidden,
                   grad_query_proj + row * hidden, grad_key_proj + b * len_k * hidden, dw);
        }
      }
    }
  });
  std::fill(grad_weight, grad_weight + hidden, T(0));
  for (int64_t task = 0; task < tasks; ++task) {
    for (int64_t j = 0; j < hidden; ++j) grad_weight[j] += weight_parts[task * hidden + j];
  }
}

template void additive_scores_forward<float>(const float*, const float*, const float*, int64_t,
                                             int64_t, int64_t, int64_t, float*);
template void additive_scores_forward<double>(const double*, const double*, const double*,
                                              int64_t, int64_t, int64_t, int64_t, double*);
template void additive_scores_backward<float>(const float*, const float*, const float*,
                                              const float*, int64_t, int64_t, int64_t, int64_t,
                                              float*, float*, float*);
template void additive_scores_backward<double>(const double*, const double*, const double*,
                                               const double*, int64_t, int64_t, int64_t,
                                               int64_t, double*, double*, double*);

}  // namespace attnlab::cpu

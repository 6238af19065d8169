// Additive (Bahdanau) scores on CUDA, float32 arithmetic for every storage type. No pass holds
// the [batch, len_q, len_k, hidden] tensor: tanh is recomputed where it is needed.

#include "cuda/device_common.cuh"

namespace attnlab::cuda {
namespace detail {
namespace {

// Forward tiles: a block scores kQueries queries (one per warp) against kKeys keys (one per
// lane), walking the hidden dimension in chunks of kChunk.
constexpr int kQueries = 8;
constexpr int kKeys = 32;
constexpr int kChunk = 32;

template <typename T>
__global__ void __launch_bounds__(kQueries * 32)
    additive_scores_forward_kernel(const T* query_proj, const T* key_proj, const T* weight,
                                   int64_t len_q, int64_t len_k, int64_t hidden, T* scores) {
  __shared__ float q_tile[kQueries][kChunk];
  __shared__ float k_tile[kKeys][kChunk + 1];  // read down a column by the lanes: padded
  __shared__ float w_tile[kChunk];

  const int64_t q_blocks = ceil_div(len_q, kQueries), k_blocks = ceil_div(len_k, kKeys);
  const int64_t b = blockIdx.x / (q_blocks * k_blocks);
  const int64_t q0 = blockIdx.x / k_blocks % q_blocks * kQueries;
  const int64_t k0 = blockIdx.x % k_blocks * kKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* qp = query_proj + b * len_q * hidden;
  const T* kp = key_proj + b * len_k * hidden;

  float sum = 0.f;
  for (int64_t h0 = 0; h0 < hidden; h0 += kChunk) {
    __syncthreads();  // the previous chunk is read
    for (int idx = threadIdx.x; idx < kQueries * kChunk; idx += blockDim.x) {
      const int r = idx / kChunk, c = idx % kChunk;
      q_tile[r][c] = q0 + r < len_q && h0 + c < hidden ? to_float(qp[(q0 + r) * hidden + h0 + c]) : 0.f;
    }
    for (int idx = threadIdx.x; idx < kKeys * kChunk; idx += blockDim.x) {
      const int r = idx / kChunk, c = idx % kChunk;
      k_tile[r][c] = k0 + r < len_k && h0 + c < hidden ? to_float(kp[(k0 + r) * hidden + h0 + c]) : 0.f;
    }
    // Past the hidden size the weight is 0, so padded columns add nothing.
    if (threadIdx.x < kChunk) {
      w_tile[threadIdx.x] = h0 + threadIdx.x < hidden ? to_float(weight[h0 + threadIdx.x]) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < kChunk; ++c) sum = fmaf(w_tile[c], tanhf(q_tile[warp][c] + k_tile[lane][c]), sum);
  }
  const int64_t q = q0 + warp, k = k0 + lane;
  if (q < len_q && k < len_k) scores[(b * len_q + q) * len_k + k] = from_float<T>(sum);
}

// One thread per (query row, hidden unit j): with t = tanh(a_j + c_kj) and
// u = g_k·w_j·(1 − t²), sums u over the keys into grad_query_proj and g_k·t into the row's
// share of grad_weight. Threads of a warp share the row, so g is a broadcast read.
template <typename T>
__global__ void additive_grad_query_kernel(const T* grad_scores, const T* query_proj,
                                           const T* key_proj, const T* weight, int64_t len_q,
                                           int64_t len_k, int64_t hidden, T* grad_query_proj,
                                           float* grad_weight_rows, int64_t rows) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * hidden) return;
  const int64_t row = idx / hidden, j = idx % hidden, b = row / len_q;
  const float a = to_float(query_proj[idx]), w = to_float(weight[j]);
  const T* g = grad_scores + row * len_k;
  const T* kp = key_proj + b * len_k * hidden + j;
  float da = 0.f, dw = 0.f;
  for (int64_t k = 0; k < len_k; ++k) {
    const float t = tanhf(a + to_float(kp[k * hidden]));
    const float gk = to_float(g[k]);
    da = fmaf(gk * w, 1.f - t * t, da);
    dw = fmaf(gk, t, dw);
  }
  grad_query_proj[idx] = from_float<T>(da);
  grad_weight_rows[idx] = dw;
}

// One thread per (key row, hidden unit j): sums u over the queries into grad_key_proj.
template <typename T>
__global__ void additive_grad_key_kernel(const T* grad_scores, const T* query_proj,
                                         const T* key_proj, const T* weight, int64_t len_q,
                                         int64_t len_k, int64_t hidden, T* grad_key_proj,
                                         int64_t rows) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * hidden) return;
  const int64_t row = idx / hidden, j = idx % hidden, b = row / len_k, k = row % len_k;
  const float c = to_float(key_proj[idx]), w = to_float(weight[j]);
  const T* g = grad_scores + b * len_q * len_k + k;
  const T* qp = query_proj + b * len_q * hidden + j;
  float dc = 0.f;
  for (int64_t q = 0; q < len_q; ++q) {
    const float t = tanhf(to_float(qp[q * hidden]) + c);
    dc = fmaf(to_float(g[q * len_k]) * w, 1.f - t * t, dc);
  }
  grad_key_proj[idx] = from_float<T>(dc);
}

constexpr int kElementwiseThreads = 256;

}  // namespace
}  // namespace detail

template <typename T>
void additive_scores_forward(const T* query_proj, const T* key_proj, const T* weight,
                             int64_t batch, int64_t len_q, int64_t len_k, int64_t hidden,
                             T* scores, cudaStream_t stream) {
  using namespace detail;
  launch(additive_scores_forward_kernel<T>,
         batch * ceil_div(len_q, kQueries) * ceil_div(len_k, kKeys), kQueries * 32, 0, stream,
         query_proj, key_proj, weight, len_q, len_k, hidden, scores);
}

template <typename T>
void additive_scores_backward(const T* grad_scores, const T* query_proj, const T* key_proj,
                              const T* weight, int64_t batch, int64_t len_q, int64_t len_k,
                              int64_t hidden, T* grad_query_proj, T* grad_key_proj,
                              float* grad_weight_rows, cudaStream_t stream) {
  using namespace detail;
  launch(additive_grad_query_kernel<T>, ceil_div(batch * len_q * hidden, kElementwiseThreads),
         kElementwiseThreads, 0, stream, grad_scores, query_proj, key_proj, weight, len_q, len_k,
         hidden, grad_query_proj, grad_weight_rows, batch * len_q);
  launch(additive_grad_key_kernel<T>, ceil_div(batch * len_k * hidden, kElementwiseThreads),
         kElementwiseThreads, 0, stream, grad_scores, query_proj, key_proj, weight, len_q, len_k,
         hidden, grad_key_proj, batch * len_k);
}

#define ATTNLAB_INSTANTIATE_ADDITIVE(T)                                                         \
  template void additive_scores_forward<T>(const T*, const T*, const T*, int64_t, int64_t,     \
                                           int64_t, int64_t, T*, cudaStream_t);               \
  template void additive_scores_backward<T>(const T*, const T*, const T*, const T*, int64_t,   \
                                            int64_t, int64_t, int64_t, T*, T*, float*,        \
                                            cudaStream_t);
ATTNLAB_INSTANTIATE_ADDITIVE(float)
ATTNLAB_INSTANTIATE_ADDITIVE(__half)
ATTNLAB_INSTANTIATE_ADDITIVE(__nv_bfloat16)

}  // namespace attnlab::cuda

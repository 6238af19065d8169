#pragma once
// Device helpers shared by the CUDA kernels: float conversions, warp reductions, operand views
// and the checked launch (checks in launch_checks.cpp).

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/launch_checks.h"
#include "cuda/sdpa_kernels.h"

namespace attnlab::cuda::detail {

constexpr unsigned kFullWarp = 0xffffffffu;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Every lane gets the result. fmaxf skips NaN unless all are NaN; the callers' exp(s − max)
// still turns a NaN score into a NaN output.
__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, offset));
  }
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullWarp, x, offset);
  return x;
}

__device__ __forceinline__ float dot(const float* a, const float* b, int n) {
  float sum = 0.f;
#pragma unroll 8
  for (int d = 0; d < n; ++d) sum = fmaf(a[d], b[d], sum);
  return sum;
}

// One batch entry of a MatrixOperand, read as float.
template <typename T>
struct MatrixView {
  const T* base;
  int64_t row_stride, col_stride;

  __device__ MatrixView(const MatrixOperand& op, const BatchShape& shape, int64_t b)
      : base(static_cast<const T*>(op.data) + batch_offset(shape, op.batch_stride, b)),
        row_stride(op.row_stride),
        col_stride(op.col_stride) {}

  __device__ float at(int64_t row, int64_t col) const {
    return to_float(base[row * row_stride + col * col_stride]);
  }
};

// Rows [row0, row0 + rows) of m, columns [0, width), into tile (leading dimension ld) as
// float. Rows at or past `len` and columns at or past `cols` become zeros, so that the tile can
// be read whole. Called by every thread of the block.
template <typename T>
__device__ void load_tile(float* tile, int ld, int rows, int width, const MatrixView<T>& m,
                          int64_t row0, int64_t len, int cols) {
  for (int idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
    const int r = idx / width, c = idx % width;
    const int64_t row = row0 + r;
    tile[r * ld + c] = row < len && c < cols ? m.at(row, c) : 0.f;
  }
}

// delta_i = Σ_c dO_ic·O_ic, one warp per query row (kDeltaRowsPerBlock rows per block): the
// flash backward's row term (launch_softmax_delta). The generic backward sums Σ_j P_ij·dP_ij
// instead (see sdpa_grad_query_kernel).
constexpr int kDeltaRowsPerBlock = 8;

template <typename T>
__global__ void softmax_delta_kernel(SdpaProblem p, MatrixOperand grad_output, const T* output,
                                     float* delta) {
  constexpr int kWarps = kDeltaRowsPerBlock;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.batch * p.len_q) return;
  const int64_t b = row / p.len_q, i = row % p.len_q;
  const MatrixView<T> dout(grad_output, p.shape, b);
  const T* out = output + row * p.dim_v;
  float sum = 0.f;
  for (int c = lane; c < p.dim_v; c += 32) sum = fmaf(dout.at(i, c), to_float(out[c]), sum);
  sum = warp_sum(sum);
  if (lane == 0) delta[row] = sum;
}

// Launches kernel<<<blocks, threads, smem_bytes, stream>>>, checking the launch. Nothing is
// launched for an empty problem.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int64_t blocks, int threads, size_t smem_bytes,
            cudaStream_t stream, Args&&... args) {
  if (blocks == 0) return;
  check_grid_size(blocks);
  if (smem_bytes > 48 * 1024) {  // beyond the default limit, opt in per kernel
    check_cuda_call(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem_bytes)));
  }
  kernel<<<static_cast<unsigned>(blocks), threads, smem_bytes, stream>>>(
      std::forward<Args>(args)...);
  check_kernel_launch();
}

// delta [batch, len_q] from grad_output and the forward's output (contiguous at the flattened
// batch).
template <typename T>
void launch_softmax_delta(const SdpaProblem& p, const MatrixOperand& grad_output,
                          const T* output, float* delta, cudaStream_t stream) {
  launch(softmax_delta_kernel<T>, ceil_div(p.batch * p.len_q, kDeltaRowsPerBlock),
         kDeltaRowsPerBlock * 32, 0, stream, p, grad_output, output, delta);
}

}  // namespace attnlab::cuda::detail

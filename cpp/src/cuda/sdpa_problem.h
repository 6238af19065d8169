#pragma once
// The problem the CUDA attention kernels solve, as plain C++ structs (no CUDA headers): the
// operator layer (cuda/ops.cpp) fills them, the kernels read them, and the host-compiled
// kernel tests (tests/cpp/cuda_emulation) build them too.

#include <cstdint>

#if defined(__CUDACC__)
#define ATTNLAB_HOST_DEVICE __host__ __device__
#else
#define ATTNLAB_HOST_DEVICE
#endif

namespace attnlab::cuda {

// Batch dimensions the kernels index directly (size-1 dimensions are dropped first); the
// operator layer flattens anything with more.
constexpr int kMaxBatchDims = 6;

// The batch shape that every operand is indexed by: batch entry b has the multi-index of b in
// row-major order over `sizes`.
struct BatchShape {
  int dims = 0;
  int64_t sizes[kMaxBatchDims] = {};
};

// One operand seen as a matrix per batch entry: element (b, row, col) is at
// data[Σ_d index_d(b)·batch_stride[d] + row·row_stride + col·col_stride]. Broadcast
// dimensions have stride 0.
struct MatrixOperand {
  const void* data = nullptr;
  int64_t batch_stride[kMaxBatchDims] = {};
  int64_t row_stride = 0, col_stride = 0;
};

struct SdpaProblem {
  int64_t batch = 0, len_q = 0, len_k = 0;
  int dim_qk = 0, dim_v = 0;
  BatchShape shape;
  MatrixOperand query, key, value;
  // [len_q, len_k] per batch entry; data == nullptr for none. Boolean (true = may attend) or
  // float32 (added to the scores).
  MatrixOperand mask;
  bool mask_is_bool = false;
  bool causal = false;  // query i sees keys j <= i
  float scale = 1;
};

// Element offset of batch entry b in an operand with the given batch strides.
ATTNLAB_HOST_DEVICE inline int64_t batch_offset(const BatchShape& shape, const int64_t* strides,
                                                int64_t b) {
  int64_t offset = 0;
  for (int d = shape.dims - 1; d >= 0; --d) {
    offset += (b % shape.sizes[d]) * strides[d];
    b /= shape.sizes[d];
  }
  return offset;
}

}  // namespace attnlab::cuda

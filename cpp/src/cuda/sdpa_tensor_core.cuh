#pragma once
// Tensor-core (WMMA, sm_80+) forward of scaled dot-product attention for float16/bfloat16 at
// head size 64 or 128, without a mask or weights (causal allowed): the common case of training
// and inference. Anything else goes to the generic kernels (sdpa_generic.cuh).
//
// A block of 4 warps owns 64 query rows (16 per warp) and walks 64-key tiles staged in shared
// memory. Per tile and warp: S = Q·Kᵀ on tensor cores into a float scratch, the online-softmax
// update by the lanes (lane l owns row l % 16, half l / 16 of its columns), P rounded to the
// input type, P·V on tensor cores into the scratch, added by the lanes to the output rows they
// hold in registers. WMMA hides its accumulator layout, hence the trips through shared memory.
//
// Instantiate with ATTNLAB_INSTANTIATE_SDPA_TENSOR_CORE(T, kHead).

#include <mma.h>

#include "cuda/device_common.cuh"

namespace attnlab::cuda::detail {

template <typename T, int kHead>
struct TensorCoreTiles {
  static_assert(kHead == 64 || kHead == 128, "tensor-core path: head size 64 or 128");
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockQ = 64;   // query rows per block, 16 per warp
  static constexpr int kBlockK = 64;   // keys per tile
  static_assert(kBlockQ == kBlockK, "Q, K and V tiles share one loader and one size");
  static constexpr int kFrag = 16;     // WMMA tile edge
  // Leading dimensions, padded against bank conflicts; WMMA wants multiples of 16 bytes and
  // 32-byte-aligned fragment pointers, which these keep.
  static constexpr int kTileLd = kHead + 8;                                  // T elements
  static constexpr int kProbLd = kBlockK + 8;                                // T elements
  static constexpr int kScratchLd = (kHead > kBlockK ? kHead : kBlockK) + 4;  // floats
  static constexpr int kOutPerLane = kHead / 2;

  static constexpr size_t kTileBytes = sizeof(T) * kBlockQ * kTileLd;  // Q, K and V alike
  static constexpr size_t kScratchBytes = sizeof(float) * kFrag * kScratchLd;
  static constexpr size_t kProbBytes = sizeof(T) * kFrag * kProbLd;
  static constexpr size_t kSharedBytes = 3 * kTileBytes + kWarps * (kScratchBytes + kProbBytes);

  // WMMA needs ldm a multiple of 16 bytes and fragment pointers on 32 bytes: every region and
  // every 16-row block of a tile starts on 32 bytes, and column offsets are multiples of 16
  // elements (32 bytes of T, 64 of float).
  static_assert(kTileLd % 8 == 0 && kProbLd % 8 == 0 && kScratchLd % 4 == 0);
  static_assert(kTileBytes % 32 == 0 && kScratchBytes % 32 == 0 && kProbBytes % 32 == 0);
  static_assert(sizeof(T) * kFrag * kTileLd % 32 == 0 && sizeof(T) * kFrag * kProbLd % 32 == 0);
  // 53 KiB at D = 64, 93 KiB at D = 128: above the default 48 KiB (launch() opts in), within
  // sm_80's 163 KiB.
  static_assert(kSharedBytes <= 163 * 1024);
};

// Rows [row0, row0 + 64) of a [len, kHead] matrix with unit column stride into tile, 16 bytes
// at a time; rows at or past len become zeros. The caller guarantees 16-byte alignment.
template <typename T, int kHead>
__device__ void load_rows_vectorized(T* tile, const T* base, int64_t row_stride, int64_t row0,
                                     int64_t len) {
  using Tiles = TensorCoreTiles<T, kHead>;
  constexpr int kVectors = kHead * sizeof(T) / sizeof(uint4);
  constexpr int kPerVector = sizeof(uint4) / sizeof(T);
  for (int idx = threadIdx.x; idx < Tiles::kBlockK * kVectors; idx += blockDim.x) {
    const int r = idx / kVectors, v = idx % kVectors;
    uint4 value = make_uint4(0, 0, 0, 0);  // all-zero bits: 0.0 in half and bfloat16
    if (row0 + r < len) {
      value = *reinterpret_cast<const uint4*>(base + (row0 + r) * row_stride + v * kPerVector);
    }
    *reinterpret_cast<uint4*>(tile + r * Tiles::kTileLd + v * kPerVector) = value;
  }
}

template <typename T, int kHead>
__global__ void __launch_bounds__(TensorCoreTiles<T, kHead>::kThreads)
    sdpa_forward_tensor_core_kernel(SdpaProblem p, T* output, float* logsumexp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // bfloat16 WMMA needs sm_80; ops.cpp launches this kernel only on sm_80 and later.
  __trap();
#else
  namespace wmma = nvcuda::wmma;
  using Tiles = TensorCoreTiles<T, kHead>;
  constexpr int F = Tiles::kFrag;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q_tile = reinterpret_cast<T*>(shared);
  T* k_tile = reinterpret_cast<T*>(shared + Tiles::kTileBytes);
  T* v_tile = reinterpret_cast<T*>(shared + 2 * Tiles::kTileBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scratch = reinterpret_cast<float*>(shared + 3 * Tiles::kTileBytes +
                                            warp * (Tiles::kScratchBytes + Tiles::kProbBytes));
  T* probs = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(scratch) + Tiles::kScratchBytes);

  const int64_t q_blocks = ceil_div(p.len_q, Tiles::kBlockQ);
  const int64_t b = blockIdx.x / q_blocks;
  const int64_t i0 = blockIdx.x % q_blocks * Tiles::kBlockQ;
  const T* query = static_cast<const T*>(p.query.data) + batch_offset(p.shape, p.query.batch_stride, b);
  const T* key = static_cast<const T*>(p.key.data) + batch_offset(p.shape, p.key.batch_stride, b);
  const T* value = static_cast<const T*>(p.value.data) + batch_offset(p.shape, p.value.batch_stride, b);

  load_rows_vectorized<T, kHead>(q_tile, query, p.query.row_stride, i0, p.len_q);

  // This lane's row of the warp's 16 and its half of the columns.
  const int row = lane % F, half = lane / F;
  const int64_t i = i0 + warp * F + row;
  float row_max = kNegInf, row_sum = 0.f, out[Tiles::kOutPerLane];
#pragma unroll
  for (int t = 0; t < Tiles::kOutPerLane; ++t) out[t] = 0.f;

  const int64_t keys =
      p.causal && i0 + Tiles::kBlockQ < p.len_k ? i0 + Tiles::kBlockQ : p.len_k;
  for (int64_t j0 = 0; j0 < keys; j0 += Tiles::kBlockK) {
    __syncthreads();  // the previous tiles are read (and, the first time, q_tile is written)
    load_rows_vectorized<T, kHead>(k_tile, key, p.key.row_stride, j0, p.len_k);
    load_rows_vectorized<T, kHead>(v_tile, value, p.value.row_stride, j0, p.len_k);
    __syncthreads();

    // S = Q_w·Kᵀ, 16 × 64, into scratch. Kᵀ is K read column-major.
#pragma unroll
    for (int n = 0; n < Tiles::kBlockK / F; ++n) {
      wmma::fragment<wmma::accumulator, F, F, F, float> s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int kk = 0; kk < kHead / F; ++kk) {
        wmma::fragment<wmma::matrix_a, F, F, F, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, F, F, F, T, wmma::col_major> bt;
        wmma::load_matrix_sync(a, q_tile + warp * F * Tiles::kTileLd + kk * F, Tiles::kTileLd);
        wmma::load_matrix_sync(bt, k_tile + n * F * Tiles::kTileLd + kk * F, Tiles::kTileLd);
        wmma::mma_sync(s, a, bt, s);
      }
      wmma::store_matrix_sync(scratch + n * F, s, Tiles::kScratchLd, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on this lane's 32 columns; the other half of the row is lane ^ 16.
    constexpr int kColsPerLane = Tiles::kBlockK / 2;
    float s[kColsPerLane];
    float tile_max = kNegInf;
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) {
      const int col = half * kColsPerLane + c;
      const int64_t j = j0 + col;
      const bool visible = i < p.len_q && j < p.len_k && !(p.causal && j > i);
      s[c] = visible ? scratch[row * Tiles::kScratchLd + col] * p.scale : kNegInf;
      tile_max = fmaxf(tile_max, s[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, F));
    const float new_max = fmaxf(row_max, tile_max);
    float tile_sum = 0.f;
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) {
      const float prob = s[c] == kNegInf ? 0.f : __expf(s[c] - new_max);
      tile_sum += prob;
      probs[row * Tiles::kProbLd + half * kColsPerLane + c] = from_float<T>(prob);
    }
    tile_sum += __shfl_xor_sync(kFullWarp, tile_sum, F);
    const float correction = row_max == kNegInf ? 0.f : __expf(row_max - new_max);
    row_sum = row_sum * correction + tile_sum;
    row_max = new_max;
#pragma unroll
    for (int t = 0; t < Tiles::kOutPerLane; ++t) out[t] *= correction;
    __syncwarp();  // scratch (S) is read and probs written before P·V reuses scratch

    // P·V, 16 × kHead, into scratch; the lanes add their part to the output rows.
#pragma unroll
    for (int n = 0; n < kHead / F; ++n) {
      wmma::fragment<wmma::accumulator, F, F, F, float> pv;
      wmma::fill_fragment(pv, 0.f);
#pragma unroll
      for (int kk = 0; kk < Tiles::kBlockK / F; ++kk) {
        wmma::fragment<wmma::matrix_a, F, F, F, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, F, F, F, T, wmma::row_major> v;
        wmma::load_matrix_sync(a, probs + kk * F, Tiles::kProbLd);
        wmma::load_matrix_sync(v, v_tile + kk * F * Tiles::kTileLd + n * F, Tiles::kTileLd);
        wmma::mma_sync(pv, a, v, pv);
      }
      wmma::store_matrix_sync(scratch + n * F, pv, Tiles::kScratchLd, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < Tiles::kOutPerLane; ++t) {
      out[t] += scratch[row * Tiles::kScratchLd + half * Tiles::kOutPerLane + t];
    }
    __syncwarp();  // scratch is read before the next tile's S overwrites it
  }

  if (i >= p.len_q) return;
  const bool none_visible = row_sum == 0.f;
  const float inv_sum = none_visible ? 0.f : 1.f / row_sum;
  T* out_row = output + (b * p.len_q + i) * kHead + half * Tiles::kOutPerLane;
#pragma unroll
  for (int t = 0; t < Tiles::kOutPerLane; ++t) out_row[t] = from_float<T>(out[t] * inv_sum);
  if (half == 0) {
    logsumexp[b * p.len_q + i] = none_visible ? kNegInf : row_max + logf(row_sum);
  }
#endif
}

}  // namespace attnlab::cuda::detail

namespace attnlab::cuda {

template <typename T, int kHead>
void sdpa_forward_tensor_core(const SdpaProblem& p, T* output, float* logsumexp,
                              cudaStream_t stream) {
  using Tiles = detail::TensorCoreTiles<T, kHead>;
  detail::launch(detail::sdpa_forward_tensor_core_kernel<T, kHead>,
                 p.batch * detail::ceil_div(p.len_q, Tiles::kBlockQ), Tiles::kThreads,
                 Tiles::kSharedBytes, stream, p, output, logsumexp);
}

}  // namespace attnlab::cuda

#define ATTNLAB_INSTANTIATE_SDPA_TENSOR_CORE(T, kHead)                                      \
  namespace attnlab::cuda {                                                                  \
  template void sdpa_forward_tensor_core<T, kHead>(const SdpaProblem&, T*, float*,           \
                                                   cudaStream_t);                            \
  }

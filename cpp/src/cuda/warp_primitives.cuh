#pragma once
// The warp-level instructions the tensor-core attention kernels (sdpa_flash.cuh) are written
// in, each behind a small function: tensor-core products (mma.sync), matrix loads from shared
// memory (ldmatrix), asynchronous copies into shared memory (cp.async), lane exchanges, atomic
// float additions and the block barrier.
//
// The kernels use nothing else that only a GPU has, so they also compile as host C++ against
// an emulator (tests/cpp/cuda_emulation), which defines ATTNLAB_WARP_EMULATION and these same
// functions on the CPU: the kernels' indexing, pipelining and softmax logic is tested by CI,
// which has no GPU. The contract below is what both sides implement.
//
// Register layouts (PTX ISA, "Matrix fragments for mma.m16n8k16", 16-bit A/B, float32 C/D).
// With g = lane / 4 and t = lane % 4, each uint32_t holds two 16-bit values, the lower column
// (or row) in the low half:
//   A (16 × 16, row major):  a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//                            a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B (16 × 8, "col"):       b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   C, D (16 × 8, float):    d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// ldmatrix .x4: lanes 8m .. 8m+7 give the addresses of rows 0..7 of matrix m (8 × 8 of 16-bit
// values, each row 16 contiguous bytes, 16-byte aligned in shared memory); register r[m] of
// lane l receives row l / 4, columns 2(l % 4) and 2(l % 4) + 1 of matrix m; with .trans it
// receives column l / 4, rows 2(l % 4) and 2(l % 4) + 1 instead.

#include <cstdint>

#if defined(ATTNLAB_WARP_EMULATION)
// The emulator (included before this header) provides everything below.
#else

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define ATTNLAB_DEVICE __device__ __forceinline__
// A kernel entry point with at most `threads` threads per block.
#define ATTNLAB_KERNEL(threads) __global__ void __launch_bounds__(threads)
// The block's dynamic shared memory, as `unsigned char name[]`, 128-byte aligned.
#define ATTNLAB_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]

namespace attnlab::cuda::detail {

ATTNLAB_DEVICE int thread_index() { return static_cast<int>(threadIdx.x); }
ATTNLAB_DEVICE int64_t block_index() { return static_cast<int64_t>(blockIdx.x); }

// __syncthreads().
ATTNLAB_DEVICE void block_sync() { __syncthreads(); }

// x of the lane whose index is this lane's XOR lane_mask (all 32 lanes take part).
ATTNLAB_DEVICE float shfl_xor(float x, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, x, lane_mask);
}

// 2^x, approximate (ex2.approx.ftz: about 2 ulp; 2^−inf = +0).
ATTNLAB_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to T (to nearest even) and packed: lo in the low 16 bits.
template <typename T>
ATTNLAB_DEVICE uint32_t pack_rn(float lo, float hi);
template <>
ATTNLAB_DEVICE uint32_t pack_rn<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
ATTNLAB_DEVICE uint32_t pack_rn<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// d += A·B on tensor cores, A and B of type T (float16 or bfloat16), float32 accumulation; the
// fragments as in the layout above. A warp-wide instruction: all 32 lanes call it together.
template <typename T>
ATTNLAB_DEVICE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
ATTNLAB_DEVICE void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
ATTNLAB_DEVICE void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

ATTNLAB_DEVICE uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 × 8 matrices of 16-bit values from shared memory (layout above); row_address is this
// lane's row. Warp-wide.
ATTNLAB_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}

// The same, each matrix transposed on the way.
ATTNLAB_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}

// *address += value, atomically (atomicAdd).
ATTNLAB_DEVICE void atomic_add(float* address, float value) { atomicAdd(address, value); }

// Starts copying 16 bytes from global to shared memory (both 16-byte aligned); with valid ==
// false, writes 16 zero bytes and reads nothing. The copy lands at the latest when this
// thread's cp_async_wait lets its group through; other threads see it after a block_sync that
// follows that wait.
ATTNLAB_DEVICE void cp_async_16(void* shared, const void* global, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :
               : "r"(shared_address(shared)), "l"(global), "r"(bytes)
               : "memory");
}

// Closes this thread's current group of copies (an empty group is allowed).
ATTNLAB_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most `pending` of this thread's committed groups are unfinished (the newest).
template <int pending>
ATTNLAB_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
}

}  // namespace attnlab::cuda::detail

#endif  // ATTNLAB_WARP_EMULATION

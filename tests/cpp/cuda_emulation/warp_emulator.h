#pragma once
// A CPU emulator of the warp-level primitives of cpp/src/cuda/warp_primitives.cuh, so that
// kernels written only in those primitives compile as host C++ and run in CI without a GPU.
//
// Include this header before the kernel (it defines ATTNLAB_WARP_EMULATION, which makes
// warp_primitives.cuh skip its device part) and run the kernel with emulation::launch:
//
//   #include "cuda_emulation/warp_emulator.h"
//   #include "cuda/sdpa_flash.cuh"
//   namespace emu = attnlab::cuda::emulation;
//   emu::launch(blocks, 128, shared_bytes, [&] { my_kernel<emu::half>(args...); });
//
// Execution model. Every emulated CUDA thread of a block is its own fiber (its own stack, all
// fibers run by the thread that called launch), and exactly one of them runs at a time:
// the running thread goes on until it reaches a collective (a warp-wide mma_m16n8k16,
// ldmatrix_x4[_trans] or shfl_xor, or the block-wide block_sync) or returns, then switches to
// the next runnable thread in index order (or as LaunchOptions::schedule says), a user-space
// switch of well under a microsecond (annotated for AddressSanitizer, which then checks the
// fibers' stacks too). The run is therefore deterministic. Each fiber has a fixed stack
// (128 KiB, 512 KiB under ASan, a guard page below it): keep large arrays out of kernels'
// frames. A collective completes when all 32 lanes of the
// warp (all threads of the block for block_sync) have arrived; the lane that arrives last
// computes every lane's result and goes on running. The blocks run one after another, reusing
// the same fibers and shared buffer.
//
// Whatever a real GPU would hang on or do undefined things with aborts the process with a
// message on stderr (GoogleTest death tests can check it): a thread that returns while others
// wait at block_sync, lanes of one warp waiting at different collectives (divergence), a lane
// that returns while others of its warp wait, misaligned or out-of-range ldmatrix / cp.async
// addresses, a primitive called outside emulation::launch, an exception escaping the kernel.
//
// Memory semantics that expose pipelining mistakes:
//   - The block's shared memory is filled with 0xFF bytes at the start of each block
//     (uninitialised shared memory reads as NaN in float, float16 and bfloat16).
//   - cp_async_16 fills its 16 destination bytes with 0xFF at once and queues the copy on the
//     issuing thread; cp_async_commit closes the thread's current group; cp_async_wait<N> lands
//     (performs) the copies of every committed group but the N newest. The source is read when
//     the copy lands, not when it is issued. Copies never committed, or still pending when the
//     thread returns, never land. With valid == false the copy lands 16 zero bytes and never
//     reads the source.
//
// Arithmetic:
//   - mma_m16n8k16: the 16 products of each output (exact: a product of two float16 or two
//     bfloat16 values fits a float exactly, bfloat16 overflow aside) are summed with the
//     accumulator in double and the sum is rounded once to float. Real tensor cores sum with
//     less care (truncation, no single rounding); tests of kernels should allow for that.
//   - fast_exp2 is std::exp2 in float (correctly rounded or nearly; the device one is ex2.approx,
//     about 2 ulp, flushing subnormals). fast_exp2(-inf) = +0.
//   - pack_rn rounds to nearest even, as __floats2half2_rn / __floats2bfloat162_rn.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

#if defined(ATTNLAB_DEVICE) && !defined(ATTNLAB_WARP_EMULATION)
#error "include cuda_emulation/warp_emulator.h before cuda/warp_primitives.cuh (and the kernels)"
#endif
#define ATTNLAB_WARP_EMULATION 1

// Device helper functions of a kernel: ordinary inline host functions here.
#define ATTNLAB_DEVICE inline
// A kernel entry point: an ordinary (inline) host function run once per emulated thread.
#define ATTNLAB_KERNEL(threads) inline void
// The current block's shared memory (emulation::launch's shared_bytes, 128-byte aligned).
// Use it inside the kernel's body, as on the device.
#define ATTNLAB_DYNAMIC_SHARED(name) \
  unsigned char* const name = ::attnlab::cuda::emulation::shared_memory()

namespace attnlab::cuda::emulation {

// The two 16-bit floating-point formats of the kernels, as storage types: convert to float to
// compute. Conversions from float round to nearest even.
//   kHalf: IEEE 754 binary16 (what __half and torch.float16 hold), with overflow to ±inf,
//     subnormals and NaN (quiet, payload kept where it fits) handled.
//   kBfloat16: the upper half of a float32 (what __nv_bfloat16 and torch.bfloat16 hold); NaN
//     stays a (quiet) NaN.
enum class Format16 { kHalf, kBfloat16 };

template <Format16 kFormat>
struct Float16 {
  uint16_t bits;

  Float16() = default;
  explicit Float16(float x) : bits(from_float(x)) {}
  explicit operator float() const { return to_float(bits); }
  // The value with these 16 bits.
  static Float16 from_bits(uint16_t b) {
    Float16 h;
    h.bits = b;
    return h;
  }
  // The bits of x rounded to this type (to nearest even).
  static uint16_t from_float(float x);
  // The value of these bits, exactly, as a float.
  static float to_float(uint16_t b);
};

using half = Float16<Format16::kHalf>;
using bfloat16 = Float16<Format16::kBfloat16>;

template <> uint16_t half::from_float(float x);
template <> float half::to_float(uint16_t b);
template <> uint16_t bfloat16::from_float(float x);
template <> float bfloat16::to_float(uint16_t b);

// Same size and bits as __half / __nv_bfloat16 / c10::Half / c10::BFloat16: buffers of those
// can be reinterpreted as these.
static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_copyable_v<bfloat16>);

// Which runnable thread gets the baton when the running one stops (every schedule is
// deterministic; the lane that completes a collective always goes on running). Running a kernel
// under several schedules varies how far warps get ahead of one another, which is what exposes
// a missing block_sync (e.g. a cp.async prefetch overwriting a buffer that a slower warp still
// reads: it reads the 0xFF fill, NaN).
enum class Schedule {
  kRoundRobin,    // the next runnable thread after the current one, in index order (default)
  kLowestFirst,   // the runnable thread of lowest index: warp 0 runs ahead to each block_sync
  kHighestFirst,  // the runnable thread of highest index: the last warp runs ahead
  kRandom,        // a runnable thread drawn at random, from `seed`
};

struct LaunchOptions {
  Schedule schedule = Schedule::kRoundRobin;
  uint64_t seed = 0;  // for Schedule::kRandom
};

// Runs `body` once per emulated thread of each of `blocks` blocks of `threads_per_block`
// threads (a multiple of 32, at most 1024), blocks in order 0, 1, ...; inside it,
// detail::thread_index() and detail::block_index() give that thread's indices and
// ATTNLAB_DYNAMIC_SHARED the block's `shared_bytes` bytes of shared memory. Returns when all
// blocks are done. Throws std::invalid_argument for bad arguments (blocks < 0, bad
// threads_per_block, a launch from inside a launch); blocks == 0 runs nothing.
void launch_function(int64_t blocks, int threads_per_block, size_t shared_bytes,
                     const std::function<void()>& body, LaunchOptions options = {});

template <typename F>
void launch(int64_t blocks, int threads_per_block, size_t shared_bytes, F&& body,
            LaunchOptions options = {}) {
  // body is called in place (never copied): move-only callables work too.
  launch_function(blocks, threads_per_block, shared_bytes, [&body] { body(); }, options);
}

// The running block's shared buffer (aborts outside a launch).
unsigned char* shared_memory();
// Its size in bytes, as passed to launch.
size_t shared_memory_bytes();

namespace detail {
void cp_async_wait_groups(int pending);
}  // namespace detail

}  // namespace attnlab::cuda::emulation

// The primitives of warp_primitives.cuh, same names, signatures and semantics.
namespace attnlab::cuda::detail {

int thread_index();
int64_t block_index();

// All threads of the block arrive before any goes on.
void block_sync();

// x of lane (this lane XOR lane_mask); 0 <= lane_mask < 32; warp-wide.
float shfl_xor(float x, int lane_mask);

// 2^x in float (std::exp2); 2^-inf = +0.
inline float fast_exp2(float x) { return std::exp2(x); }

// Two floats rounded to T (to nearest even) and packed, lo in the low 16 bits.
template <typename T>
uint32_t pack_rn(float lo, float hi);
template <>
uint32_t pack_rn<emulation::half>(float lo, float hi);
template <>
uint32_t pack_rn<emulation::bfloat16>(float lo, float hi);

// d += A·B (16 × 16 times 16 × 8), fragments as in warp_primitives.cuh; warp-wide.
template <typename T>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
void mma_m16n8k16<emulation::half>(float (&d)[4], const uint32_t (&a)[4],
                                   const uint32_t (&b)[2]);
template <>
void mma_m16n8k16<emulation::bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]);

// Four 8 × 8 matrices of 16-bit values from shared memory; this lane gives the address of row
// lane % 8 of matrix lane / 8 (16-byte aligned, inside the block's shared buffer); warp-wide.
void ldmatrix_x4(uint32_t (&r)[4], const void* row_address);
// The same, each matrix transposed.
void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_address);

// *address += value. Atomic as it stands, since one emulated thread runs at a time.
inline void atomic_add(float* address, float value) { *address += value; }

// Queues a 16-byte copy global → shared (see the memory semantics above).
void cp_async_16(void* shared, const void* global, bool valid);
// Closes this thread's current group of copies.
void cp_async_commit();
// Lands the copies of all this thread's committed groups but the `pending` newest.
template <int pending>
void cp_async_wait() {
  static_assert(pending >= 0, "cp_async_wait: pending must be >= 0");
  emulation::detail::cp_async_wait_groups(pending);
}

}  // namespace attnlab::cuda::detail

// The contract itself (with ATTNLAB_WARP_EMULATION defined it adds nothing but <cstdint>).
#include "cuda/warp_primitives.cuh"

#pragma once
// Tensor-core forward and backward of scaled dot-product attention in the manner of
// FlashAttention-2, for float16 and bfloat16 at head size 64 or 128, without a mask (causal
// allowed): the common case of training and inference. Anything else goes to the generic
// kernels. The forward is described here, the backward further down.
//
// A block of 4 warps owns 64 query rows, 16 per warp (or 128, 32 per warp: kRowsPerWarp), and
// walks the keys in tiles of 64:
//   - Q, K and V tiles are copied into shared memory asynchronously (cp.async), K and V into
//     two buffers each, so that the next tile's copy overlaps this tile's arithmetic. Rows are
//     stored with their 16-byte chunks permuted (chunk ^ row % 8): the 8 rows one ldmatrix
//     reads then fall on 8 different groups of banks.
//   - Each warp keeps its Q rows as mma fragments in registers (loaded once; with 32 rows per
//     warp they are reloaded from shared memory instead), computes its 16 × 64 scores (per 16
//     rows) S = Q·Kᵀ with mma.sync (K fragments by ldmatrix), updates the running
//     maxima and sums (in base 2: scores are scaled by scale·log2(e)), and multiplies P by V
//     with P taken straight from the score registers (an m16n8 accumulator pair has the layout
//     of an m16k16 operand) and V by ldmatrix.trans.
//   - At the end the rows are divided by their sums, staged in shared memory and written with
//     16-byte stores; the log-sum-exp (natural log) goes out in float32.
//   - With weights, a second pass over the same key tiles computes the scores again and
//     writes exp(s − max) / sum from them, the rows' final max and sum known (see the kernel).
// The grid runs the last query blocks first: under the causal mask they see the most keys.
//
// Written only in the functions of warp_primitives.cuh, so it also compiles as host C++ against
// the emulator in tests/cpp/cuda_emulation, where CI tests it (tests/cpp/test_flash_emulated.cpp).
// The compiler's report (nvcc -Xptxas -v, sm_90, nvcc 13.0): forward 16 rows per warp, D = 64:
// 195 registers, no spill; D = 128: 255 registers, 40 bytes spilled; 32 rows per warp spills
// 44 (D = 64) and 520 bytes (D = 128); backward: 254 registers and no spill at D = 64; at
// D = 128 its dK, dV, Sᵀ and dPᵀ for 64 queries alone took 192 registers per thread and 436
// bytes spilled (computing Sᵀ and dPᵀ one after the other spilled more, 568 bytes), so there
// it takes each tile's queries in two halves of 32: 255 registers, 32 bytes spilled (with the
// halves unrolled, K and V fragments stayed live across them: 508 bytes).
//
// Instantiate with ATTNLAB_INSTANTIATE_SDPA_FLASH(T, kHead).

#include <cmath>
#include <cstdint>

#include "cuda/sdpa_problem.h"
#include "cuda/warp_primitives.cuh"

namespace attnlab::cuda::detail {

// The 64-row geometry shared by the forward's K and V tiles and all of the backward's tiles.
template <int kHead>
struct FlashTiles {
  static_assert(kHead == 64 || kHead == 128, "flash kernels: head size 64 or 128");
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 64;           // keys per tile
  static constexpr int kChunks = kHead / 8;    // 16-byte chunks per row of 16-bit values
  static constexpr int kTileBytes = 64 * kHead * 2;  // a 64-row tile
  static constexpr int kKSteps = kHead / 16;   // k-steps over the head dimension
  static constexpr int kSTiles = kBlockN / 8;  // 8-column tiles of a 64-column score block
  static constexpr int kOTiles = kHead / 8;    // 8-column tiles of a head-wide block
};

// The forward's: each warp owns kRowsPerWarp query rows (16: its Q fragments stay in
// registers; 32: twice the products per K and V fragment loaded, Q fragments reloaded from
// shared memory at each k-step, as FlashAttention-2 does), so a block owns 4·kRowsPerWarp rows.
// kBlockWarps warps (4, or 8 with 16 rows each: 128 query rows per block, so that each K and V
// tile copied serves twice the rows without the register spills of 32 rows per warp; what the
// first GPU profile pointed to at D = 128, not yet run on a GPU).
template <int kHead, int kRowsPerWarp, int kBlockWarps = 4>
struct FlashForwardTiles : FlashTiles<kHead> {
  static_assert(kRowsPerWarp == 16 || kRowsPerWarp == 32, "16 or 32 rows per warp");
  static_assert(kBlockWarps == 4 || (kBlockWarps == 8 && kRowsPerWarp == 16),
                "4 warps, or 8 of 16 rows");
  static constexpr int kWarps = kBlockWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // 16-row fragments per warp
  static constexpr int kBlockM = kWarps * kRowsPerWarp;  // query rows per block
  static constexpr int kQTileBytes = kBlockM * kHead * 2;
  // Q (reused to stage the output), then two K and two V buffers: at D = 64 40 KiB (16 rows per
  // warp) or 48 KiB (32), at D = 128 80 or 96 KiB (above the default 48 KiB: the launcher opts
  // in).
  static constexpr int kSharedBytes = kQTileBytes + 4 * FlashTiles<kHead>::kTileBytes;
};

constexpr float kFlashNegInf = -__builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows hold kHead 16-bit
// values, with the chunks of row r permuted by XOR (r % 8).
template <int kHead>
ATTNLAB_DEVICE int swizzled(int row, int chunk) {
  return row * (kHead * 2) + ((chunk ^ (row & 7)) << 4);
}

struct alignas(16) Chunk16 {
  uint32_t words[4];
};

// Starts copying rows [row0, row0 + kRows) of a [len, kHead] matrix (unit column stride,
// 16-byte aligned rows) into a swizzled tile; rows at or past len become zeros. All kThreads
// threads of the block call it.
template <typename T, int kHead, int kRows = 64, int kThreads = FlashTiles<kHead>::kThreads>
ATTNLAB_DEVICE void copy_tile_async(unsigned char* tile, const T* base, int64_t row_stride,
                                    int64_t row0, int64_t len) {
  using Tiles = FlashTiles<kHead>;
  static_assert(kRows * Tiles::kChunks % kThreads == 0);
#pragma unroll
  for (int i = 0; i < kRows * Tiles::kChunks / kThreads; ++i) {
    const int idx = thread_index() + i * kThreads;
    const int r = idx / Tiles::kChunks, c = idx % Tiles::kChunks;
    const bool valid = row0 + r < len;
    const T* source = valid ? base + (row0 + r) * row_stride + c * 8 : base;
    cp_async_16(tile + swizzled<kHead>(r, c), source, valid);
  }
}

// ---- fragments of swizzled tiles (kCols 16-bit columns per row) ----------------------------

// The A operand of one k-step: rows row0 .. row0 + 15, columns 16·ks .. 16·ks + 15.
template <int kCols>
ATTNLAB_DEVICE void load_a(uint32_t (&a)[4], const unsigned char* tile, int row0, int ks,
                           int lane) {
  ldmatrix_x4(a, tile + swizzled<kCols>(row0 + lane % 16, ks * 2 + lane / 16));
}

// The A operand of one k-step read from its transpose: the tile holds Aᵀ, k along the rows
// (16·kk ..) and A's rows along the columns (row0 ..).
template <int kCols>
ATTNLAB_DEVICE void load_a_transposed(uint32_t (&a)[4], const unsigned char* tile, int kk,
                                      int row0, int lane) {
  ldmatrix_x4_trans(a, tile + swizzled<kCols>(kk * 16 + lane % 8 + (lane / 16) * 8,
                                              row0 / 8 + (lane / 8) % 2));
}

// The B operands of two adjacent 8-column tiles (registers 0, 1 and 2, 3) whose columns are the
// tile's rows row0 .. row0 + 15, k = columns 16·ks ..: the "K" of S = Q·Kᵀ.
template <int kCols>
ATTNLAB_DEVICE void load_b_of_rows(uint32_t (&b)[4], const unsigned char* tile, int row0,
                                   int ks, int lane) {
  ldmatrix_x4(b, tile + swizzled<kCols>(row0 + lane % 8 + (lane / 16) * 8, ks * 2 + (lane / 8) % 2));
}

// The B operands of two adjacent 8-column tiles (columns 16·np ..) with k down the tile's rows
// 16·kk ..: the "V" of O = P·V.
template <int kCols>
ATTNLAB_DEVICE void load_b_of_columns(uint32_t (&b)[4], const unsigned char* tile, int kk,
                                      int np, int lane) {
  ldmatrix_x4_trans(b, tile + swizzled<kCols>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                              np * 2 + lane / 16));
}

// acc0 += A·B₀ and acc1 += A·B₁ for the two tiles of a load_b_of_*.
template <typename T>
ATTNLAB_DEVICE void mma_pair(float (&acc0)[4], float (&acc1)[4], const uint32_t (&a)[4],
                             const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_m16n8k16<T>(acc0, a, b0);
  mma_m16n8k16<T>(acc1, a, b1);
}

// The accumulators of two adjacent 16 × 8 tiles as the A operand of a k-step (rounded to T).
template <typename T>
ATTNLAB_DEVICE void accumulators_as_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_rn<T>(lo[0], lo[1]);
  a[1] = pack_rn<T>(lo[2], lo[3]);
  a[2] = pack_rn<T>(hi[0], hi[1]);
  a[3] = pack_rn<T>(hi[2], hi[3]);
}

// Two packed 16-bit values into a swizzled tile at (row, col), col even.
template <int kCols>
ATTNLAB_DEVICE void store_pair(unsigned char* tile, int row, int col, uint32_t pair) {
  *reinterpret_cast<uint32_t*>(tile + swizzled<kCols>(row, col / 8) + (col % 8) * 2) = pair;
}

// S = Q·Kᵀ of a warp's kMT fragments of 16 query rows (from row0) against a 64-key tile: per
// fragment, 8 tiles of 16 × 8, two per ldmatrix of K. Q's fragments come from q_registers
// (kQInRegisters: one fragment, loaded once) or from the swizzled Q tile at every k-step.
template <typename T, int kHead, int kMT, bool kQInRegisters>
ATTNLAB_DEVICE void score_tile(
    float (&s)[kMT][FlashTiles<kHead>::kSTiles][4],
    const uint32_t (&q_registers)[kQInRegisters ? FlashTiles<kHead>::kKSteps : 1][4],
    const unsigned char* q_tile, const unsigned char* k_tile, int row0, int lane) {
  using Tiles = FlashTiles<kHead>;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < Tiles::kSTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][n][e] = 0.f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < Tiles::kKSteps; ++ks) {
    uint32_t qa[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      if constexpr (kQInRegisters) {
#pragma unroll
        for (int r = 0; r < 4; ++r) qa[mt][r] = q_registers[ks][r];
      } else {
        load_a<kHead>(qa[mt], q_tile, row0 + mt * 16, ks, lane);
      }
    }
#pragma unroll
    for (int np = 0; np < Tiles::kSTiles / 2; ++np) {
      uint32_t kb[4];
      load_b_of_rows<kHead>(kb, k_tile, np * 16, ks, lane);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) mma_pair<T>(s[mt][2 * np], s[mt][2 * np + 1], qa[mt], kb);
    }
  }
}

// kWeights: also writes the weights (non-null), in a kernel of its own: the pass compiled into
// the one without weights changed its register allocation (ptxas, sm_90: 44 → 80 bytes spilled
// at D = 64 with 32 rows per warp, the default there).
template <typename T, int kHead, int kRowsPerWarp, bool kWeights = false, int kBlockWarps = 4>
ATTNLAB_KERNEL((FlashForwardTiles<kHead, kRowsPerWarp, kBlockWarps>::kThreads))
sdpa_flash_forward_kernel(SdpaProblem p, T* output, float* logsumexp, T* weights) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // mma.sync m16n8k16 and cp.async need sm_80; ops.cpp launches this kernel only there.
  __trap();
#else
  using Tiles = FlashForwardTiles<kHead, kRowsPerWarp, kBlockWarps>;
  constexpr int kBlockM = Tiles::kBlockM, kBlockN = Tiles::kBlockN, kMT = Tiles::kMTiles;
  constexpr int kThreads = Tiles::kThreads;
  constexpr bool kQInRegisters = kMT == 1;
  ATTNLAB_DYNAMIC_SHARED(shared);
  unsigned char* const q_tile = shared;
  unsigned char* const k_tiles = shared + Tiles::kQTileBytes;
  unsigned char* const v_tiles = k_tiles + 2 * Tiles::kTileBytes;

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair
  const int64_t q_blocks = (p.len_q + kBlockM - 1) / kBlockM;
  const int64_t b = block_index() % p.batch;
  const int64_t i0 = (q_blocks - 1 - block_index() / p.batch) * kBlockM;
  const T* query =
      static_cast<const T*>(p.query.data) + batch_offset(p.shape, p.query.batch_stride, b);
  const T* key = static_cast<const T*>(p.key.data) + batch_offset(p.shape, p.key.batch_stride, b);
  const T* value =
      static_cast<const T*>(p.value.data) + batch_offset(p.shape, p.value.batch_stride, b);
  const int64_t keys = p.causal && i0 + kBlockM < p.len_k ? i0 + kBlockM : p.len_k;
  const int64_t n_tiles = (keys + kBlockN - 1) / kBlockN;

  // Copy groups, in order: (Q, K_0), V_0, then per tile K_{j+1} and V_{j+1} (empty at the end).
  copy_tile_async<T, kHead, kBlockM, kThreads>(q_tile, query, p.query.row_stride, i0, p.len_q);
  if (n_tiles > 0) {
    copy_tile_async<T, kHead, 64, kThreads>(k_tiles, key, p.key.row_stride, 0, p.len_k);
  }
  cp_async_commit();
  if (n_tiles > 0) {
    copy_tile_async<T, kHead, 64, kThreads>(v_tiles, value, p.value.row_stride, 0, p.len_k);
  }
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  // This warp's first row in the block; fragment mt's rows are row0 + 16·mt + g (+ 8).
  const int row0 = warp * kRowsPerWarp;
  float o[kMT][Tiles::kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < Tiles::kOTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.f;
    }
  }
  // Per row (fragment mt, lo/hi): the running maximum of the scaled scores (the row's four
  // lanes agree) and this lane's share of the running sum (added across the four at the end).
  float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    row_max[mt][0] = row_max[mt][1] = kFlashNegInf;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  uint32_t q_registers[kQInRegisters ? Tiles::kKSteps : 1][4];

  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    const int buffer = static_cast<int>(tile & 1);
    const int64_t j0 = tile * kBlockN;
    cp_async_wait<1>();  // this thread's K_tile (and Q) copies have landed
    block_sync();        // everyone's have; everyone is done with the other buffers
    if constexpr (kQInRegisters) {
      if (tile == 0) {
#pragma unroll
        for (int ks = 0; ks < Tiles::kKSteps; ++ks) {
          load_a<kHead>(q_registers[ks], q_tile, row0, ks, lane);
        }
      }
    }
    if (tile + 1 < n_tiles) {
      copy_tile_async<T, kHead, 64, kThreads>(k_tiles + (buffer ^ 1) * Tiles::kTileBytes, key,
                                              p.key.row_stride, j0 + kBlockN, p.len_k);
    }
    cp_async_commit();

    // S = Q·Kᵀ
    const unsigned char* k_tile = k_tiles + buffer * Tiles::kTileBytes;
    float s[kMT][Tiles::kSTiles][4];
    score_tile<T, kHead, kMT, kQInRegisters>(s, q_registers, q_tile, k_tile, row0, lane);

    // Scale (before masking: a negative scale must not turn −inf into +inf), then hide the
    // keys past len_k and, under the causal mask, those after the row.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int n = 0; n < Tiles::kSTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][n][e] *= scale_log2;
      }
    }
    if (j0 + kBlockN > p.len_k || (p.causal && j0 + kBlockN - 1 > i0)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < Tiles::kSTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t j = j0 + n * 8 + 2 * t + (e & 1);
            const int64_t i = i0 + row0 + mt * 16 + g + 8 * (e / 2);
            if (j >= p.len_k || (p.causal && j > i)) s[mt][n][e] = kFlashNegInf;
          }
        }
      }
    }

    // Online softmax. fmaxf skips NaN, and exp2 of a NaN score keeps it NaN in the sums.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float shift[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = kFlashNegInf;
#pragma unroll
        for (int n = 0; n < Tiles::kSTiles; ++n) {
          tile_max = fmaxf(tile_max, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
        }
        tile_max = fmaxf(tile_max, shfl_xor(tile_max, 1));
        tile_max = fmaxf(tile_max, shfl_xor(tile_max, 2));
        const float new_max = fmaxf(row_max[mt][h], tile_max);
        // A row that has seen only hidden keys keeps max −inf; 0 then keeps exp2 quiet.
        shift[h] = new_max == kFlashNegInf ? 0.f : new_max;
        const float correction = fast_exp2(row_max[mt][h] - shift[h]);
        row_max[mt][h] = new_max;
        row_sum[mt][h] *= correction;
#pragma unroll
        for (int n = 0; n < Tiles::kOTiles; ++n) {
          o[mt][n][2 * h] *= correction;
          o[mt][n][2 * h + 1] *= correction;
        }
      }
#pragma unroll
      for (int n = 0; n < Tiles::kSTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mt][n][e] = fast_exp2(s[mt][n][e] - shift[e / 2]);
          row_sum[mt][e / 2] += s[mt][n][e];
        }
      }
    }

    cp_async_wait<1>();  // this thread's V_tile copies have landed (K_{tile+1} may not have)
    block_sync();
    if (tile + 1 < n_tiles) {
      copy_tile_async<T, kHead, 64, kThreads>(v_tiles + (buffer ^ 1) * Tiles::kTileBytes, value,
                                              p.value.row_stride, j0 + kBlockN, p.len_k);
    }
    cp_async_commit();

    // O += P·V: P's k-step kk is S tiles 2kk and 2kk + 1, rounded to T.
    const unsigned char* v_tile = v_tiles + buffer * Tiles::kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) accumulators_as_a<T>(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < Tiles::kOTiles / 2; ++np) {
        uint32_t vb[4];
        load_b_of_columns<kHead>(vb, v_tile, kk, np, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) mma_pair<T>(o[mt][2 * np], o[mt][2 * np + 1], pa[mt], vb);
      }
    }
  }
  cp_async_wait<0>();  // nothing is in flight past here (only empty groups remain)
  // Every warp is past its last read of the Q tile (at tile 0 with Q in registers, else in the
  // last tile's products) and of the V tiles: the barrier lets the output be staged in the Q
  // tile, or in the V tiles when the weights pass below still reads Q.
  block_sync();
  unsigned char* const stage = kWeights ? v_tiles : q_tile;
  static_assert(kBlockM * kHead * 2 <= 2 * Tiles::kTileBytes, "the output fits the V tiles");

  // Rows' sums across their four lanes, then the normalised rows into the stage and out in
  // 16-byte chunks.
  float inv_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum[mt][h] += shfl_xor(row_sum[mt][h], 1);
      row_sum[mt][h] += shfl_xor(row_sum[mt][h], 2);
      inv_sum[mt][h] = row_sum[mt][h] == 0.f ? 0.f : 1.f / row_sum[mt][h];
    }
#pragma unroll
    for (int n = 0; n < Tiles::kOTiles; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + mt * 16 + g + 8 * h, col = n * 8 + 2 * t;
        store_pair<kHead>(stage, r, col,
                          pack_rn<T>(o[mt][n][2 * h] * inv_sum[mt][h],
                                     o[mt][n][2 * h + 1] * inv_sum[mt][h]));
      }
    }
    if (t == 0) {
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + row0 + mt * 16 + g + 8 * h;
        if (i < p.len_q) {
          logsumexp[b * p.len_q + i] = row_sum[mt][h] == 0.f
                                           ? kFlashNegInf
                                           : row_max[mt][h] * kLn2 + logf(row_sum[mt][h]);
        }
      }
    }
  }
  block_sync();
#pragma unroll
  for (int k = 0; k < kBlockM * Tiles::kChunks / Tiles::kThreads; ++k) {
    const int idx = tid + k * Tiles::kThreads;
    const int r = idx / Tiles::kChunks, c = idx % Tiles::kChunks;
    if (i0 + r < p.len_q) {
      *reinterpret_cast<Chunk16*>(output + ((b * p.len_q + i0 + r) * kHead + c * 8)) =
          *reinterpret_cast<const Chunk16*>(stage + swizzled<kHead>(r, c));
    }
  }
  if constexpr (kWeights) {
    // The weights: a second pass over the key tiles that see the block's rows, S = Q·Kᵀ again
    // (the same products, so the same scores), P = exp2(S − max) / sum with the rows' final max
    // and sum, rounded to T once, staged as a [kBlockM, 64] tile in the V tiles and written out
    // in 16-byte chunks where the weights' rows allow it. The keys no row of the block sees
    // (causal) get zeros.
    block_sync();  // every thread is past its reads of the staged output
    unsigned char* const p_tile = v_tiles;
    static_assert(kBlockM * kBlockN * 2 <= 2 * Tiles::kTileBytes, "P fits the V tiles");
    constexpr int kPChunks = kBlockN / 8;  // 16-byte chunks per staged row
    float shift[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        shift[mt][h] = row_max[mt][h] == kFlashNegInf ? 0.f : row_max[mt][h];
      }
    }
    T* const weight_rows = weights + (b * p.len_q + i0) * p.len_k;  // row i0 of entry b
    const bool vector_rows = p.len_k % 8 == 0;  // 16-byte aligned rows
    if (n_tiles > 0) {
      copy_tile_async<T, kHead, 64, kThreads>(k_tiles, key, p.key.row_stride, 0, p.len_k);
    }
    cp_async_commit();
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
      const int buffer = static_cast<int>(tile & 1);
      const int64_t j0 = tile * kBlockN;
      cp_async_wait<0>();  // this thread's K_tile copies have landed
      block_sync();        // everyone's have; everyone is done with the other buffer and P
      if (tile + 1 < n_tiles) {
        copy_tile_async<T, kHead, 64, kThreads>(k_tiles + (buffer ^ 1) * Tiles::kTileBytes,
                                                key, p.key.row_stride, j0 + kBlockN, p.len_k);
      }
      cp_async_commit();
      const unsigned char* k_tile = k_tiles + buffer * Tiles::kTileBytes;
      float s[kMT][Tiles::kSTiles][4];
      score_tile<T, kHead, kMT, kQInRegisters>(s, q_registers, q_tile, k_tile, row0, lane);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < Tiles::kSTiles; ++n) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float pair[2];
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const int64_t j = j0 + n * 8 + 2 * t + q;
              const int64_t i = i0 + row0 + mt * 16 + g + 8 * h;
              const bool hidden = j >= p.len_k || (p.causal && j > i);
              pair[q] = hidden ? 0.f
                               : fast_exp2(s[mt][n][2 * h + q] * scale_log2 - shift[mt][h]) *
                                     inv_sum[mt][h];
            }
            store_pair<kBlockN>(p_tile, row0 + mt * 16 + g + 8 * h, n * 8 + 2 * t,
                                pack_rn<T>(pair[0], pair[1]));
          }
        }
      }
      block_sync();  // the block's P tile is staged
#pragma unroll
      for (int k = 0; k < kBlockM * kPChunks / Tiles::kThreads; ++k) {
        const int idx = tid + k * Tiles::kThreads;
        const int r = idx / kPChunks, c = idx % kPChunks;
        const int64_t j = j0 + c * 8;
        if (i0 + r >= p.len_q || j >= p.len_k) continue;
        T* dst = weight_rows + r * p.len_k + j;
        const unsigned char* src = p_tile + swizzled<kBlockN>(r, c);
        if (vector_rows) {
          *reinterpret_cast<Chunk16*>(dst) = *reinterpret_cast<const Chunk16*>(src);
        } else {
          const T* values = reinterpret_cast<const T*>(src);
          for (int e = 0; e < 8 && j + e < p.len_k; ++e) dst[e] = values[e];
        }
      }
    }
    // Keys past the tiles above: hidden from every row of the block (causal). In 16-byte
    // chunks where the rows allow it (zero_from is a multiple of 64 keys).
    const int64_t zero_from = n_tiles * kBlockN;
    if (zero_from < p.len_k) {
      const int64_t rows = p.len_q - i0 < kBlockM ? p.len_q - i0 : kBlockM;
      const int64_t width = p.len_k - zero_from;
      if (vector_rows) {
        const int64_t chunks = width / 8;
        const Chunk16 zeros{};
        for (int64_t idx = tid; idx < rows * chunks; idx += Tiles::kThreads) {
          *reinterpret_cast<Chunk16*>(weight_rows + (idx / chunks) * p.len_k + zero_from +
                                      (idx % chunks) * 8) = zeros;
        }
      } else {
        const T zero = T(0.f);
        for (int64_t idx = tid; idx < rows * width; idx += Tiles::kThreads) {
          weight_rows[(idx / width) * p.len_k + zero_from + idx % width] = zero;
        }
      }
    }
  }  // kWeights
#endif
}

// ---- backward -------------------------------------------------------------------------------
//
// One block per (batch entry, 64 keys), 4 warps of 16 keys each, walking the query tiles that
// can see its keys (under the causal mask, those from the key block's first key on). Per tile
// of 64 queries, each warp computes, with its keys as rows (transposed, so that its gradients
// stay in registers):
//   Sᵀ = K·Qᵀ,  Pᵀ = exp(scale·Sᵀ − lse) (0 where hidden),  dV += Pᵀ·dO,
//   dPᵀ = V·dOᵀ,  dSᵀ = Pᵀ ⊙ (dPᵀ − delta),  dK += dSᵀ·Q,
// then writes dSᵀ to shared memory, and after a barrier each warp takes 16 of the queries:
// dQ += dS·K, added to a float32 accumulator in global memory (other key blocks add theirs),
// which a last kernel scales and rounds into grad_query. Q and dO tiles are double-buffered;
// K and V are copied once. delta_i = Σ dO_i·O_i comes precomputed; each tile's lse and delta
// are staged in shared memory beside its Q and dO.

template <int kHead>
struct FlashBackwardTiles {
  using Tiles = FlashTiles<kHead>;
  // K, V, then two (Q, dO) pairs, then dSᵀ (64 × 64): 52 KiB at D = 64, 100 KiB at D = 128.
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = Tiles::kTileBytes;
  static constexpr int kQOffset = 2 * Tiles::kTileBytes;   // buffer i at + 2i·kTileBytes
  static constexpr int kDoOffset = 3 * Tiles::kTileBytes;  // buffer i at + 2i·kTileBytes
  static constexpr int kDsOffset = 6 * Tiles::kTileBytes;
  // Two buffers of the tile's 64 rows' (lse·log2 e, delta) pairs, float.
  static constexpr int kRowTermsOffset = kDsOffset + 64 * 64 * 2;
  static constexpr int kSharedBytes = kRowTermsOffset + 2 * 64 * 2 * 4;
  // The tile's 64 queries are taken in kParts parts (see the kernel).
  static constexpr int kParts = kHead == 128 ? 2 : 1;
  static constexpr int kPartQueries = 64 / kParts;
};

template <typename T, int kHead>
ATTNLAB_KERNEL(FlashTiles<kHead>::kThreads)
sdpa_flash_backward_kernel(SdpaProblem p, MatrixOperand grad_output, const float* logsumexp,
                           const float* delta, float* grad_query_accum, T* grad_key,
                           T* grad_value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using Tiles = FlashTiles<kHead>;
  using Layout = FlashBackwardTiles<kHead>;
  constexpr int kBlock = 64;
  ATTNLAB_DYNAMIC_SHARED(shared);
  unsigned char* const k_tile = shared + Layout::kKOffset;
  unsigned char* const v_tile = shared + Layout::kVOffset;
  unsigned char* const ds_tile = shared + Layout::kDsOffset;

  const int tid = thread_index(), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t k_blocks = (p.len_k + kBlock - 1) / kBlock;
  const int64_t b = block_index() / k_blocks;
  const int64_t j0 = block_index() % k_blocks * kBlock;
  const T* query =
      static_cast<const T*>(p.query.data) + batch_offset(p.shape, p.query.batch_stride, b);
  const T* key = static_cast<const T*>(p.key.data) + batch_offset(p.shape, p.key.batch_stride, b);
  const T* value =
      static_cast<const T*>(p.value.data) + batch_offset(p.shape, p.value.batch_stride, b);
  const T* dout = static_cast<const T*>(grad_output.data) +
                  batch_offset(p.shape, grad_output.batch_stride, b);
  const float* lse = logsumexp + b * p.len_q;
  const float* row_delta = delta + b * p.len_q;
  // The query rows' lse (in base 2) and delta, staged per tile in shared memory: read there in
  // the P/dS loop, they take no registers across the tile's products. Rows at or past len_q
  // get zeros (their probabilities are masked anyway).
  float* const row_terms = reinterpret_cast<float*>(shared + Layout::kRowTermsOffset);
  const auto stage_row_terms = [&](int buffer, int64_t i0) {
    if (tid < 64) {
      const int64_t i = i0 + tid;
      float* terms = row_terms + (buffer * 64 + tid) * 2;
      terms[0] = i < p.len_q ? lse[i] * kLog2e : 0.f;
      terms[1] = i < p.len_q ? row_delta[i] : 0.f;
    }
  };
  const int64_t first_query = p.causal ? j0 / kBlock * kBlock : 0;
  const int64_t n_tiles = p.len_q > first_query ? (p.len_q - first_query + kBlock - 1) / kBlock : 0;

  copy_tile_async<T, kHead>(k_tile, key, p.key.row_stride, j0, p.len_k);
  copy_tile_async<T, kHead>(v_tile, value, p.value.row_stride, j0, p.len_k);
  if (n_tiles > 0) {
    copy_tile_async<T, kHead>(shared + Layout::kQOffset, query, p.query.row_stride, first_query,
                              p.len_q);
    copy_tile_async<T, kHead>(shared + Layout::kDoOffset, dout, grad_output.row_stride,
                              first_query, p.len_q);
    stage_row_terms(0, first_query);  // seen after the first tile's barrier
  }
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const int64_t key_lo = j0 + warp * 16 + g, key_hi = key_lo + 8;  // this lane's two keys
  float dk[Tiles::kOTiles][4], dv[Tiles::kOTiles][4];
#pragma unroll
  for (int n = 0; n < Tiles::kOTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  }

  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    const int buffer = static_cast<int>(tile & 1);
    const int64_t i0 = first_query + tile * kBlock;
    const unsigned char* q_tile = shared + Layout::kQOffset + buffer * 2 * Tiles::kTileBytes;
    const unsigned char* do_tile = shared + Layout::kDoOffset + buffer * 2 * Tiles::kTileBytes;
    cp_async_wait<0>();  // this thread's copies of this tile (and K, V) have landed
    block_sync();        // everyone's have; everyone is done with the other buffers and dSᵀ
    if (tile + 1 < n_tiles) {
      const int other = (buffer ^ 1) * 2 * Tiles::kTileBytes;
      copy_tile_async<T, kHead>(shared + Layout::kQOffset + other, query, p.query.row_stride,
                                i0 + kBlock, p.len_q);
      copy_tile_async<T, kHead>(shared + Layout::kDoOffset + other, dout,
                                grad_output.row_stride, i0 + kBlock, p.len_q);
      stage_row_terms(buffer ^ 1, i0 + kBlock);  // seen after the next tile's first barrier
    }
    cp_async_commit();

    // Per part of the tile's queries (Layout::kParts of them: the whole 64 at D = 64, two
    // halves of 32 at D = 128, where Sᵀ and dPᵀ for all 64 beside dK and dV spilled):
    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for this warp's 16 keys, Pᵀ and dSᵀ, dV += Pᵀ·dO,
    // dK += dSᵀ·Q, and dSᵀ into shared memory.
#pragma unroll 1  // unrolled, the parts shared K and V fragments kept live across them
    for (int part = 0; part < Layout::kParts; ++part) {
      constexpr int kN = Layout::kPartQueries / 8;     // 8-query tiles of the part
      constexpr int kK = Layout::kPartQueries / 16;    // 16-query k-steps (and pairs of tiles)
      const int q0 = part * Layout::kPartQueries;      // the part's first query in the tile
      float st[kN][4], dpt[kN][4];
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
      }
#pragma unroll
      for (int ks = 0; ks < Tiles::kKSteps; ++ks) {
        uint32_t ka[4], va[4];
        load_a<kHead>(ka, k_tile, warp * 16, ks, lane);
        load_a<kHead>(va, v_tile, warp * 16, ks, lane);
#pragma unroll
        for (int np = 0; np < kK; ++np) {
          uint32_t qb[4], dob[4];
          load_b_of_rows<kHead>(qb, q_tile, q0 + np * 16, ks, lane);
          load_b_of_rows<kHead>(dob, do_tile, q0 + np * 16, ks, lane);
          mma_pair<T>(st[2 * np], st[2 * np + 1], ka, qb);
          mma_pair<T>(dpt[2 * np], dpt[2 * np + 1], va, dob);
        }
      }

      // Pᵀ (in st) and dSᵀ (in dpt), in float.
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = q0 + n * 8 + 2 * t + c;  // the query's row in the tile
          const int64_t i = i0 + col;
          const float* terms = row_terms + (buffer * 64 + col) * 2;
          const float lse_log2 = terms[0], d = terms[1];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t j = h == 0 ? key_lo : key_hi;
            const bool visible = i < p.len_q && j < p.len_k && !(p.causal && j > i);
            const int e = 2 * h + c;
            const float prob = visible ? fast_exp2(st[n][e] * scale_log2 - lse_log2) : 0.f;
            st[n][e] = prob;
            dpt[n][e] = prob * (dpt[n][e] - d);
          }
        }
      }

      // dV += Pᵀ·dO and dK += dSᵀ·Q (k = the part's queries).
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        uint32_t pa[4], dsa[4];
        accumulators_as_a<T>(pa, st[2 * kk], st[2 * kk + 1]);
        accumulators_as_a<T>(dsa, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < Tiles::kOTiles / 2; ++np) {
          uint32_t dob[4], qb[4];
          load_b_of_columns<kHead>(dob, do_tile, q0 / 16 + kk, np, lane);
          load_b_of_columns<kHead>(qb, q_tile, q0 / 16 + kk, np, lane);
          mma_pair<T>(dv[2 * np], dv[2 * np + 1], pa, dob);
          mma_pair<T>(dk[2 * np], dk[2 * np + 1], dsa, qb);
        }
      }

      // dSᵀ (rounded to T) into shared memory: rows are keys, columns queries.
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp * 16 + g + 8 * h, col = q0 + n * 8 + 2 * t;
          store_pair<64>(ds_tile, r, col, pack_rn<T>(dpt[n][2 * h], dpt[n][2 * h + 1]));
        }
      }
    }
    block_sync();

    // dQ (unscaled) for queries i0 + 16·warp .. + 15: dS·K, with dS read as dSᵀ transposed,
    // 64 columns at a time (fewer registers live beside dK and dV).
#pragma unroll
    for (int part = 0; part < kHead / 64; ++part) {
      float dq[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[n][e] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t dsa[4];
        load_a_transposed<64>(dsa, ds_tile, kk, warp * 16, lane);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t kb[4];
          load_b_of_columns<kHead>(kb, k_tile, kk, part * 4 + np, lane);
          mma_pair<T>(dq[2 * np], dq[2 * np + 1], dsa, kb);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t i = i0 + warp * 16 + g + 8 * h;
        if (i >= p.len_q) continue;
        float* row = grad_query_accum + (b * p.len_q + i) * kHead + part * 64;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          atomic_add(row + n * 8 + 2 * t, dq[n][2 * h]);
          atomic_add(row + n * 8 + 2 * t + 1, dq[n][2 * h + 1]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // dK = scale·Σ dSᵀ·Q and dV, for this warp's keys, two values per store.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t j = h == 0 ? key_lo : key_hi;
    if (j >= p.len_k) continue;
    T* dk_row = grad_key + (b * p.len_k + j) * kHead;
    T* dv_row = grad_value + (b * p.len_k + j) * kHead;
#pragma unroll
    for (int n = 0; n < Tiles::kOTiles; ++n) {
      const int col = n * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dk_row + col) =
          pack_rn<T>(dk[n][2 * h] * p.scale, dk[n][2 * h + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv_row + col) = pack_rn<T>(dv[n][2 * h], dv[n][2 * h + 1]);
    }
  }
#endif
}

// grad_query = T(scale · accumulator): one pair of elements per thread (count is even).
template <typename T>
ATTNLAB_KERNEL(256)
flash_grad_query_kernel(const float* accum, float scale, int64_t count, T* grad_query) {
  const int64_t idx = (block_index() * 256 + thread_index()) * 2;
  if (idx < count) {
    *reinterpret_cast<uint32_t*>(grad_query + idx) =
        pack_rn<T>(accum[idx] * scale, accum[idx + 1] * scale);
  }
}

}  // namespace attnlab::cuda::detail

#if !defined(ATTNLAB_WARP_EMULATION)
#include "cuda/device_common.cuh"

namespace attnlab::cuda {

template <typename T, int kHead, int kRowsPerWarp, int kBlockWarps = 4>
void launch_flash_forward(const SdpaProblem& p, T* output, float* logsumexp, T* weights,
                          cudaStream_t stream) {
  using Tiles = detail::FlashForwardTiles<kHead, kRowsPerWarp, kBlockWarps>;
  const int64_t blocks = p.batch * detail::ceil_div(p.len_q, Tiles::kBlockM);
  if (weights != nullptr) {
    return detail::launch(
        detail::sdpa_flash_forward_kernel<T, kHead, kRowsPerWarp, true, kBlockWarps>, blocks,
        Tiles::kThreads, Tiles::kSharedBytes, stream, p, output, logsumexp, weights);
  }
  detail::launch(detail::sdpa_flash_forward_kernel<T, kHead, kRowsPerWarp, false, kBlockWarps>,
                 blocks, Tiles::kThreads, Tiles::kSharedBytes, stream, p, output, logsumexp,
                 weights);
}

// Query rows per warp in blocks of 4 warps, by head size, as benchmarks/attention_cuda.py
// measured them on an NVIDIA H200: 32 at D = 64 (twice the products per K and V fragment
// loaded), 16 at D = 128 (32 rows spill registers there).
template <int kHead>
constexpr int kFlashRowsPerWarp = kHead <= 64 ? 32 : 16;

template <typename T, int kHead>
void sdpa_forward_flash(const SdpaProblem& p, T* output, float* logsumexp, T* weights,
                        int block_warps, cudaStream_t stream) {
  if (block_warps == 8) {
    return launch_flash_forward<T, kHead, 16, 8>(p, output, logsumexp, weights, stream);
  }
  launch_flash_forward<T, kHead, kFlashRowsPerWarp<kHead>>(p, output, logsumexp, weights, stream);
}

template <typename T, int kHead>
void sdpa_backward_flash(const SdpaProblem& p, const MatrixOperand& grad_output, const T* output,
                         const float* logsumexp, float* delta, float* grad_query_accum,
                         T* grad_query, T* grad_key, T* grad_value, cudaStream_t stream) {
  using Tiles = detail::FlashTiles<kHead>;
  detail::launch_softmax_delta(p, grad_output, output, delta, stream);
  detail::launch(detail::sdpa_flash_backward_kernel<T, kHead>,
                 p.batch * detail::ceil_div(p.len_k, Tiles::kBlockN), Tiles::kThreads,
                 detail::FlashBackwardTiles<kHead>::kSharedBytes, stream, p, grad_output,
                 logsumexp, static_cast<const float*>(delta), grad_query_accum, grad_key,
                 grad_value);
  const int64_t count = p.batch * p.len_q * kHead;
  detail::launch(detail::flash_grad_query_kernel<T>, detail::ceil_div(count / 2, 256), 256, 0,
                 stream, static_cast<const float*>(grad_query_accum), p.scale, count,
                 grad_query);
}

}  // namespace attnlab::cuda

#define ATTNLAB_INSTANTIATE_SDPA_FLASH(T, kHead)                                               \
  namespace attnlab::cuda {                                                                    \
  template void sdpa_forward_flash<T, kHead>(const SdpaProblem&, T*, float*, T*, int,          \
                                             cudaStream_t);                                    \
  template void sdpa_backward_flash<T, kHead>(const SdpaProblem&, const MatrixOperand&,        \
                                              const T*, const float*, float*, float*, T*, T*,  \
                                              T*, cudaStream_t);                               \
  }
#endif

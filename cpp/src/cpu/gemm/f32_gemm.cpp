#include "cpu/gemm/f32_gemm.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "cpu/isa/isa.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTNLAB_HAVE_F32_KERNEL 1
#include <immintrin.h>

#include "cpu/isa/vec_transpose.h"
#endif

namespace attnlab::cpu {

#ifdef ATTNLAB_HAVE_F32_KERNEL
namespace {

// Only these functions are compiled for AVX-512; f32_gemm calls them after the run-time check.
#define ATTNLAB_F32 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define ATTNLAB_F32_INLINE ATTNLAB_F32 inline __attribute__((always_inline))

// Register block: kRows rows of C by kVecs vectors of 16 columns: 16 accumulators, 2 B vectors
// and the broadcast A element of the 32 zmm registers. Measured on an AMD EPYC (Zen 4)
// core at the attention's and the encoder's shapes, 8×2 beat 8×3 (48-column panels: 0–5 %
// slower, the larger loss at n = 512 and 128 for their narrow tails) and 12×2 (2–10 % slower):
// Zen 4 issues one 512-bit FMA per cycle, so 16 independent accumulators already hide its
// latency and the loads are not the limit. 32 columns also divide the attention's widths.
constexpr int kRows = 8;
constexpr int kVecs = 2;
// The sum runs in chunks of at most this many steps, so that the chunk of a B panel the
// register blocks stream (kChunk × 32 floats, 32 KiB) stays in the L1 cache: one Intel Xeon
// (Emerald Rapids, 48 KiB L1) thread, unchunked, ran 768×256×640 Aᵀ·B at 98 GFLOP/s and
// 640×256×768 A·B at 130, where k = 256 products ran at 148-160.
constexpr int64_t kChunk = 256;
// Aᵀ·B products over more than this many steps pack Aᵀ first (f32_gemm_avx512); the attention
// backward's (k = a query block of 64 rows) read A in place.
constexpr int64_t kPackTransposedAFromK = 64;
constexpr int64_t kL = 16;
static_assert(kVecs * kL == kF32PackedPanel);

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The first n of 16 lanes (n clamped to [0, 16]).
ATTNLAB_F32_INLINE __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// B transposed (`width` rows of k contiguous floats): out[p·ldo + j] = x[j·ldx + p], zero for
// width <= j < ldo (ldo a multiple of 16), by 16×16 in-register transposes.
ATTNLAB_F32 void pack_transposed(const float* x, int64_t ldx, int64_t k, int64_t width,
                                 float* out, int64_t ldo) {
  for (int64_t j0 = 0; j0 < ldo; j0 += kL) {
    for (int64_t p0 = 0; p0 < k; p0 += kL) {
      const __mmask16 lanes = first_lanes(k - p0);
      Vec<float> r[16];
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = j0 + i < width ? (Vec<float>)_mm512_maskz_loadu_ps(lanes, x + (j0 + i) * ldx + p0)
                              : Vec<float>{};
      }
      transpose_block<float>(r);
      const int64_t rows = std::min(kL, k - p0);
      for (int64_t q = 0; q < rows; ++q) _mm512_storeu_ps(out + (p0 + q) * ldo + j0, (__m512)r[q]);
    }
  }
}

// B not transposed: out[p·ldo + j] = x[p·ldx + j], zero for width <= j < ldo.
ATTNLAB_F32 void pack_rows(const float* x, int64_t ldx, int64_t k, int64_t width, float* out,
                           int64_t ldo) {
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t j0 = 0; j0 < ldo; j0 += kL) {
      _mm512_storeu_ps(out + p * ldo + j0,
                       _mm512_maskz_loadu_ps(first_lanes(width - j0), x + p * ldx + j0));
    }
  }
}

// Stores owed by this thread: zeros (f32_defer_zeros) and scaled copies of rows
// (f32_defer_scaled_rows), regions of rows of whole 64-byte lines, written one line every
// kZeroEvery steps of the products' sums (block<..., true>) and the rest by the flushes. Two
// queues: the copies first, since their sources are freed or overwritten soon after, the zeros
// whenever no copy is owed.
struct LineRegion {
  float* first;
  const float* src;      // null: zeros
  int64_t src_ld;        // floats between the source's rows
  const float* factors;  // one per row (copies)
  int64_t row_lines, rows, ld;  // rows of row_lines lines each, ld floats apart
};
struct LineQueue {
  std::vector<LineRegion> regions;  // taken in order
  size_t next = 0;
  // The region being written: its next line (and source line), the lines left in that row,
  // the rows left after it, and the row's factor.
  LineRegion current{};
  float* at = nullptr;
  const float* src = nullptr;
  const float* factor = nullptr;
  int64_t lines = 0, rows = 0;
  bool pending() const { return lines > 0 || next < regions.size(); }
  // The next line to write (at, lines > 0), or none left.
  void refill() {
    while (lines == 0) {
      if (rows > 0) {
        at += current.ld - current.row_lines * kL;
        if (src != nullptr) {
          src += current.src_ld - current.row_lines * kL;
          ++factor;
        }
        lines = current.row_lines;
        --rows;
      } else if (next < regions.size()) {
        current = regions[next++];
        at = current.first;
        src = current.src;
        factor = current.factors;
        lines = current.row_lines;
        rows = current.rows - 1;
      } else {
        regions.clear();  // all taken: the storage is reused
        next = 0;
        return;
      }
    }
  }
};
struct DeferredLines {
  LineQueue copies, zeros;
  bool pending() const { return copies.pending() || zeros.pending(); }
  // The queue whose lines come next (copies first), refilled.
  LineQueue& active() {
    copies.refill();
    if (copies.lines > 0) return copies;
    zeros.refill();
    return zeros;
  }
};
thread_local DeferredLines deferred_lines;
// Measured on one Intel Xeon (AMX) core with the causal weights' zeros of (8, 2048, 2048): the
// P·V products of 16-row groups took 14.0 ms alone, 17.6 with the zeros streamed after each
// query block, 14.7–15.2 with a line every other step.
constexpr int64_t kZeroEvery = 2;

// Lines to prefetch into L2 (f32_prefetch_rows): issued a few after each panel of the scores'
// products (rows_with_max), so that each finds a free fill buffer. The cursor walks one
// region; the regions queued after it wait in prefetch_queue.
struct PrefetchLines {
  const char* at = nullptr;
  int64_t lines = 0, row_lines = 0, rows = 0, skip = 0;  // skip: bytes from a row's end to the next
};
thread_local PrefetchLines prefetch_lines;
struct PrefetchQueue {
  PrefetchLines regions[4];
  int next = 0, count = 0;
};
thread_local PrefetchQueue prefetch_queue;
// Measured on one Intel Xeon (model 207) thread, 16-row scores against a packed K in L2 with
// the next group's query rows queued: 4 lines per panel (of 32 columns by 64 steps) left the
// product as fast as without (too few lines for the causal mask's short early rows), 8 and 16
// made it 1.08-1.11× faster, 32 1.07×. A test for the queue at every 4th step of the sums
// instead cost them 7-11 % with every operand in cache.
constexpr int kPrefetchPerPanel = 16;

__attribute__((noinline)) void prefetch_refill(PrefetchLines& pf) {
  PrefetchQueue& q = prefetch_queue;
  if (q.next < q.count) {
    pf = q.regions[q.next++];
  } else {
    pf = PrefetchLines{};
  }
}

ATTNLAB_F32_INLINE void prefetch_step(PrefetchLines& pf) {
  _mm_prefetch(pf.at, _MM_HINT_T1);
  pf.at += 64;
  if (--pf.lines == 0) {
    if (pf.rows > 0) {
      pf.at += pf.skip;
      pf.lines = pf.row_lines;
      --pf.rows;
    } else {
      prefetch_refill(pf);
    }
  }
}

// Writes a queue's owed lines until none is left, one row (or what is left of it) at a time.
ATTNLAB_F32 void drain(LineQueue& q) {
  for (q.refill(); q.lines > 0; q.refill()) {
    if (q.src != nullptr) {
      const __m512 f = _mm512_set1_ps(*q.factor);
      for (; q.lines > 0; --q.lines, q.at += kL, q.src += kL) {
        _mm512_stream_ps(q.at, _mm512_mul_ps(_mm512_load_ps(q.src), f));
      }
    } else {
      for (; q.lines > 0; --q.lines, q.at += kL) _mm512_stream_ps(q.at, _mm512_setzero_ps());
    }
  }
}

// One register block: Rows rows of C by Vecs vectors of columns (the last one's lanes in
// `last`). op(A)[r, p] is a[r·a_row + p·a_col]; the block's B row p starts at b + p·ldb.
// Zeros: whether it also writes owed lines (DeferredLines: zeros or scaled copies) as its sum
// runs.
template <int Rows, int Vecs, bool Zeros>
ATTNLAB_F32_INLINE void block(int64_t k, const float* a, int64_t a_row, int64_t a_col,
                              const float* b, int64_t ldb, float alpha, float beta,
                              const float* d, int64_t ldd, float* c, int64_t ldc,
                              __mmask16 last) {
  __m512 acc[Rows][Vecs];
  for (int r = 0; r < Rows; ++r) {
    for (int v = 0; v < Vecs; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  // Owed lines (Zeros): the queue's state in locals for the loop, stored back after it.
  LineQueue* q = nullptr;
  float* line_at = nullptr;
  const float* src_at = nullptr;
  const float* factor = nullptr;
  __m512 scale = _mm512_setzero_ps();
  int64_t lines = 0, line_rows = 0, skip = 0, src_skip = 0, row_lines = 0;
  if constexpr (Zeros) {
    q = &deferred_lines.active();
    line_at = q->at;
    src_at = q->src;
    factor = q->factor;
    lines = q->lines;
    line_rows = q->rows;
    row_lines = q->current.row_lines;
    skip = q->current.ld - row_lines * kL;  // from a row's end to the next one's
    src_skip = q->current.src_ld - row_lines * kL;
    if (src_at != nullptr && lines > 0) scale = _mm512_set1_ps(*factor);
  }
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[Vecs];
    for (int v = 0; v < Vecs; ++v) bv[v] = _mm512_loadu_ps(b + p * ldb + kL * v);
    const float* ap = a + p * a_col;
    for (int r = 0; r < Rows; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * a_row]);
      for (int v = 0; v < Vecs; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    if constexpr (Zeros) {
      if (p % kZeroEvery == kZeroEvery - 1 && lines > 0) {
        if (src_at != nullptr) {
          _mm512_stream_ps(line_at, _mm512_mul_ps(_mm512_load_ps(src_at), scale));
          src_at += kL;
        } else {
          _mm512_stream_ps(line_at, _mm512_setzero_ps());
        }
        line_at += kL;
        if (--lines == 0 && line_rows > 0) {  // on to the region's next row
          line_at += skip;
          if (src_at != nullptr) {
            src_at += src_skip;
            scale = _mm512_set1_ps(*++factor);
          }
          lines = row_lines;
          --line_rows;
        }
      }
    }
  }
  if constexpr (Zeros) {
    q->at = line_at;
    q->src = src_at;
    q->factor = factor;
    q->lines = lines;
    q->rows = line_rows;
  }
  const __m512 valpha = _mm512_set1_ps(alpha), vbeta = _mm512_set1_ps(beta);
  for (int r = 0; r < Rows; ++r) {
    for (int v = 0; v < Vecs; ++v) {
      const __mmask16 lanes = v == Vecs - 1 ? last : __mmask16(0xFFFF);
      float* cr = c + r * ldc + kL * v;
      __m512 out = alpha == 1.0f ? acc[r][v] : _mm512_mul_ps(acc[r][v], valpha);
      if (beta != 0.0f) {
        out = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(lanes, d + r * ldd + kL * v), out);
      }
      _mm512_mask_storeu_ps(cr, lanes, out);
    }
  }
}

// Not inlined: each instance is register-allocated on its own. Inlined into callers that hold
// several instances and a loop over chunks of the sum, GCC kept the B vectors on the stack and
// the attention forward ran at half speed.
template <int Vecs, bool Zeros = false>
ATTNLAB_F32 __attribute__((noinline)) void column_block(int64_t m, int64_t k, const float* a,
                                                        int64_t a_row,
                                     int64_t a_col, int64_t a_block, const float* b, int64_t ldb,
                                     float alpha, float beta, const float* d, int64_t ldd,
                                     float* c, int64_t ldc, __mmask16 last) {
  int64_t i0 = 0;
  const float* ai = a;  // op(A)'s rows from i0 (a_block apart per kRows rows)
  for (; i0 + kRows <= m; i0 += kRows, ai += a_block) {
    block<kRows, Vecs, Zeros>(k, ai, a_row, a_col, b, ldb, alpha, beta, d + i0 * ldd, ldd,
                              c + i0 * ldc, ldc, last);
  }
  float* ci = c + i0 * ldc;
  const float* di = d + i0 * ldd;
  switch (m - i0) {  // the remaining rows in one block of their own size
#define ATTNLAB_TAIL_BLOCK(R)                                                                \
  case R:                                                                                  \
    block<R, Vecs, Zeros>(k, ai, a_row, a_col, b, ldb, alpha, beta, di, ldd, ci, ldc, last); \
    break;
    ATTNLAB_TAIL_BLOCK(7) ATTNLAB_TAIL_BLOCK(6) ATTNLAB_TAIL_BLOCK(5) ATTNLAB_TAIL_BLOCK(4)
    ATTNLAB_TAIL_BLOCK(3) ATTNLAB_TAIL_BLOCK(2) ATTNLAB_TAIL_BLOCK(1)
#undef ATTNLAB_TAIL_BLOCK
    default: break;
  }
}

// Aᵀ (A row-major [k×m], leading dimension lda) packed into row blocks of op(A): block q
// (rows q·kRows ...) at out + q·kRows·k, element (r, p) at + p·kRows + r (zeros past m).
ATTNLAB_F32 void pack_transposed_a(const float* a, int64_t lda, int64_t m, int64_t k,
                                   float* out) {
  // In tiles of kPackSteps rows of A, each row read in order and each block's part of the
  // tile written as whole lines. Row block by row block instead (each block's 32-byte pieces
  // from rows lda apart, A read again for every block), the packing took 14 % of a
  // 768×256×640 Aᵀ·B product's time on one Intel Xeon (model 207) thread, bound by its reads
  // of A; tiled, 11.6 %, and the product ran 5–11 % faster (5 of 6 alternating runs).
  constexpr int64_t kPackSteps = 16;
  const int64_t full = m / kRows * kRows;
  for (int64_t p0 = 0; p0 < k; p0 += kPackSteps) {
    const int64_t p1 = std::min(k, p0 + kPackSteps);
    for (int64_t i0 = 0; i0 < full; i0 += kRows) {
      float* block = out + i0 * k;
      for (int64_t p = p0; p < p1; ++p) {
        _mm256_storeu_ps(block + p * kRows, _mm256_loadu_ps(a + p * lda + i0));
      }
    }
  }
  if (full < m) {
    const int64_t rows = m - full;
    float* block = out + full * k;
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t r = 0; r < kRows; ++r) {
        block[p * kRows + r] = r < rows ? a[p * lda + full + r] : 0.0f;
      }
    }
  }
}

// The largest of 16 lanes. GCC 12's AVX-512 reductions (and casts and shuffles) merge into a
// vector left uninitialized on purpose and warn about it wherever they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
ATTNLAB_F32_INLINE float max_of_lanes(__m512 x) { return _mm512_reduce_max_ps(x); }
#pragma GCC diagnostic pop

// One panel of rows_with_max: its products, stored, and joined to the rows' running maxima.
template <int Rows>
ATTNLAB_F32_INLINE void panel_with_max(int64_t k, const float* a, int64_t a_row, int64_t a_col,
                                       const float* b, int64_t ldb, __mmask16 lanes0,
                                       __mmask16 lanes1, float alpha, float* c, int64_t ldc,
                                       int64_t seen0, bool whole, __m512 (&max)[Rows]) {
  __m512 acc0[Rows], acc1[Rows];
  for (int r = 0; r < Rows; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_loadu_ps(b + p * ldb);
    const __m512 b1 = _mm512_maskz_loadu_ps(lanes1, b + p * ldb + kL);
    const float* ap = a + p * a_col;
    for (int r = 0; r < Rows; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * a_row]);
      acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
    }
  }
  const __m512 valpha = _mm512_set1_ps(alpha);
  for (int r = 0; r < Rows; ++r) {
    const __m512 out0 = _mm512_mul_ps(acc0[r], valpha);
    const __m512 out1 = _mm512_mul_ps(acc1[r], valpha);
    _mm512_mask_storeu_ps(c + r * ldc, lanes0, out0);
    _mm512_mask_storeu_ps(c + r * ldc + kL, lanes1, out1);
    const __mmask16 seen_0 = whole ? lanes0 : __mmask16(lanes0 & first_lanes(seen0 + r));
    const __mmask16 seen_1 = whole ? lanes1 : __mmask16(lanes1 & first_lanes(seen0 + r - kL));
    max[r] = _mm512_mask_max_ps(max[r], seen_0, out0, max[r]);
    max[r] = _mm512_mask_max_ps(max[r], seen_1, out1, max[r]);
  }
}

// C = alpha·op(A)·P (beta 0) for Rows rows of C over every packed panel of n columns, with the
// rows' maxima over their visible columns (f32_gemm_packed's row_max): the panels run inside the
// row block, so that its Rows running maxima stay in registers (16 lanes per row kept in memory
// instead, loaded and stored by every register block, cost the k = 64 scores 8–10 % of their
// rate). For sums of one chunk (the scores' k is the head size). The last panel's second vector
// is loaded under its lane mask.
template <int Rows>
ATTNLAB_F32 __attribute__((noinline)) void rows_with_max(
    int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* packed,
    int64_t panel_stride, int64_t packed_n, int64_t row0, float alpha, float* c, int64_t ldc,
    float* row_max, int64_t visible, bool skip_hidden) {
  constexpr int64_t kCols = kVecs * kL;
  static_assert(kVecs == 2);
  __m512 max[Rows];
  for (int r = 0; r < Rows; ++r) max[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  PrefetchLines pf = prefetch_lines;
  // With skip_hidden, only the columns that the block's last row sees.
  const int64_t cols = skip_hidden ? std::clamp<int64_t>(visible + Rows - 1, 0, n) : n;
  for (int64_t j0 = 0; j0 < cols; j0 += kCols) {
    const int64_t ldb = round_up(std::min(kCols, packed_n - j0), kL);
    const float* b = packed + (j0 / kCols) * panel_stride + row0 * ldb;
    const int64_t width = std::min(kCols, n - j0);
    const int64_t seen0 = visible - j0;  // the columns of this panel that row 0 sees
    panel_with_max<Rows>(k, a, a_row, a_col, b, ldb, first_lanes(width), first_lanes(width - kL),
                         alpha, c + j0, ldc, seen0, width == kCols && seen0 >= kCols, max);
    for (int i = 0; i < kPrefetchPerPanel && pf.lines > 0; ++i) prefetch_step(pf);
  }
  prefetch_lines = pf;
  for (int r = 0; r < Rows; ++r) row_max[r] = max_of_lanes(max[r]);
}

// C[:, 0 : width] = alpha·op(A)·P + beta·D for a packed panel P of width <= kVecs·16 columns
// (rows ldo apart): a block of kVecs vectors, or of fewer for a narrow last panel. D's rows are
// ldd apart (0: one row for all; D = C, ldd = ldc: the usual beta·C).
ATTNLAB_F32_INLINE void panel_product(int64_t m, int64_t k, const float* a, int64_t a_row,
                                      int64_t a_col, int64_t a_block, const float* panel,
                                      int64_t ldo, int64_t width, float alpha, float beta,
                                      const float* d, int64_t ldd, float* c, int64_t ldc) {
  if (width == kVecs * kL) {
    if (deferred_lines.pending()) {
      column_block<kVecs, true>(m, k, a, a_row, a_col, a_block, panel, ldo, alpha, beta, d, ldd, c, ldc,
                                __mmask16(0xFFFF));
    } else {
      column_block<kVecs>(m, k, a, a_row, a_col, a_block, panel, ldo, alpha, beta, d, ldd, c, ldc,
                          __mmask16(0xFFFF));
    }
  } else if (width > kL) {
    column_block<2>(m, k, a, a_row, a_col, a_block, panel, ldo, alpha, beta, d, ldd, c, ldc,
                    first_lanes(width - kL));
  } else {
    column_block<1>(m, k, a, a_row, a_col, a_block, panel, ldo, alpha, beta, d, ldd, c, ldc,
                    first_lanes(width));
  }
}

// Panels of Vecs·16 columns, the last (narrower) one by a block of 1..Vecs vectors, over the
// sum in chunks of kChunk steps. Each chunk of a panel is packed just before its column blocks
// run, so it is still in cache for them. The chunks are the outer loop: all of op(A)'s rows
// for one chunk (m·1 KiB) are then read again for every panel while they are still in L2, where
// panels outside chunks read all of op(A) once per panel (a 768×256×640 Aᵀ·B product, packed
// Aᵀ 1.97 MB, came from beyond L2 each time: 0.89–0.94× MKL's sgemm_ speed on one Intel Xeon
// thread, 0.92–0.99× with the chunks outside). Each element's sum still runs over the chunks in
// order, so the results are the same to the bit. op(A)'s
// element (r, p) is at a[r·a_row + p·a_col] within a block of kRows rows, blocks a_block apart.
template <int Vecs>
ATTNLAB_F32_INLINE void f32_gemm_panels(bool trans_b, int64_t m, int64_t n, int64_t k,
                                        float alpha, const float* a, int64_t a_row,
                                        int64_t a_col, int64_t a_block, const float* b,
                                        int64_t ldb, float beta, const float* d, int64_t ldd,
                                        float* c, int64_t ldc) {
  thread_local AlignedVector<float> packed_b;  // per thread, grown as needed
  constexpr int64_t kCols = Vecs * kL;
  const int64_t chunk = std::min(k, kChunk);
  if (static_cast<int64_t>(packed_b.size()) < chunk * kCols) packed_b.resize(chunk * kCols);
  float* panel = packed_b.data();  // one chunk of a panel: up to kChunk rows of ldo columns
  for (int64_t p0 = 0; p0 < k; p0 += kChunk) {
    const int64_t steps = std::min(kChunk, k - p0);
    for (int64_t j0 = 0; j0 < n; j0 += kCols) {
      const int64_t width = std::min(kCols, n - j0), ldo = round_up(width, kL);
      if (trans_b) {
        pack_transposed(b + j0 * ldb + p0, ldb, steps, width, panel, ldo);
      } else {
        pack_rows(b + p0 * ldb + j0, ldb, steps, width, panel, ldo);
      }
      // Later chunks add to what the earlier ones wrote.
      if (p0 == 0) {
        panel_product(m, steps, a, a_row, a_col, a_block, panel, ldo, width, alpha, beta,
                      d + j0, ldd, c + j0, ldc);
      } else {
        panel_product(m, steps, a + p0 * a_col, a_row, a_col, a_block, panel, ldo, width, alpha,
                      1.0f, c + j0, ldc, c + j0, ldc);
      }
    }
  }
}

ATTNLAB_F32 void f32_gemm_packed_avx512(bool trans_a, int64_t m, int64_t n, int64_t k,
                                        float alpha, const float* a, int64_t lda,
                                        const float* packed, int64_t packed_n,
                                        int64_t panel_stride, int64_t row0, float beta,
                                        float* c, int64_t ldc, float* row_max,
                                        int64_t visible, bool skip_hidden) {
  constexpr int64_t kCols = kVecs * kL;
  const int64_t a_row = trans_a ? 1 : lda, a_col = trans_a ? lda : 1, a_block = kRows * a_row;
  // (beta 0: f32_gemm_packed checks.) Sums longer than a chunk run the plain product, whose
  // chunks round as every other product of these operands does, and then scan C.
  if (row_max != nullptr && k <= kChunk) {
    const float* ai = a;
    for (int64_t i0 = 0; i0 < m; i0 += kRows, ai += a_block) {
      const int64_t vis = visible + i0;
      float* ci = c + i0 * ldc;
      switch (std::min<int64_t>(kRows, m - i0)) {
#define ATTNLAB_ROWS_WITH_MAX(R)                                                          \
  case R:                                                                                 \
    rows_with_max<R>(n, k, ai, a_row, a_col, packed, panel_stride, packed_n, row0, alpha, \
                     ci, ldc, row_max + i0, vis, skip_hidden);                            \
    break;
        ATTNLAB_ROWS_WITH_MAX(8) ATTNLAB_ROWS_WITH_MAX(7) ATTNLAB_ROWS_WITH_MAX(6)
        ATTNLAB_ROWS_WITH_MAX(5) ATTNLAB_ROWS_WITH_MAX(4) ATTNLAB_ROWS_WITH_MAX(3)
        ATTNLAB_ROWS_WITH_MAX(2) ATTNLAB_ROWS_WITH_MAX(1)
#undef ATTNLAB_ROWS_WITH_MAX
        default: break;
      }
    }
    return;
  }
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const float* panel = packed + (j0 / kCols) * panel_stride;
    // The panel's row stride as packed (the last panel of packed_n columns may be narrower).
    const int64_t ldo = round_up(std::min(kCols, packed_n - j0), kL);
    const int64_t width = std::min(kCols, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kChunk) {
      panel_product(m, std::min(kChunk, k - p0), a + p0 * a_col, a_row, a_col, a_block,
                    panel + (row0 + p0) * ldo, ldo, width, alpha, p0 == 0 ? beta : 1.0f,
                    c + j0, ldc, c + j0, ldc);
    }
  }
  if (row_max != nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      const int64_t seen = std::clamp<int64_t>(visible + i, 0, n);
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < seen; ++j) best = c[i * ldc + j] > best ? c[i * ldc + j] : best;
      row_max[i] = best;  // (NaN skipped: it compares false)
    }
  }
}

// f32_gemm_rows's register block: Rows rows of C by 64 columns (4 vectors), 24 accumulators
// for 6 rows. Per step it loads 4 vectors of B and Rows broadcasts for 4·Rows FMAs, where the
// 8×2 block loads 2 and 8 for 16. On one Intel Xeon (model 207) thread the attention's P·V
// (16 or 64 rows of P by a head's V, 64 columns) ran 11 % faster in 6×4 blocks over V's own
// rows than in 8×2 blocks over V packed, and 4×4 blocks gained about three quarters of that.
constexpr int kWideRows = 6;
constexpr int kWideVecs = 4;
constexpr int64_t kWideCols = kWideVecs * kL;
// Steps per chunk of the sum: 128 rows of 64 columns of B (32 KiB) stay in the L1 cache for
// every row block. 256 (64 KiB) and 64 were 1-2 % and 2-5 % slower at the attention's shapes.
constexpr int64_t kWideChunk = 128;

template <int Rows>
ATTNLAB_F32 __attribute__((noinline)) void wide_block(int64_t k, const float* a, int64_t a_row,
                                                      int64_t a_col, const float* b, int64_t ldb,
                                                      float alpha, float beta, float* c,
                                                      int64_t ldc) {
  block<Rows, kWideVecs, false>(k, a, a_row, a_col, b, ldb, alpha, beta, c, ldc, c, ldc, 0xFFFF);
}

// f32_gemm_rows's product: B's rows read where they are, 64 columns at a time (kWideRows-row
// blocks, the rest of m in one smaller block), then any last 16, 32 or 48 columns by the 8×2
// panels. Each element's sum runs over the chunks in order. With lines owed (the weights'
// zeros and normalized copies, which the 8×2 blocks write as their sums run) every column goes
// to the 8×2 panels: 6×4 blocks that wrote them ran the need_weights forward at 1.4-1.7× the
// time without weights at (8, 8, 512, 64) and (2, 8, 2048, 64) on 2 Intel Xeon (model 207)
// threads, the 8×2 panels at 1.04-1.18× (and 6×4 blocks leaving the lines to the final
// flush at 1.12-1.19×).
ATTNLAB_F32 void f32_gemm_rows_avx512(bool trans_a, int64_t m, int64_t n, int64_t k,
                                      float alpha, const float* a, int64_t lda, const float* b,
                                      int64_t ldb, float beta, float* c, int64_t ldc,
                                      int64_t nonzero_k) {
  // op(A)[r, p] = a[r·a_row + p·a_col]
  const int64_t a_row = trans_a ? 1 : lda, a_col = trans_a ? lda : 1;
  int64_t j0 = 0;
  for (; j0 + kWideCols <= n && !deferred_lines.pending(); j0 += kWideCols) {
    for (int64_t p0 = 0; p0 < k; p0 += kWideChunk) {
      const int64_t steps = std::min(kWideChunk, k - p0);
      const float chunk_beta = p0 == 0 ? beta : 1.0f;  // later chunks add to the earlier ones
      const float* bp = b + p0 * ldb + j0;
      const float* ai = a + p0 * a_col;
      float* ci = c + j0;
      // The steps of this chunk that a block of `rows` rows from i0 needs (nonzero_k): none
      // past the chunk's start means nothing to add, except that the first chunk still
      // writes beta·C.
      const auto block_steps = [&](int64_t i0, int64_t rows) {
        return std::clamp<int64_t>(nonzero_k + i0 + rows - 1 - p0, 0, steps);
      };
      int64_t i0 = 0;
      for (; i0 + kWideRows <= m; i0 += kWideRows, ai += kWideRows * a_row, ci += kWideRows * ldc) {
        const int64_t s = block_steps(i0, kWideRows);
        if (s > 0 || p0 == 0) {
          wide_block<kWideRows>(s, ai, a_row, a_col, bp, ldb, alpha, chunk_beta, ci, ldc);
        }
      }
      static_assert(kWideRows == 6);
      switch (m - i0) {
#define ATTNLAB_WIDE_TAIL(R)                                                             \
  case R: {                                                                              \
    const int64_t s = block_steps(i0, R);                                                \
    if (s > 0 || p0 == 0) {                                                              \
      wide_block<R>(s, ai, a_row, a_col, bp, ldb, alpha, chunk_beta, ci, ldc);           \
    }                                                                                    \
    break;                                                                               \
  }
        ATTNLAB_WIDE_TAIL(5) ATTNLAB_WIDE_TAIL(4) ATTNLAB_WIDE_TAIL(3) ATTNLAB_WIDE_TAIL(2)
        ATTNLAB_WIDE_TAIL(1)
#undef ATTNLAB_WIDE_TAIL
        default: break;
      }
    }
  }
  for (; j0 < n; j0 += kF32PackedPanel) {
    const int64_t width = std::min(kF32PackedPanel, n - j0);
    // (the same chunks: each element's sum is bitwise the same by either route)
    for (int64_t p0 = 0; p0 < k; p0 += kWideChunk) {
      panel_product(m, std::min(kWideChunk, k - p0), a + p0 * a_col, a_row, a_col,
                    kRows * a_row, b + p0 * ldb + j0, ldb, width, alpha,
                    p0 == 0 ? beta : 1.0f, c + j0, ldc, c + j0, ldc);
    }
  }
}

ATTNLAB_F32 void f32_pack_b_avx512(bool trans_b, int64_t n, int64_t k, const float* b,
                                   int64_t ldb, float* packed) {
  constexpr int64_t kCols = kVecs * kL;
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t width = std::min(kCols, n - j0), ldo = round_up(width, kL);
    float* panel = packed + (j0 / kCols) * k * kCols;
    if (trans_b) {
      pack_transposed(b + j0 * ldb, ldb, k, width, panel, ldo);
    } else {
      pack_rows(b + j0, ldb, k, width, panel, ldo);
    }
  }
}

ATTNLAB_F32 void f32_gemm_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                 float alpha, const float* a, int64_t lda, const float* b,
                                 int64_t ldb, float beta, const float* d, int64_t ldd,
                                 float* c, int64_t ldc) {
  if (trans_a && k > kPackTransposedAFromK && n > kVecs * kL) {
    // op(A) = Aᵀ over a long sum: each step of a register block reads its 8 elements from
    // another row of A (lda apart), a cache line apiece, and every column panel reads them all
    // again. Packed once into row blocks of [k][kRows] they stream in order (one Intel Xeon
    // thread, 768×256×640 Aᵀ·B: 92-98 → 111-128 GFLOP/s, MKL's sgemm_ 140-147). With one
    // panel (n <= 32) A is read once either way and packing it only adds a pass: the encoder's
    // parameter gradients at the reversal shape (96×32×2048 Aᵀ·B and smaller), 0.328 → 0.283 ms
    // per thread.
    thread_local AlignedVector<float> packed_a;  // per thread, grown as needed
    const int64_t size = (m + kRows - 1) / kRows * kRows * k;
    if (static_cast<int64_t>(packed_a.size()) < size) packed_a.resize(size);
    pack_transposed_a(a, lda, m, k, packed_a.data());
    f32_gemm_panels<kVecs>(trans_b, m, n, k, alpha, packed_a.data(), 1, kRows, kRows * k, b,
                           ldb, beta, d, ldd, c, ldc);
    return;
  }
  const int64_t a_row = trans_a ? 1 : lda, a_col = trans_a ? lda : 1;
  f32_gemm_panels<kVecs>(trans_b, m, n, k, alpha, a, a_row, a_col, kRows * a_row, b, ldb, beta,
                         d, ldd, c, ldc);
}

ATTNLAB_F32 void f32_widen_rows_avx512(const uint16_t* src, int64_t ld, int64_t rows,
                                       int64_t cols, bool bf16, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * ld;
    float* d = dst + r * cols;
    for (int64_t c = 0; c < cols; c += kL) {
      const __mmask16 lanes = first_lanes(cols - c);
      const __m256i bits = _mm256_maskz_loadu_epi16(lanes, s + c);
      // (masked forms: the unmasked ones pass GCC 12 an uninitialized vector)
      const __m512 x =
          bf16 ? _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
                     lanes, _mm512_maskz_cvtepu16_epi32(lanes, bits), 16))
               : _mm512_maskz_cvtph_ps(lanes, bits);
      _mm512_mask_storeu_ps(d + c, lanes, x);
    }
  }
}

// dst[r·ld + c] = src[r·cols + c] rounded to bfloat16 or float16 (nearest, ties to even), as
// torch rounds; a NaN becomes the quiet NaN 0x7FC0 (as c10::BFloat16 does; torch's vectorized
// conversion writes 0xFFFF, also a NaN).
ATTNLAB_F32 void f32_narrow_rows_avx512(const float* src, int64_t rows, int64_t cols, bool bf16,
                                        uint16_t* dst, int64_t ld) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF);
  const __m512i quiet_nan = _mm512_set1_epi32(0x7FC0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * cols;
    uint16_t* d = dst + r * ld;
    for (int64_t c = 0; c < cols; c += kL) {
      const __mmask16 lanes = first_lanes(cols - c);
      const __m512 x = _mm512_maskz_loadu_ps(lanes, s + c);
      // (masked forms throughout, as in f32_widen_rows_avx512: GCC 12's unmasked ones start
      // from an uninitialized vector and warn)
      __m256i half;
      if (bf16) {
        const __m512i bits = _mm512_castps_si512(x);
        const __m512i lsb =
            _mm512_maskz_and_epi32(lanes, _mm512_maskz_srli_epi32(lanes, bits, 16), one);
        __m512i rounded = _mm512_maskz_srli_epi32(
            lanes,
            _mm512_maskz_add_epi32(lanes, bits, _mm512_maskz_add_epi32(lanes, bias, lsb)), 16);
        const __mmask16 nan = _mm512_mask_cmp_ps_mask(lanes, x, x, _CMP_UNORD_Q);
        rounded = _mm512_mask_mov_epi32(rounded, nan, quiet_nan);
        half = _mm512_maskz_cvtepi32_epi16(lanes, rounded);
      } else {
        half = _mm512_maskz_cvtps_ph(lanes, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      }
      _mm256_mask_storeu_epi16(d + c, lanes, half);
    }
  }
}

}  // namespace

bool f32_gemm_available() { return has_avx512_core(); }

void f32_defer_zeros(float* dst, int64_t count, int64_t rows, int64_t ld) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(dst) % 64 == 0 && count % kL == 0 && ld % kL == 0 &&
                  (rows <= 1 || ld >= count),
              "f32_defer_zeros: needs rows of whole 64-byte lines, got ", rows, " rows of ",
              count, " floats, ", ld, " apart, at ", static_cast<const void*>(dst));
  if (count > 0 && rows > 0) {
    deferred_lines.zeros.regions.push_back({dst, nullptr, 0, nullptr, count / kL, rows, ld});
  }
}

void f32_defer_scaled_rows(const float* src, int64_t lds, const float* factors, float* dst,
                           int64_t ld, int64_t count, int64_t rows) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(dst) % 64 == 0 &&
                  reinterpret_cast<uintptr_t>(src) % 64 == 0 && count % kL == 0 &&
                  ld % kL == 0 && lds % kL == 0 && (rows <= 1 || (ld >= count && lds >= count)),
              "f32_defer_scaled_rows: needs rows of whole 64-byte lines, got ", rows,
              " rows of ", count, " floats, ", ld, " apart at ", static_cast<const void*>(dst),
              " from rows ", lds, " apart at ", static_cast<const void*>(src));
  if (count > 0 && rows > 0) {
    deferred_lines.copies.regions.push_back({dst, src, lds, factors, count / kL, rows, ld});
  }
}

ATTNLAB_F32 void f32_flush_scaled_rows_avx512() {
  drain(deferred_lines.copies);
  _mm_sfence();
}

ATTNLAB_F32 void f32_flush_zeros_avx512() {
  drain(deferred_lines.copies);
  drain(deferred_lines.zeros);
  _mm_sfence();
}

void f32_flush_scaled_rows() {
  if (f32_gemm_available()) f32_flush_scaled_rows_avx512();  // (nothing can be owed elsewhere)
}

void f32_prefetch_rows(const void* first, int64_t rows, int64_t row_bytes, int64_t ld_bytes,
                       bool append) {
  PrefetchQueue& q = prefetch_queue;
  if (!append) {
    q.next = q.count = 0;
    prefetch_lines = PrefetchLines{};
  }
  if (first == nullptr || rows <= 0 || row_bytes <= 0) return;
  if (ld_bytes == row_bytes) {  // contiguous rows: one run
    row_bytes *= rows;
    rows = 1;
  }
  PrefetchLines pf;
  // From the line that holds the first byte to the one that holds the row's last.
  const auto start = reinterpret_cast<uintptr_t>(first) & ~uintptr_t(63);
  const int64_t row_lines =
      static_cast<int64_t>((reinterpret_cast<uintptr_t>(first) + row_bytes + 63 - start) / 64);
  pf.at = reinterpret_cast<const char*>(start);
  if (rows == 1) {
    pf.lines = row_lines;
  } else {
    pf.lines = pf.row_lines = row_lines;
    pf.rows = rows - 1;
    pf.skip = ld_bytes - row_lines * 64;
  }
  if (prefetch_lines.lines == 0) {
    prefetch_lines = pf;
  } else if (q.count < 4) {
    q.regions[q.count++] = pf;
  }
}

void f32_flush_zeros() {
  if (f32_gemm_available()) f32_flush_zeros_avx512();  // (nothing can be owed elsewhere)
}

void f32_narrow_rows(const float* src, int64_t rows, int64_t cols, bool bf16, uint16_t* dst,
                     int64_t ld) {
  f32_narrow_rows_avx512(src, rows, cols, bf16, dst, ld);
}

void f32_widen_rows(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, bool bf16,
                    float* dst) {
  f32_widen_rows_avx512(src, ld, rows, cols, bf16, dst);
}

void f32_pack_b(bool trans_b, int64_t n, int64_t k, const float* b, int64_t ldb,
                float* packed) {
  f32_pack_b_avx512(trans_b, n, k, b, ldb, packed);
}

void f32_gemm_rows(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                   int64_t nonzero_k) {
  TORCH_CHECK(n % kL == 0, "f32_gemm_rows: n must be a multiple of 16, got ", n);
  if (m <= 0 || n <= 0 || k <= 0) {  // empty products as f32_gemm has them
    f32_gemm(trans_a, false, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  f32_gemm_rows_avx512(trans_a, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nonzero_k);
}

void f32_gemm_packed(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* packed, int64_t packed_n, int64_t packed_k,
                     int64_t row0, float beta, float* c, int64_t ldc, float* row_max,
                     int64_t visible, bool skip_hidden) {
  TORCH_CHECK(row_max == nullptr || beta == 0.0f,
              "f32_gemm_packed: row_max is for products with beta = 0, got beta ", beta);
  if (m <= 0) return;
  if (n <= 0) {
    if (row_max != nullptr) {
      std::fill(row_max, row_max + m, -std::numeric_limits<float>::infinity());
    }
    return;
  }
  f32_gemm_packed_avx512(trans_a, m, n, k, alpha, a, lda, packed, packed_n,
                         packed_k * kF32PackedPanel, row0, beta, c, ldc, row_max, visible,
                         skip_hidden);
}

#else

bool f32_gemm_available() { return false; }

void f32_defer_zeros(float*, int64_t, int64_t, int64_t) {
  TORCH_CHECK(false, "f32_defer_zeros: needs f32_gemm_available()");
}

void f32_flush_zeros() {}

void f32_prefetch_rows(const void*, int64_t, int64_t, int64_t, bool) {}

void f32_defer_scaled_rows(const float*, int64_t, const float*, float*, int64_t, int64_t,
                           int64_t) {
  TORCH_CHECK(false, "f32_defer_scaled_rows: needs f32_gemm_available()");
}

void f32_flush_scaled_rows() {}

void f32_pack_b(bool, int64_t, int64_t, const float*, int64_t, float*) {}

void f32_gemm_rows(bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                   int64_t, float, float*, int64_t, int64_t) {
  TORCH_CHECK(false, "f32_gemm_rows: needs f32_gemm_available()");
}

void f32_gemm_packed(bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                     int64_t, int64_t, int64_t, float, float*, int64_t, float*, int64_t, bool) {}

void f32_widen_rows(const uint16_t*, int64_t, int64_t, int64_t, bool, float*) {}

void f32_narrow_rows(const float*, int64_t, int64_t, bool, uint16_t*, int64_t) {}

#endif

void f32_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
  f32_gemm_add(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, c, ldc);
}

void f32_gemm_add(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                  const float* d, int64_t ldd, float* c, int64_t ldc) {
  TORCH_CHECK(f32_gemm_available(), "f32_gemm: needs f32_gemm_available() (cpu::gemm picks the "
              "route for any CPU)");
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    empty_sum_product(m, n, beta, d, ldd, c, ldc);
    return;
  }
#ifdef ATTNLAB_HAVE_F32_KERNEL
  f32_gemm_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, d, ldd, c, ldc);
#endif
}

}  // namespace attnlab::cpu

#include "cpu/attention/attention_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>

#include "cpu/gemm/gemm.h"
#include "cpu/isa/isa.h"
#include "cpu/attention/small_attention.h"
#include "cpu/attention/small_sparse_attention.h"
#include "cpu/attention/softmax_rows.h"
#include "cpu/attention/sparse_rows.h"
#include "cpu/isa/task_ranges.h"
#include "cpu/isa/vec_math.h"

namespace attnlab::cpu {
namespace {

// Block sizes: a query block of Bq rows meets key blocks of Bk columns; the Bq×Bk score block
// stays in L2. Short sequences use one block so small problems are not split needlessly.
constexpr int64_t kForwardKeyBlock = 512;
static_assert(kForwardKeyBlock % kF32PackedPanel == 0);  // key blocks start on packed panels
constexpr int64_t kBackwardQueryBlock = 64;
// Rows per group where the causal mask cuts a forward key block (forward_online).
constexpr int64_t kCausalRowGroup = 16;
constexpr int64_t kBackwardKeyBlock = 128;
// Query rows per step of the backward where the causal mask cuts a key block (its diagonal):
// each step computes only the keys its last row sees, so smaller steps leave less of the hidden
// triangle computed (64-row steps computed 12 % more than the visible pairs at L = 512).
constexpr int64_t kBackwardDiagonalRows = 32;
static_assert(kBackwardQueryBlock % kBackwardDiagonalRows == 0);

int64_t forward_query_block(int64_t len_q) {
  if (len_q >= 768) return 256;
  if (len_q >= 192) return 64;
  return 32;
}

// With weights, a query block's scores are a [rows, L_k] slice of the weights tensor that the
// softmax and then P·V read again: rows are chosen so that the slice stays within about
// 512 KiB (half of a 1 MiB L2), down to 16 rows. Each block's GEMMs pack K and V anew, so fewer
// rows pack them more often: at (2, 8, 2048, 64) on 2 Zen 4 threads, 32-row blocks (256 KiB)
// made need_weights cost 1.27× the forward without weights, 64-row blocks 1.18×.
template <typename T>
int64_t weights_query_block(int64_t len_q, int64_t len_k) {
  int64_t rows = forward_query_block(len_q);
  while (rows > 16 && rows * len_k * static_cast<int64_t>(sizeof(T)) > (int64_t(512) << 10)) {
    rows /= 2;
  }
  return rows;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A sparse normalizer's forward holds a whole row of scores per query (the threshold needs all
// of them), and s beside it: query blocks of up to 64 rows, fewer for long rows so that both
// stay in L2.
int64_t sparse_query_block(int64_t len_k) {
  int64_t rows = 64;
  while (rows > 8 && rows * len_k > 32768) rows /= 2;
  return rows;
}
// The support lists replace dense P·V and S·V products unless they hold more than
// 1/kDenseFactor of the block's scores.
constexpr int64_t kDenseFactor = 4;
// Rows of at most this many keys skip the lists: P and S are made dense directly.
constexpr int64_t kShortRow = 64;
// A backward block with fewer than 1/kSparseBackwardFactor non-zeros is done entry by entry.
constexpr int64_t kSparseBackwardFactor = 8;

// The zeros a forward task deferred (f32_defer_zeros) written when it ends, by return or by
// exception.
struct ZerosFlushed {
  ~ZerosFlushed() { f32_flush_zeros(); }
};

// The blocked paths' GEMMs: gemm's contract, on bfloat16 products when the problem says its
// operands are bfloat16 (gemm_bf16_operands), else on T.
template <typename T>
void block_gemm(const AttentionProblem<T>& p, bool trans_a, bool trans_b, int64_t m, int64_t n,
                int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
                T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (p.bf16_operands) {
      gemm_bf16_operands(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
  }
  gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// A batch entry's K and V packed once for all of its query blocks (float32 products on
// attnlab's own GEMM, f32_gemm_packed), or null: the products then pack them per block.
struct PackedHead {
  const float* key = nullptr;    // op(B) = Kᵀ: dim_qk rows, len_k columns
  const float* value = nullptr;  // op(B) = V: len_k rows, dim_v columns
  // Or, for bfloat16 products (bf16_gemm_prepacked: AMX tiles or vdpbf16ps), the same two in
  // bfloat16 pairs with their leading dimensions.
  const uint32_t* key16 = nullptr;
  const uint32_t* value16 = nullptr;
  int64_t ld_key16 = 0, ld_value16 = 0;
  // And for bfloat16 inputs read as they are (reads_bf16), the query block's rows in bfloat16
  // from row query16_row0 on, ld_query16 apart, times the scale where that is a power of two;
  // query16_alpha is what the scores are still to be multiplied by (1 or the scale).
  const uint16_t* query16 = nullptr;
  int64_t ld_query16 = 0, query16_row0 = 0;
  float query16_alpha = 1.0f;
  // Or, instead of value, V's own rows, ld_value_rows apart (dim_v a multiple of 16:
  // f32_gemm_rows).
  const float* value_rows = nullptr;
  int64_t ld_value_rows = 0;
};

// Per thread: the packed K and V of the batch entry whose query blocks it is running, packed
// again only when the next task's entry has other K or V (tasks run in order, an entry's query
// blocks one after another).
class HeadPacker {
 public:
  // Whether the P·V products read V's rows in place (f32_gemm_rows) instead of a packed copy:
  // packing only copied them, a read and a write of every head's V per call.
  static bool values_in_place(const AttentionProblem<float>& p) {
    return p.dim_v % 16 == 0;
  }

  // id_k, id_v: what identifies the entry's K and V (their float rows by default; the
  // narrow inputs' rows when HeadWidener made the float ones, in buffers reused per entry).
  template <typename T>
  PackedHead get(const AttentionProblem<T>& p, int64_t b, const void* id_k = nullptr,
                 const void* id_v = nullptr) {
    if constexpr (std::is_same_v<T, float>) {
      const float* k = p.key.row(b, 0);
      const float* v = p.value.row(b, 0);
      if (id_k == nullptr) id_k = k;
      if (id_v == nullptr) id_v = v;
      if (id_k != key_ || id_v != value_) {  // (one format per problem: bf16_operands)
        if (p.bf16_operands) {
          pack_bf16(p, k, p.key.row_stride, v, p.value.row_stride);
        } else {
          keys_.resize(f32_packed_size(p.len_k, p.dim_qk));
          f32_pack_b(true, p.len_k, p.dim_qk, k, p.key.row_stride, keys_.data());
          if (!values_in_place(p)) {
            values_.resize(f32_packed_size(p.dim_v, p.len_k));
            f32_pack_b(false, p.dim_v, p.len_k, v, p.value.row_stride, values_.data());
          }
        }
        key_ = id_k;
        value_ = id_v;
      }
      if (p.bf16_operands) return packed_bf16(p);
      PackedHead packed{keys_.data()};
      if (values_in_place(p)) {
        packed.value_rows = v;
        packed.ld_value_rows = p.value.row_stride;
      } else {
        packed.value = values_.data();
      }
      return packed;
    } else {
      return {};
    }
  }

  // For reads_bf16: K and V packed from the bfloat16 inputs themselves, and the rows
  // [i0, i0 + rows) of Q copied (scaled) for the block's products.
  PackedHead get_bf16(const AttentionProblem<float>& p, int64_t b, int64_t i0, int64_t rows) {
    const uint16_t* k = p.key16.row(b, 0);
    const uint16_t* v = p.value16.row(b, 0);
    if (k != key_ || v != value_) {
      pack_bf16(p, k, p.key16.row_stride, v, p.value16.row_stride);
      key_ = k;
      value_ = v;
    }
    const bool exact = bf16_exact_scale(p.scale);
    const int64_t ld = (p.dim_qk + 1) / 2 * 2;
    if (static_cast<int64_t>(query16_.size()) < rows * ld) query16_.resize(rows * ld);
    bf16_pack_rows16(rows, p.dim_qk, exact ? p.scale : 1.0f, p.query16.row(b, i0),
                     p.query16.row_stride, query16_.data(), ld);
    PackedHead packed = packed_bf16(p);
    packed.query16 = query16_.data();
    packed.ld_query16 = ld;
    packed.query16_row0 = i0;
    packed.query16_alpha = exact ? 1.0f : p.scale;
    return packed;
  }

 private:
  // K and V (float32 or bfloat16 rows) packed into keys16_ and values16_.
  template <typename Src>
  void pack_bf16(const AttentionProblem<float>& p, const Src* k, int64_t ldk, const Src* v,
                 int64_t ldv) {
    keys16_.resize(bf16_packed_pairs(p.dim_qk, p.len_k));
    values16_.resize(bf16_packed_pairs(p.len_k, p.dim_v));
    bf16_pack_b(true, p.dim_qk, p.len_k, k, ldk, keys16_.data());
    bf16_pack_b(false, p.len_k, p.dim_v, v, ldv, values16_.data());
  }
  PackedHead packed_bf16(const AttentionProblem<float>& p) const {
    return {nullptr, nullptr, keys16_.data(), values16_.data(), bf16_packed_ld(p.len_k),
            bf16_packed_ld(p.dim_v)};
  }

  const void* key_ = nullptr;
  const void* value_ = nullptr;
  AlignedVector<float> keys_, values_;
  AlignedVector<uint32_t> keys16_, values16_;
  AlignedVector<uint16_t> query16_;
};

// Per thread, for AttentionProblem::narrow: the problem with the float16/bfloat16 Q, K and V of
// one batch entry widened into buffers (each widened again only when the next task's entry has
// other rows), at batch offsets of 0 so that row(b, r) of any entry reads them.
class HeadWidener {
 public:
  const AttentionProblem<float>& get(const AttentionProblem<float>& p, int64_t b) {
    if (zeros_.empty()) {
      local_ = p;
      zeros_.assign(p.batch, 0);
      q_.resize(p.len_q * p.dim_qk);
      k_.resize(p.len_k * p.dim_qk);
      v_.resize(p.len_k * p.dim_v);
      local_.query = {q_.data(), zeros_.data(), p.dim_qk};
      local_.key = {k_.data(), zeros_.data(), p.dim_qk};
      local_.value = {v_.data(), zeros_.data(), p.dim_v};
    }
    const bool bf16 = p.narrow == AttentionProblem<float>::Narrow::bfloat16;
    widen(p.query16, b, p.len_q, p.dim_qk, bf16, q_, query_);
    widen(p.key16, b, p.len_k, p.dim_qk, bf16, k_, key_);
    widen(p.value16, b, p.len_k, p.dim_v, bf16, v_, value_);
    return local_;
  }
  const void* key_id() const { return key_; }
  const void* value_id() const { return value_; }

 private:
  static void widen(const BatchedRows<uint16_t>& x, int64_t b, int64_t rows, int64_t cols,
                    bool bf16, AlignedVector<float>& out, const uint16_t*& current) {
    const uint16_t* src = x.row(b, 0);
    if (src == current) return;
    f32_widen_rows(src, x.row_stride, rows, cols, bf16, out.data());
    current = src;
  }

  AttentionProblem<float> local_;
  std::vector<int64_t> zeros_;
  AlignedVector<float> q_, k_, v_;
  const uint16_t* query_ = nullptr;
  const uint16_t* key_ = nullptr;
  const uint16_t* value_ = nullptr;
};

// Whether the blocked paths pack each head's (forward) or key block's (backward) operands once:
// float32 products on attnlab's AVX-512 GEMM (bfloat16 products keep their own packing).
template <typename T>
bool pack_heads(const AttentionProblem<T>& p) {
  return std::is_same_v<T, float> && f32_gemm_available() &&
         !(p.bf16_operands && bf16_gemm_available());
}

// Whether the forward packs each head's K and V once in bfloat16 (HeadPacker) for bfloat16
// products (AMX tiles through oneDNN's brgemm, or attnlab's vdpbf16ps blocks): packing them
// again for every product took about a fifth of a (8, 8, 512, 64) bfloat16 forward on an AMX
// Xeon (perf, one thread); on an AMD Zen 5 the vdpbf16ps forward took 0.72-0.94x the time
// with them packed once.
template <typename T>
bool pack_heads_bf16(const AttentionProblem<T>& p) {
  return std::is_same_v<T, float> && p.bf16_operands && bf16_prepacked_route();
}

// Whether the forward (without weights) reads bfloat16 inputs as they are: Q, K and V go
// into the products' layouts straight from their bfloat16 rows (HeadPacker::get_bf16) and the
// softmax writes P in bfloat16 (online_softmax_block_bf16), where widening the three to
// float32, then rounding them and P back took 11 % and 10 % of a (8, 8, 512, 64) bfloat16
// forward on an AMX Xeon (perf, one thread).
template <typename T>
bool reads_bf16(const AttentionProblem<T>& p, const T* weights) {
  return weights == nullptr && p.narrow == AttentionProblem<T>::Narrow::bfloat16 &&
         pack_heads_bf16(p);
}

// ld-strided scores [rows, cols] = scale·Q[i0 : i0 + rows]·K[j0 : j0 + cols]ᵀ (j0 a multiple of
// the packed panel width when packed). known_max (or null): per row, the largest score of its
// first clamp(visible + r, 0, cols) columns where the product found it in registers (float32
// products on packed heads), else NaN.
// skip_hidden (float32 products on packed heads, with known_max): row r's scores are wanted only
// up to its visible keys, and the products may leave the rest unwritten (f32_gemm_packed).
template <typename T>
void scores_gemm(const AttentionProblem<T>& p, const PackedHead& packed, int64_t b, int64_t i0,
                 int64_t rows, int64_t j0, int64_t cols, T* scores, int64_t ld,
                 T* known_max = nullptr, int64_t visible = kAllVisible,
                 bool skip_hidden = false) {
  // (NaN first: only the float32 products on packed heads find the maxima)
  if (known_max != nullptr) {
    std::fill(known_max, known_max + rows, std::numeric_limits<T>::quiet_NaN());
  }
  if constexpr (std::is_same_v<T, float>) {
    if (packed.query16) {
      bf16_gemm_prepacked16(rows, cols, p.dim_qk, packed.query16_alpha,
                            packed.query16 + (i0 - packed.query16_row0) * packed.ld_query16,
                            packed.ld_query16, packed.key16, packed.ld_key16, 0, j0, false,
                            scores, ld);
      return;
    }
    if (packed.key16) {
      bf16_gemm_prepacked(rows, cols, p.dim_qk, p.scale, p.query.row(b, i0), p.query.row_stride,
                          packed.key16, packed.ld_key16, 0, j0, false, scores, ld);
      return;
    }
    if (packed.key) {
      f32_gemm_packed(false, rows, cols, p.dim_qk, p.scale, p.query.row(b, i0),
                      p.query.row_stride, packed.key + j0 * p.dim_qk, p.len_k - j0, p.dim_qk, 0,
                      0.0f, scores, ld, known_max, visible, skip_hidden);
      return;
    }
  }
  block_gemm(p, false, true, rows, cols, p.dim_qk, p.scale, p.query.row(b, i0),
             p.query.row_stride, p.key.row(b, j0), p.key.row_stride, T(0), scores, ld);
}

// out [rows, dim_v] = probs [rows, cols] (row stride ldp)·V[j0 : j0 + cols] + beta·out, with
// probs16 (bfloat16 bits, same row stride) instead of probs where given (reads_bf16: beta 0 or
// 1, V packed in bfloat16). nonzero_k: row r's probabilities are zero from column
// nonzero_k + r on, which the products on V's rows in place skip (f32_gemm_rows).
template <typename T>
void values_gemm(const AttentionProblem<T>& p, const PackedHead& packed, int64_t b,
                 int64_t rows, int64_t j0, int64_t cols, const T* probs,
                 const uint16_t* probs16, int64_t ldp, T beta, T* out,
                 int64_t nonzero_k = kAllVisible) {
  if constexpr (std::is_same_v<T, float>) {
    if (probs16 != nullptr) {
      bf16_gemm_prepacked16(rows, p.dim_v, cols, 1.0f, probs16, ldp, packed.value16,
                            packed.ld_value16, j0, 0, beta == 1.0f, out, p.dim_v);
      return;
    }
    if (packed.value16 && (beta == 0.0f || beta == 1.0f) && j0 % 2 == 0) {
      bf16_gemm_prepacked(rows, p.dim_v, cols, 1.0f, probs, ldp, packed.value16,
                          packed.ld_value16, j0, 0, beta == 1.0f, out, p.dim_v);
      return;
    }
    if (packed.value) {
      f32_gemm_packed(false, rows, p.dim_v, cols, 1.0f, probs, ldp, packed.value, p.dim_v,
                      p.len_k, j0, beta, out, p.dim_v);
      return;
    }
    if (packed.value_rows) {
      f32_gemm_rows(false, rows, p.dim_v, cols, 1.0f, probs, ldp,
                    packed.value_rows + j0 * packed.ld_value_rows, packed.ld_value_rows, beta,
                    out, p.dim_v, nonzero_k);
      return;
    }
  }
  block_gemm(p, false, false, rows, p.dim_v, cols, T(1), probs, ldp, p.value.row(b, j0),
             p.value.row_stride, beta, out, p.dim_v);
}

// Keys a query block [i0, i0 + rows) can see: all, or under the causal mask those up to its
// last row.
template <typename T>
int64_t key_end(const AttentionProblem<T>& p, int64_t i0, int64_t rows) {
  return p.causal ? std::min(p.len_k, i0 + rows) : p.len_k;
}

template <typename T>
int64_t visible_base(const AttentionProblem<T>& p, int64_t i0, int64_t j0) {
  return p.causal ? i0 - j0 + 1 : kAllVisible;
}

template <typename T>
const T* mask_block(const AttentionProblem<T>& p, int64_t b, int64_t i0, int64_t j0) {
  return p.mask.data ? p.mask.row(b, i0) + j0 : nullptr;
}

// Per row: output *= kept / sum, and row_normalizers (kept: dropout's 1/(1 − p), or 1).
template <typename T>
void finish_rows(T* x, int64_t rows, int64_t cols, int64_t ld, const T* row_max,
                 const T* row_sum, T* inv_sum, T* lse, T kept) {
  row_normalizers(rows, row_max, row_sum, inv_sum, lse);
  if (kept != T(1)) {
    for (int64_t r = 0; r < rows; ++r) inv_sum[r] *= kept;
  }
  scale_rows(x, rows, cols, ld, inv_sum);
}

// Whether a forward with weights runs each query block in a per-thread buffer of
// block_q × len_k and streams the normalized weights out at the end (forward_with_weights).
template <typename T>
bool weights_through_buffer(int64_t block_q, int64_t len_k) {
  if constexpr (std::is_same_v<T, float>) {
    return can_stream_rows() && block_q * len_k * int64_t(sizeof(T)) <= (int64_t(1) << 20);
  } else {
    return false;
  }
}

// What this thread reads after the query rows [row, row + rows) of entry b, queued for the
// float32 scores' products to prefetch into L2 as they run (f32_prefetch_rows): Q's next rows
// (the next group's or task's, or the next entry's first), then the slice of the next entry's
// K and V that matches these rows, which that entry's first task packs. The query rows were
// read from beyond L2 by the products' first panel: on one Intel Xeon (model 207) thread the
// scores of 16-row groups ran at 0.70-0.75× MKL's rate with Q from memory and 0.90× with Q in
// L2. Prefetched as one burst before the products, the lines gained 3 % (the burst waits for
// fill buffers); a few after each panel of the products (f32_gemm.cpp), the (8, 8, 512, 64)
// forward took 0.91-0.96× the time, causal and not, on 1 and 2 threads (in-process
// alternation; (2, 8, 2048, 64) causal 0.92-1.01×).
template <typename T>
void prefetch_next(const AttentionProblem<T>& p, int64_t b, int64_t row, int64_t rows) {
  if constexpr (std::is_same_v<T, float>) {
    // Widened heads (narrow inputs) hold one entry at a time: only its own rows.
    const bool next_entry = b + 1 < p.batch && p.narrow == AttentionProblem<T>::Narrow::none;
    constexpr int64_t kBytes = sizeof(T);
    const int64_t next = row + rows;
    if (next < p.len_q) {
      f32_prefetch_rows(p.query.row(b, next), std::min(rows, p.len_q - next),
                        p.dim_qk * kBytes, p.query.row_stride * kBytes);
    } else if (next_entry) {
      f32_prefetch_rows(p.query.row(b + 1, 0), std::min(rows, p.len_q), p.dim_qk * kBytes,
                        p.query.row_stride * kBytes);
    } else {
      f32_prefetch_rows(nullptr, 0, 0, 0);
    }
    if (next_entry) {
      const int64_t k0 = p.len_k * row / p.len_q, k1 = p.len_k * next / p.len_q;
      f32_prefetch_rows(p.key.row(b + 1, k0), k1 - k0, p.dim_qk * kBytes,
                        p.key.row_stride * kBytes, true);
      f32_prefetch_rows(p.value.row(b + 1, k0), k1 - k0, p.dim_v * kBytes,
                        p.value.row_stride * kBytes, true);
    }
  }
}

// block: null, or a buffer of rows × len_k (weights_through_buffer). With it, the scores, the
// softmax and P·V stay in that buffer, which the thread reuses from block to block and so
// keeps in cache, and the weights tensor is written once, by non-temporal stores of the
// normalized rows: without it every line of the weights tensor was first read from memory
// (a store to a line not in cache reads it), 268 MB each way at (2, 8, 2048, 64). P·V then
// takes the unnormalized exp(s − max), and the output rows are divided by the sums after.
// dst: the block's rows of the weights, len_k apart. row_dot (nullable): each row's
// Σ e·(s − max) (online_softmax_block), from which the summaries take its entropy.
template <typename T>
void forward_with_weights(const AttentionProblem<T>& p, const PackedHead& packed, int64_t b,
                          int64_t i0, int64_t rows, T* out, T* lse, T* dst, T* row_max,
                          T* row_sum, T* scratch, T* block, T* known_max,
                          T* row_dot = nullptr) {
  // Without a buffer the weights block [rows, len_k] is the score buffer: one softmax pass,
  // no rescaling.
  T* const w = block != nullptr ? block : dst;
  const int64_t kv_end = key_end(p, i0, rows);
  // Under the causal mask (with packed heads) the products run in groups of rows, each only
  // up to the keys its last row sees, as in forward_online; the softmax reads no further and
  // zero-fills the rest of each row up to kv_end.
  const int64_t group =
      p.causal && (packed.key != nullptr || packed.key16 != nullptr) ? kCausalRowGroup : rows;
  const auto group_keys = [&](int64_t r0, int64_t g) {
    return p.causal ? std::min(kv_end, i0 + r0 + g) : kv_end;
  };
  const auto values_products = [&] {
    for (int64_t r0 = 0; r0 < rows; r0 += group) {
      const int64_t g = std::min(group, rows - r0);
      values_gemm(p, packed, b, g, 0, group_keys(r0, g), w + r0 * p.len_k, nullptr, p.len_k,
                  T(0), out + r0 * p.dim_v);
    }
  };
  // Without an additive mask the products also find each row's max (the causal mask is theirs
  // to apply: visible_base).
  const bool maxima = p.mask.data == nullptr;
  if (maxima) prefetch_next(p, b, i0, rows);
  for (int64_t r0 = 0; r0 < rows; r0 += group) {
    const int64_t g = std::min(group, rows - r0);
    scores_gemm(p, packed, b, i0 + r0, g, 0, group_keys(r0, g), w + r0 * p.len_k, p.len_k,
                maxima ? known_max + r0 : nullptr, visible_base(p, i0 + r0, 0));
  }
  online_softmax_block(w, rows, kv_end, p.len_k, mask_block(p, b, i0, 0), p.mask.row_stride,
                       visible_base(p, i0, 0), row_max, row_sum, scratch,
                       maxima ? known_max : nullptr, row_dot);
  // The sums are the undropped rows': the weights returned and multiplied are P ⊙ D.
  if (p.dropout.active()) {
    dropout_rows(p.dropout, b * p.len_q + i0, 0, w, rows, kv_end, p.len_k,
                 T(p.dropout.kept_scale()));
  }
  // On bfloat16 operands P·V also takes exp(s − max) before the normalization, as the online
  // path and torch's kernel do: a row's largest term is then 1, exact in bfloat16, where
  // rounding the normalized weight of a peaked row would cost its dominant term a rounding
  // error.
  const bool unnormalized_pv = p.bf16_operands || block != nullptr;
  if constexpr (std::is_same_v<T, float>) {
    // With a buffer (only where can_stream_rows: weights_through_buffer), rows of whole 64-byte
    // lines and float32 products, the normalized rows are written by P·V's products as they
    // run (f32_defer_scaled_rows), which overlaps their memory time with the arithmetic:
    // streamed after it, they made need_weights cost 1.31× the forward without weights at
    // (2, 8, 2048, 64) on 2 Intel Xeon threads. Under the causal mask each row's zeros past
    // kv_end (most of a row in the early query blocks) are left to this thread's later
    // products (f32_defer_zeros; the forward's tasks flush them): whole lines only, from the
    // first line boundary past kv_end.
    if (block != nullptr && p.len_k % kLanes<float> == 0 &&
        reinterpret_cast<uintptr_t>(dst) % 64 == 0 && f32_gemm_available()) {
      row_normalizers(rows, row_max, row_sum, scratch, lse);  // scratch: 1 / sum per row
      const int64_t zeros_from = ceil_div(kv_end, kLanes<float>) * kLanes<float>;
      for (int64_t r = 0; r < rows; ++r) {  // the copies' last lines: zeros past kv_end
        std::fill(w + r * p.len_k + kv_end, w + r * p.len_k + zeros_from, 0.0f);
      }
      struct CopiesFlushed {  // w and scratch are reused after this returns, or freed
        ~CopiesFlushed() { f32_flush_scaled_rows(); }
      } copies_flushed;
      f32_defer_scaled_rows(w, p.len_k, scratch, dst, p.len_k, zeros_from, rows);
      if (zeros_from < p.len_k) f32_defer_zeros(dst + zeros_from, p.len_k - zeros_from, rows, p.len_k);
      if (kv_end == 0) {
        std::fill(out, out + rows * p.dim_v, T(0));
      } else {
        values_products();
        scale_rows(out, rows, p.dim_v, p.dim_v, scratch);
      }
      return;
    }
  }
  if (kv_end == 0) {
    std::fill(out, out + rows * p.dim_v, T(0));
  } else if (unnormalized_pv) {
    values_products();
  }
  row_normalizers(rows, row_max, row_sum, scratch, lse);  // scratch: 1 / sum per row
  if (unnormalized_pv && kv_end > 0) scale_rows(out, rows, p.dim_v, p.dim_v, scratch);
  if constexpr (std::is_same_v<T, float>) {
    if (block != nullptr) {  // (only where can_stream_rows: weights_through_buffer)
      stream_scaled_rows(block, p.len_k, dst, p.len_k, rows, kv_end, p.len_k, scratch);
      return;
    }
  }
  scale_rows(w, rows, kv_end, p.len_k, scratch);
  for (int64_t r = 0; r < rows; ++r) std::fill(w + r * p.len_k + kv_end, w + (r + 1) * p.len_k, T(0));
  if (!unnormalized_pv && kv_end > 0) values_products();
}

// probs16: null, or for reads_bf16 a buffer like scores in which the softmax leaves P in
// bfloat16 for P·V.
template <typename T>
void forward_online(const AttentionProblem<T>& p, const PackedHead& packed, int64_t b,
                    int64_t i0, int64_t rows, T* out, T* lse, T* row_max, T* row_sum,
                    T* correction, T* scores, uint16_t* probs16, T* known_max) {
  // The output rows accumulate P·V; earlier blocks are rescaled when the row max grows.
  const int64_t kv_end = key_end(p, i0, rows);
  if (kv_end == 0) std::fill(out, out + rows * p.dim_v, T(0));
  for (int64_t j0 = 0; j0 < kv_end; j0 += kForwardKeyBlock) {
    const int64_t cols = std::min(kForwardKeyBlock, kv_end - j0);
    // A key block that the causal mask cuts (its last keys hidden from the block's first rows)
    // runs in groups of rows, each only up to its own last visible key: the hidden triangle
    // then costs about a group's width per row instead of the block's. Without packed heads
    // each group would pack its keys again, so only then.
    const bool cut = p.causal && (packed.key != nullptr || packed.key16 != nullptr) &&
                     i0 + 1 < j0 + cols;
    // On float32 products with V's rows in place and no additive mask, the block's rows go
    // in one product each way instead, whose blocks of rows skip what the causal mask hides
    // from all of their rows (scores_gemm's skip_hidden, values_gemm's nonzero_k). The groups
    // cost about as much in calls as they saved in products: 512 heads of one (64, 64) causal
    // block took 0.98-1.01× the time of the same without the mask with groups of 16 or none.
    // With one product each way, one AMD EPYC (Zen 5) thread, the causal forward's time over
    // the same problem's without the mask (benchmarks/blocked_kernel_cpu): (64, 512, 512, 64)
    // 0.570 → 0.555, with 32 features 0.63 → 0.61, (16, 2048, 2048, 64) 0.544 → 0.536.
    const bool skip = cut && packed.key != nullptr && packed.value_rows != nullptr &&
                      probs16 == nullptr && mask_block(p, b, i0, j0) == nullptr;
    const int64_t group = cut && !skip ? kCausalRowGroup : rows;
    for (int64_t r0 = 0; r0 < rows; r0 += group) {
      const int64_t g = std::min(group, rows - r0);
      const int64_t g_cols = p.causal ? std::min(cols, i0 + r0 + g - j0) : cols;
      if (g_cols <= 0) continue;  // rows that see none of this block (only when j0 > 0)
      T* s = scores + r0 * kForwardKeyBlock;
      T* o = out + r0 * p.dim_v;
      uint16_t* p16 = probs16 != nullptr ? probs16 + r0 * kForwardKeyBlock : nullptr;
      const T* mask = mask_block(p, b, i0 + r0, j0);
      const int64_t visible = visible_base(p, i0 + r0, j0);
      // Without an additive mask the products also find each row's max.
      T* maxima = mask == nullptr && p16 == nullptr ? known_max + r0 : nullptr;
      if (j0 == 0 && maxima != nullptr) prefetch_next(p, b, i0 + r0, g);
      scores_gemm(p, packed, b, i0 + r0, g, j0, g_cols, s, kForwardKeyBlock, maxima, visible,
                  skip);
      if constexpr (std::is_same_v<T, float>) {
        if (p16 != nullptr) {
          online_softmax_block_bf16(s, g, g_cols, kForwardKeyBlock, mask, p.mask.row_stride,
                                    visible, row_max + r0, row_sum + r0, correction + r0, p16,
                                    kForwardKeyBlock);
        }
      }
      if (p16 == nullptr) {
        online_softmax_block(s, g, g_cols, kForwardKeyBlock, mask, p.mask.row_stride, visible,
                             row_max + r0, row_sum + r0, correction + r0, maxima);
      }
      // Dropped weights leave P·V after their row sums; the kept ones' 1/(1 − p) comes with
      // the sums (finish_rows).
      if (p.dropout.active()) {
        if (p16 != nullptr) {
          dropout_rows(p.dropout, b * p.len_q + i0 + r0, j0, p16, g, g_cols, kForwardKeyBlock);
        } else {
          dropout_rows(p.dropout, b * p.len_q + i0 + r0, j0, s, g, g_cols, kForwardKeyBlock,
                       T(1));
        }
      }
      if (j0 > 0) scale_rows(o, g, p.dim_v, p.dim_v, correction + r0);
      values_gemm(p, packed, b, g, j0, g_cols, s, p16, kForwardKeyBlock, j0 > 0 ? T(1) : T(0),
                  o, skip ? visible : kAllVisible);
    }
  }
  finish_rows(out, rows, p.dim_v, p.dim_v, row_max, row_sum, correction, lse,
              p.dropout.active() ? T(p.dropout.kept_scale()) : T(1));
}

// Per thread, for a sparse normalizer's forward: a query block's scores (unless they go
// straight into the weights) with room for S below them, the support lists (at most every
// score) and one row's scratch.
template <typename T>
struct SparseBlock {
  SparseBlock(int64_t block_q, int64_t len_k, bool weights)
      : ld((std::max<int64_t>(len_k, 1) + kLanes<T> - 1) / kLanes<T> * kLanes<T>),
        scores(weights ? 0 : 2 * block_q * ld), list_p(block_q * ld), list_s(block_q * ld),
        cand(ld + 8), work(ld), index(block_q * ld), cand_key(ld), start(block_q),
        count(block_q), state(block_q) {}
  SupportLists<T> lists() {
    return {index.data(), list_p.data(), list_s.data(), start.data(), count.data(), state.data()};
  }
  RowScratch<T> scratch() { return {cand.data(), cand_key.data(), work.data()}; }
  int64_t ld;
  std::vector<T> scores, dense_s, stacked_out, list_p, list_s, cand, work;
  std::vector<int32_t> index, cand_key;
  std::vector<int64_t> start, count;
  std::vector<int8_t> state;
};

// Dropout on the support lists of rows row0 + r: p and s/Σs of dropped keys become zeros (they
// stay in the lists), kept ones are scaled by 1/(1 − p).
template <typename T>
void dropout_lists(const Dropout& d, int64_t row0, int64_t rows, const SupportLists<T>& lists) {
  const uint32_t threshold = d.threshold();
  const T kept = T(d.kept_scale());
  for (int64_t r = 0; r < rows; ++r) {
    if (lists.state[r] != kRowValues) continue;
    const uint32_t key = dropout_row_key(d.seed, row0 + r);
    for (int64_t e = lists.start[r], end = e + lists.count[r]; e < end; ++e) {
      const T factor = dropout_keeps(key, lists.index[e], threshold) ? kept : T(0);
      lists.p[e] *= factor;
      lists.s[e] *= factor;
    }
  }
}

// A query block under a sparse normalizer: whole rows of scores, their thresholds (tau), then
// P·V into out and S·V/ΣS into u, over the support lists when they are short, else as dense
// products (short rows: dense P and S directly). weights: null, or the block's rows of the
// weights, len_k apart.
template <typename T>
void forward_sparse(const AttentionProblem<T>& p, const SparseNormalizer& nz,
                    const PackedHead& packed, int64_t b, int64_t i0, int64_t rows, T* out, T* tau,
                    T* u, T* weights, SparseBlock<T>& sb) {
  const int64_t kv_end = key_end(p, i0, rows), ld = sb.ld;
  T* x = weights ? weights : sb.scores.data();
  const int64_t ldx = weights ? p.len_k : ld;
  if (kv_end == 0) {  // no key at all: zeros, τ = +inf
    std::fill(out, out + rows * p.dim_v, T(0));
    std::fill(u, u + rows * p.dim_v, T(0));
    std::fill(tau, tau + rows, std::numeric_limits<T>::infinity());
    if (weights) std::fill(x, x + rows * p.len_k, T(0));
    return;
  }
  scores_gemm(p, packed, b, i0, rows, 0, kv_end, x, ldx);
  const T* mask = mask_block(p, b, i0, 0);
  const int64_t visible = visible_base(p, i0, 0);
  const auto products = [&](const T* probs, int64_t ldp, const T* support) {
    values_gemm(p, packed, b, rows, 0, kv_end, probs, nullptr, ldp, T(0), out);
    values_gemm(p, packed, b, rows, 0, kv_end, support, nullptr, ld, T(0), u);
  };
  if (kv_end <= kShortRow) {
    // Without weights, S goes right below P in the scores buffer: [P; S]·V is one product.
    if (weights) sb.dense_s.resize(rows * ld);
    T* sup = weights ? sb.dense_s.data() : x + rows * ld;
    sparse_forward_rows_dense(x, ldx, sup, ld, rows, kv_end, mask, p.mask.row_stride, visible,
                              nz, tau, sb.scratch());
    if (p.dropout.active()) {  // P ⊙ D and (S/ΣS) ⊙ D
      const T kept = T(p.dropout.kept_scale());
      dropout_rows(p.dropout, b * p.len_q + i0, 0, x, rows, kv_end, ldx, kept);
      dropout_rows(p.dropout, b * p.len_q + i0, 0, sup, rows, kv_end, ld, kept);
    }
    if (weights) {
      for (int64_t r = 0; r < rows; ++r) std::fill(x + r * ldx + kv_end, x + (r + 1) * ldx, T(0));
      products(x, ldx, sup);
    } else {
      sb.stacked_out.resize(2 * rows * p.dim_v);
      values_gemm(p, packed, b, 2 * rows, 0, kv_end, x, nullptr, ld, T(0), sb.stacked_out.data());
      std::copy(sb.stacked_out.data(), sb.stacked_out.data() + rows * p.dim_v, out);
      std::copy(sb.stacked_out.data() + rows * p.dim_v,
                sb.stacked_out.data() + 2 * rows * p.dim_v, u);
    }
    return;
  }
  const SupportLists<T> lists = sb.lists();
  const int64_t nonzeros = sparse_forward_rows(x, ldx, rows, kv_end, mask, p.mask.row_stride,
                                               visible, nz, tau, sb.scratch(), lists);
  if (p.dropout.active()) dropout_lists(p.dropout, b * p.len_q + i0, rows, lists);
  if (weights) sparse_dense_rows(lists, rows, p.len_k, x, ldx, false);
  if (nonzeros * kDenseFactor > rows * kv_end) {
    sb.dense_s.resize(rows * ld);
    if (!weights) sparse_dense_rows(lists, rows, kv_end, x, ldx, false);
    sparse_dense_rows(lists, rows, kv_end, sb.dense_s.data(), ld, true);
    products(x, ldx, sb.dense_s.data());
  } else {
    sparse_gather_rows(lists, rows, p.value.row(b, 0), p.value.row_stride, p.dim_v, out, u);
  }
}

// The small kernels' next task, prefetched into L1 (its outputs for writing) before the current
// one runs, where a head's rows are slices of wider rows (the encoder block's token layout:
// one head's 64 features out of every 768) of at least 64 features. The hardware
// prefetchers do not follow rows 3 KiB apart, and the layer's GEMMs have pushed them out of
// L2. In the anomaly-shape layer on an AMD Zen 5 (64 entries × 4 heads × 10 rows, 64
// features): the attention's backward 1.34-1.46x and its forward 1.33-1.54x faster, the whole
// step 1.014-1.035x (in-process A/B, 40-200 rounds). Where it is left off: heads in
// contiguous rows (their next rows follow on, and measured no gain), and 32 features (the
// reversal-shape layer 0.98x: too little work per head to hide the prefetches' cost).
template <typename T>
bool prefetch_next_task(const AttentionProblem<T>& p) {
  constexpr int64_t kMinFeatures = 64;
  return p.query.row_stride > p.dim_qk && p.dim_qk >= kMinFeatures && p.dim_v >= kMinFeatures;
}

template <bool kWrite, typename T>
ATTNLAB_INLINE void prefetch_rows(const T* first, int64_t rows, int64_t width, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(first + r * ld);
    const uintptr_t end = begin + static_cast<uintptr_t>(width) * sizeof(T);
    for (uintptr_t line = begin & ~uintptr_t(63); line < end; line += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(line), kWrite ? 1 : 0, 3);
    }
  }
}

// Every key in one vector (the tutorials' L = 10 and 16): the whole row in registers, no BLAS
// and none of the blocked path's per-chunk buffers (without weights those include 64 KiB of
// zero-filled scores per chunk, which the small kernel never reads). Query blocks of block_q
// rows are the tasks; out's rows may lie anywhere (OutputRows).
template <typename T>
void small_forward(const AttentionProblem<T>& p, const OutputRows<T>& out, T* logsumexp,
                   T* weights, int64_t block_q) {
  const int64_t q_blocks = ceil_div(p.len_q, block_q);
  const bool prefetch = prefetch_next_task(p);
  parallel_tasks(p.batch * q_blocks, [&](const auto& next_task) {
    for (int64_t task = next_task(); task >= 0; task = next_task()) {
      const int64_t b = task / q_blocks, i0 = (task % q_blocks) * block_q;
      const int64_t rows = std::min(block_q, p.len_q - i0);
      if (prefetch && task + 1 < p.batch * q_blocks) {
        const int64_t nb = (task + 1) / q_blocks, ni = ((task + 1) % q_blocks) * block_q;
        const int64_t next_rows = std::min(block_q, p.len_q - ni);
        prefetch_rows<false>(p.query.row(nb, ni), next_rows, p.dim_qk, p.query.row_stride);
        if (nb != b) {
          prefetch_rows<false>(p.key.row(nb, 0), p.len_k, p.dim_qk, p.key.row_stride);
          prefetch_rows<false>(p.value.row(nb, 0), p.len_k, p.dim_v, p.value.row_stride);
        }
        prefetch_rows<true>(out.row(nb, ni), next_rows, p.dim_v, out.row_stride);
      }
      small_attention_rows(rows, p.len_k, p.dim_qk, p.dim_v, p.query.row(b, i0),
                           p.query.row_stride, p.key.row(b, 0), p.key.row_stride,
                           p.value.row(b, 0), p.value.row_stride, mask_block(p, b, i0, 0),
                           p.mask.row_stride, visible_base(p, i0, 0), p.scale, out.row(b, i0),
                           out.row_stride, logsumexp + b * p.len_q + i0,
                           weights ? weights + (b * p.len_q + i0) * p.len_k : nullptr, p.len_k,
                           p.dropout.active() ? &p.dropout : nullptr, b * p.len_q + i0);
    }
  });
}

// The small kernel's backward, one batch entry per task: it takes the deltas from its own P
// and dP (no pass over dO and O, so the forward's output is never read).
template <typename T>
void small_backward(const AttentionProblem<T>& p, const BatchedRows<T>& grad_output,
                    const T* logsumexp, const T* weights, const OutputRows<T>& grad_query,
                    const OutputRows<T>& grad_key, const OutputRows<T>& grad_value,
                    T* grad_mask, T* grad_weights) {
  const bool prefetch = prefetch_next_task(p);
  parallel_tasks(p.batch, [&](const auto& next_task) {
    for (int64_t b = next_task(); b >= 0; b = next_task()) {
      const int64_t rows = b * p.len_q;
      if (prefetch && b + 1 < p.batch) {
        prefetch_rows<false>(p.query.row(b + 1, 0), p.len_q, p.dim_qk, p.query.row_stride);
        prefetch_rows<false>(p.key.row(b + 1, 0), p.len_k, p.dim_qk, p.key.row_stride);
        prefetch_rows<false>(p.value.row(b + 1, 0), p.len_k, p.dim_v, p.value.row_stride);
        prefetch_rows<false>(grad_output.row(b + 1, 0), p.len_q, p.dim_v, grad_output.row_stride);
        prefetch_rows<true>(grad_query.row(b + 1, 0), p.len_q, p.dim_qk, grad_query.row_stride);
        prefetch_rows<true>(grad_key.row(b + 1, 0), p.len_k, p.dim_qk, grad_key.row_stride);
        prefetch_rows<true>(grad_value.row(b + 1, 0), p.len_k, p.dim_v, grad_value.row_stride);
      }
      small_attention_backward(
          p.len_q, p.len_k, p.dim_qk, p.dim_v, p.query.row(b, 0), p.query.row_stride,
          p.key.row(b, 0), p.key.row_stride, p.value.row(b, 0), p.value.row_stride,
          mask_block(p, b, 0, 0), p.mask.row_stride, visible_base(p, 0, 0), p.scale,
          grad_output.row(b, 0), grad_output.row_stride, logsumexp + rows,
          weights ? weights + rows * p.len_k : nullptr, grad_query.row(b, 0),
          grad_query.row_stride, grad_key.row(b, 0), grad_key.row_stride, grad_value.row(b, 0),
          grad_value.row_stride, grad_mask ? grad_mask + rows * p.len_k : nullptr,
          grad_weights ? grad_weights + rows * p.len_k : nullptr,
          p.dropout.active() ? &p.dropout : nullptr, rows);
    }
  });
}

}  // namespace

bool forward_widens_heads(int64_t len_k, int64_t dim_qk, int64_t dim_v) {
  return f32_gemm_available() && len_k > 0 &&
         !small_attention_fits<float>(len_k, dim_qk, dim_v);
}

template <typename T>
bool weights_undropped_fit(int64_t len_k, int64_t dim_qk, int64_t dim_v) {
  return len_k > 0 && small_attention_fits<T>(len_k, dim_qk, dim_v);
}

template <typename T>
bool attention_is_small(const AttentionProblem<T>& p) {
  return p.alpha == 1 && p.len_q > 0 && p.len_k > 0 &&
         small_attention_fits<T>(p.len_k, p.dim_qk, p.dim_v) &&
         p.len_q <= kSmallBackwardMaxRows && p.narrow == AttentionProblem<T>::Narrow::none;
}

template <typename T>
void attention_forward_rows(const AttentionProblem<T>& p, const OutputRows<T>& output,
                            T* logsumexp) {
  TORCH_CHECK(attention_is_small(p), "attention_forward_rows: the problem is not small");
  small_forward(p, output, logsumexp, static_cast<T*>(nullptr), forward_query_block(p.len_q));
}

template <typename T>
void attention_backward_rows(const AttentionProblem<T>& p, const BatchedRows<T>& grad_output,
                             const T* logsumexp, const OutputRows<T>& grad_query,
                             const OutputRows<T>& grad_key, const OutputRows<T>& grad_value) {
  TORCH_CHECK(attention_is_small(p), "attention_backward_rows: the problem is not small");
  small_backward(p, grad_output, logsumexp, static_cast<const T*>(nullptr), grad_query, grad_key,
                 grad_value, static_cast<T*>(nullptr), static_cast<T*>(nullptr));
}

template <typename T>
void attention_forward(const AttentionProblem<T>& p, T* output, T* row_stat, T* weights,
                       uint16_t* output16, T* support_value,
                       const WeightSummaries<T>* summaries) {
  const bool sparse = p.alpha != 1;
  TORCH_CHECK(!sparse || ((support_value != nullptr || p.batch * p.len_q * p.dim_v == 0) &&
                          !p.bf16_operands &&
                          p.narrow == AttentionProblem<T>::Narrow::none),
              "attention_forward: a sparse normalizer needs support_value and wide inputs");
  TORCH_CHECK(summaries == nullptr ||
                  (weights == nullptr && output16 == nullptr && !p.bf16_operands &&
                   p.narrow == AttentionProblem<T>::Narrow::none),
              "attention_forward: summaries replace the weights, on wide inputs");
  // With summaries each block's weights go to a buffer of the thread's, as they would to the
  // weights tensor.
  const bool rows_of_weights = weights != nullptr || summaries != nullptr;
  const int64_t block_q =
      sparse             ? std::min(sparse_query_block(p.len_k), std::max<int64_t>(p.len_q, 1))
      : rows_of_weights  ? weights_query_block<T>(p.len_q, p.len_k)
                         : forward_query_block(p.len_q);
  const int64_t q_blocks = ceil_div(p.len_q, block_q);
  // Every key in one vector (the tutorials' L = 10 and 16): the whole row in registers. The
  // summaries take the blocked path at every size, and so does dropout for a sparse normalizer.
  const bool small = p.len_k > 0 && summaries == nullptr && (!sparse || !p.dropout.active()) &&
                     small_attention_fits<T>(p.len_k, p.dim_qk, p.dim_v);
  TORCH_CHECK(!p.dropout.weights_undropped || weights == nullptr || (small && !sparse),
              "attention_forward: weights before dropout are written by the small kernels only");
  TORCH_CHECK(output16 == nullptr || (!small && p.narrow != AttentionProblem<T>::Narrow::none &&
                                      f32_gemm_available() && !sparse),
              "attention_forward: output16 is for narrow softmax problems on the blocked path");
  if (small && sparse) {
    parallel_tasks(p.batch * q_blocks, [&](const auto& next_task) {
      for (int64_t task = next_task(); task >= 0; task = next_task()) {
        const int64_t b = task / q_blocks, i0 = (task % q_blocks) * block_q;
        const int64_t rows = std::min(block_q, p.len_q - i0);
        small_sparse_rows(p.alpha, rows, p.len_k, p.dim_qk, p.dim_v, p.query.row(b, i0),
                          p.query.row_stride, p.key.row(b, 0), p.key.row_stride,
                          p.value.row(b, 0), p.value.row_stride, mask_block(p, b, i0, 0),
                          p.mask.row_stride, visible_base(p, i0, 0), p.scale,
                          output + (b * p.len_q + i0) * p.dim_v, row_stat + b * p.len_q + i0,
                          support_value + (b * p.len_q + i0) * p.dim_v,
                          weights ? weights + (b * p.len_q + i0) * p.len_k : nullptr, p.len_k);
      }
    });
    return;
  }
  if (small) {
    std::vector<int64_t> offsets(p.batch);
    for (int64_t b = 0; b < p.batch; ++b) offsets[b] = b * p.len_q * p.dim_v;
    small_forward(p, OutputRows<T>{output, offsets.data(), p.dim_v}, row_stat, weights,
                  block_q);
    return;
  }
  std::mutex summaries_mutex;
  parallel_tasks(p.batch * q_blocks, [&](const auto& next_task) {
    SequentialBlasScope sequential_blas;
    ZerosFlushed zeros_flushed;  // the weights' deferred zeros written before the task ends
    AlignedVector<T> summary_rows(summaries != nullptr ? block_q * p.len_k : 0);
    // Softmax rows' entropies from the exps as they are made (online_softmax_block's row_dot):
    // a log per weight afterwards cost 0.65× the forward's own time at (1, 1, 4096, 64).
    const bool entropy_from_dots = summaries != nullptr && summaries->entropy != nullptr && !sparse;
    std::vector<T> row_dot(entropy_from_dots ? block_q : 0), entropies(row_dot.size());
    SummaryPartials<T> partials;
    if (summaries != nullptr) partials = summary_partials(*summaries, p.batch, p.len_q, p.len_k);
    std::vector<T> row_max(block_q), row_sum(block_q), correction(block_q), known_max(block_q);
    AlignedVector<T> scores(weights || sparse ? 0 : block_q * kForwardKeyBlock);
    AlignedVector<T> weights_block(weights && !sparse &&
                                           weights_through_buffer<T>(block_q, p.len_k)
                                       ? block_q * p.len_k
                                       : 0);
    std::optional<SparseBlock<T>> sparse_block;
    if (sparse) sparse_block.emplace(block_q, p.len_k, weights != nullptr);
    const SparseNormalizer nz = sparse ? sparse_normalizer(p.alpha) : SparseNormalizer{};
    HeadPacker packer;
    const bool packing = pack_heads(p) || pack_heads_bf16(p);
    const bool bf16_inputs = reads_bf16(p, weights);
    AlignedVector<uint16_t> probs16(bf16_inputs ? block_q * kForwardKeyBlock : 0);
    HeadWidener widener;
    // With output16 each block's rows are made here and rounded into it (instead of a float32
    // output that torch's copy rounded afterwards: 7 % of a bfloat16 (8, 8, 512, 64) forward).
    AlignedVector<T> out_rows(output16 != nullptr ? block_q * p.dim_v : 0);
    for (int64_t task = next_task(); task >= 0; task = next_task()) {
      const int64_t b = task / q_blocks, i0 = (task % q_blocks) * block_q;
      const AttentionProblem<T>* head = &p;
      PackedHead packed{};
      const int64_t rows = std::min(block_q, p.len_q - i0);
      if constexpr (std::is_same_v<T, float>) {
        if (bf16_inputs) {
          packed = packer.get_bf16(p, b, i0, rows);
        } else if (p.narrow != AttentionProblem<T>::Narrow::none) {
          head = &widener.get(p, b);
          packed = packer.get(*head, b, widener.key_id(), widener.value_id());
        } else if (packing) {
          packed = packer.get(p, b);
        }
      } else if (packing) {
        packed = packer.get(p, b);
      }
      T* out = output16 != nullptr ? out_rows.data() : output + (b * p.len_q + i0) * p.dim_v;
      T* lse = row_stat + b * p.len_q + i0;
      // A sparse normalizer's rows long enough for support lists are summarized from the
      // lists, never made dense (forward_sparse's kShortRow).
      const bool summary_lists = summaries != nullptr && sparse && key_end(p, i0, rows) > kShortRow;
      T* const weight_rows = summary_lists        ? nullptr
                             : summaries != nullptr ? summary_rows.data()
                             : weights != nullptr ? weights + (b * p.len_q + i0) * p.len_k
                                                  : nullptr;
      if (sparse) {
        forward_sparse(p, nz, packed, b, i0, rows, out, lse,
                       support_value + (b * p.len_q + i0) * p.dim_v, weight_rows,
                       *sparse_block);
      } else {
        std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<T>::infinity());
        std::fill(row_sum.begin(), row_sum.end(), T(0));
        if (weight_rows != nullptr) {
          forward_with_weights(*head, packed, b, i0, rows, out, lse, weight_rows,
                               row_max.data(), row_sum.data(), correction.data(),
                               weights_block.empty() ? nullptr : weights_block.data(),
                               known_max.data(), entropy_from_dots ? row_dot.data() : nullptr);
          for (int64_t r = 0; entropy_from_dots && r < rows; ++r) {
            // H = −Σ p·log p with p = e / S, log p = (s − max) − log S.
            const T sum = row_sum[r];
            entropies[r] = sum > T(0) ? std::log(sum) - row_dot[r] / sum : T(0);
          }
        } else {
          forward_online(*head, packed, b, i0, rows, out, lse, row_max.data(), row_sum.data(),
                         correction.data(), scores.data(),
                         probs16.empty() ? nullptr : probs16.data(), known_max.data());
        }
      }
      if constexpr (std::is_same_v<T, float>) {
        if (output16 != nullptr) {
          f32_narrow_rows(out, rows, p.dim_v, p.narrow == AttentionProblem<T>::Narrow::bfloat16,
                          output16 + (b * p.len_q + i0) * p.dim_v, p.dim_v);
        }
      }
      if (summary_lists) {
        summarize_lists(*summaries, p.len_q, p.len_k, b, i0, rows, sparse_block->lists(),
                        partials);
      } else if (summaries != nullptr) {
        summarize_rows(*summaries, p.len_q, p.len_k, b, i0, rows, summary_rows.data(), p.len_k,
                       partials, entropy_from_dots ? entropies.data() : nullptr);
      }
    }
    if (packing && pack_heads_bf16(p)) bf16_prepacked_release();
    if (summaries != nullptr) {
      std::lock_guard<std::mutex> lock(summaries_mutex);
      summary_partials_add(*summaries, partials);
    }
  });
}

template <typename T>
void attention_backward(const AttentionProblem<T>& p, const BatchedRows<T>& grad_output,
                        const T* row_values, const T* row_stat, const T* weights, T* grad_query,
                        T* grad_key, T* grad_value, T* grad_mask, T* grad_weights,
                        const T* weights_grad) {
  const int64_t E = p.dim_qk, Ev = p.dim_v;
  const bool sparse = p.alpha != 1;
  const SparseNormalizer nz = sparse ? sparse_normalizer(p.alpha) : SparseNormalizer{};
  TORCH_CHECK(weights_grad == nullptr || weights != nullptr,
              "attention_backward: a gradient of the weights needs the forward's weights");
  const bool dropout = p.dropout.active();
  // The weights' gradient adds Σ_j s_ij·D_ij·G_ij / Σ_j s_ij to a sparse row term, whose Σ s
  // runs over the dropped keys too: the returned weights P ⊙ D do not hold it.
  TORCH_CHECK_NOT_IMPLEMENTED(
      !(dropout && sparse && weights_grad != nullptr),
      "attnlab.scaled_dot_product_attention: a loss on the weights of a sparse normalizer "
      "with dropout_p > 0 is not differentiated; detach the weights, or use dropout_p=0");
  // With dropout the forward's weights are P ⊙ D: the blocks recompute P, and read the weights
  // only for the softmax row term of a gradient at them (Σ_j P_ij·D_ij·G_ij).
  const T* probs_kept = dropout && !p.dropout.weights_undropped ? nullptr : weights;
  // Every key in one vector: one register-resident pass per batch entry, which writes every
  // element of the gradients (no zero fill first: at the tutorials' shapes filling them cost
  // about as much as the kernel's arithmetic). A gradient of the weights takes the blocked
  // path (the small kernels keep dP in registers).
  const bool small = weights_grad == nullptr && (!sparse || !dropout) &&
                     (sparse ? p.len_q > 0 && p.len_q <= kSmallBackwardMaxRows &&
                                   small_sparse_fits<T>(p.alpha, p.len_k, E, Ev) && !grad_weights
                             : attention_is_small(p));
  // The blocked path's tasks zero their own parts of dQ, dK and dV just before they add to
  // them (in parallel, and in cache for the additions that follow).
  if (!small && grad_mask) {
    std::fill(grad_mask, grad_mask + p.batch * p.len_q * p.len_k, T(0));
  }
  if (p.batch == 0) return;  // an empty batch: nothing to add (and no chunks per entry below)

  if (small && !sparse) {
    std::vector<int64_t> q_offsets(p.batch), k_offsets(p.batch), v_offsets(p.batch);
    for (int64_t b = 0; b < p.batch; ++b) {
      q_offsets[b] = b * p.len_q * E;
      k_offsets[b] = b * p.len_k * E;
      v_offsets[b] = b * p.len_k * Ev;
    }
    small_backward(p, grad_output, row_stat, probs_kept,
                   OutputRows<T>{grad_query, q_offsets.data(), E},
                   OutputRows<T>{grad_key, k_offsets.data(), E},
                   OutputRows<T>{grad_value, v_offsets.data(), Ev}, grad_mask, grad_weights);
    return;
  }

  // delta_i = dO_i·O_i = Σ_j P_ij·dP_ij for softmax, dO_i·U_i = Σ_j s_ij·dP_ij / Σ_j s_ij for
  // a sparse normalizer: the gradient's row term.
  std::vector<T> delta(p.batch * p.len_q);
  at::parallel_for(0, p.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      row_dots(grad_output.row(b, 0), grad_output.row_stride, row_values + b * p.len_q * Ev, Ev,
               p.len_q, Ev, delta.data() + b * p.len_q);
      if (weights_grad == nullptr) continue;
      // A gradient G at the weights adds Σ_j P_ij·G_ij (softmax) or Σ_j s_ij·G_ij / Σ_j s_ij
      // to the row term, as dP does (s = p^{2−α}, sparse_support_from_probs). A sparse row
      // reads G only in the chunks of keys where p has a non-zero: both are L² in memory, and
      // G mostly unread halves this pass's traffic.
      constexpr int64_t kChunk = 64;
      T support_chunk[kChunk];
      for (int64_t i = 0; i < p.len_q; ++i) {
        const T* pw = weights + (b * p.len_q + i) * p.len_k;
        const T* g = weights_grad + (b * p.len_q + i) * p.len_k;
        if (!sparse) {
          T sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < p.len_k; ++j) sum += pw[j] * g[j];
          delta[b * p.len_q + i] += sum;
          continue;
        }
        T weighted = 0, total = 0;
        for (int64_t j0 = 0; j0 < p.len_k; j0 += kChunk) {
          const int64_t n = std::min(kChunk, p.len_k - j0);
          if (sparse_support_from_probs(pw + j0, n, support_chunk, n, 1, n, nz) == 0) continue;
#pragma omp simd reduction(+ : weighted, total)
          for (int64_t j = 0; j < n; ++j) {
            weighted += support_chunk[j] * g[j0 + j];
            total += support_chunk[j];
          }
        }
        if (total > 0) delta[b * p.len_q + i] += weighted / total;
      }
    }
  });
  if (small) {
    parallel_tasks(p.batch, [&](const auto& next_task) {
      for (int64_t b = next_task(); b >= 0; b = next_task()) {
        const int64_t rows = b * p.len_q;
        small_sparse_backward(
            p.alpha, p.len_q, p.len_k, E, Ev, p.query.row(b, 0), p.query.row_stride,
            p.key.row(b, 0), p.key.row_stride, p.value.row(b, 0), p.value.row_stride,
            mask_block(p, b, 0, 0), p.mask.row_stride, visible_base(p, 0, 0), p.scale,
            grad_output.row(b, 0), grad_output.row_stride, row_stat + rows, delta.data() + rows,
            weights ? weights + rows * p.len_k : nullptr, grad_query + rows * E,
            grad_key + b * p.len_k * E, grad_value + b * p.len_k * Ev,
            grad_mask ? grad_mask + rows * p.len_k : nullptr);
      }
    });
    return;
  }

  // Each task owns the key blocks of one chunk of one batch entry, so dK and dV need no
  // synchronisation. dQ sums over key blocks: with one chunk per batch entry it goes straight
  // to grad_query; when there are fewer batch entries than threads, the keys are split into
  // chunks whose dQ parts are summed at the end.
  const int64_t k_blocks = ceil_div(p.len_k, kBackwardKeyBlock);
  const int64_t threads = at::get_num_threads();
  const int64_t chunks =
      p.batch >= threads ? 1 : std::max<int64_t>(1, std::min(k_blocks, ceil_div(threads, p.batch)));
  const int64_t dq_size = p.batch * p.len_q * E;
  std::vector<T> dq_parts((chunks - 1) * dq_size, T(0));

  parallel_tasks(p.batch * chunks, [&](const auto& next_task) {
    SequentialBlasScope sequential_blas;
    AlignedVector<T> probs(probs_kept ? 0 : kBackwardQueryBlock * kBackwardKeyBlock);
    AlignedVector<T> dprobs(kBackwardQueryBlock * kBackwardKeyBlock);
    // With dropout: P ⊙ D, which dV takes.
    AlignedVector<T> dropped(dropout ? kBackwardQueryBlock * kBackwardKeyBlock : 0);
    // A sparse normalizer's s = p^{2−α}, which takes P's place in dS.
    AlignedVector<T> support(sparse ? kBackwardQueryBlock * kBackwardKeyBlock : 0);
    constexpr int64_t ld = kBackwardKeyBlock;
    // The key block's operands that every query block multiplies by (Kᵀ for S, Vᵀ for dP, and
    // K for dQ where the products cannot read it in place), packed once per key block instead of
    // once per product.
    const bool packing = pack_heads(p);
    // dV, dK and dQ read dO, Q and K where they are (f32_gemm_rows) instead of packing K for
    // dQ and dO and Q inside each product: (8, 8, 512, 64) and (2, 8, 2048, 64) forward +
    // backward 0.95-0.97× the time on 2 Intel Xeon (model 207) threads, gradients bitwise
    // the same (each sum still runs in order over the same steps).
    const bool in_place = packing && E % 16 == 0 && Ev % 16 == 0;
    AlignedVector<float> keys_t, values_t, keys_n;
    if (packing) {
      keys_t.resize(f32_packed_size(kBackwardKeyBlock, E));
      values_t.resize(f32_packed_size(kBackwardKeyBlock, Ev));
      if (!in_place) keys_n.resize(f32_packed_size(E, kBackwardKeyBlock));
    }
    // C [m, n] = alpha·op(A)·B + beta·C with B's rows ldb apart.
    const auto rows_product = [&](bool trans_a, int64_t m, int64_t n, int64_t k, T alpha,
                                  const T* a, int64_t lda, const T* b_rows, int64_t ldb, T beta,
                                  T* c, int64_t ldc) {
      if constexpr (std::is_same_v<T, float>) {
        if (in_place) {
          f32_gemm_rows(trans_a, m, n, k, alpha, a, lda, b_rows, ldb, beta, c, ldc);
          return;
        }
      }
      block_gemm(p, trans_a, false, m, n, k, alpha, a, lda, b_rows, ldb, beta, c, ldc);
    };
    // C [rows, n] = alpha·A·P + beta·C for P the first k rows and n columns of one of the
    // packed operands (packed_n columns, packed_k rows) when packing, else block_gemm of
    // op(B) = Bᵀ (trans_b) or B.
    const auto product = [&](const float* packed, int64_t packed_n, int64_t packed_k,
                             bool trans_b, int64_t rows, int64_t n, int64_t k, T alpha,
                             const T* a, int64_t lda, const T* b_rows, int64_t ldb, T beta, T* c,
                             int64_t ldc) {
      if constexpr (std::is_same_v<T, float>) {
        if (packing) {
          f32_gemm_packed(false, rows, n, k, alpha, a, lda, packed, packed_n, packed_k, 0, beta,
                          c, ldc);
          return;
        }
      }
      block_gemm(p, false, trans_b, rows, n, k, alpha, a, lda, b_rows, ldb, beta, c, ldc);
    };
    for (int64_t task = next_task(); task >= 0; task = next_task()) {
      const int64_t b = task / chunks, chunk = task % chunks;
      T* dq = (chunk == 0 ? grad_query : dq_parts.data() + (chunk - 1) * dq_size) +
              b * p.len_q * E;
      // dQ is written by the first key block's products (every query row sees key 0, causal
      // or not) and summed into by the others: no zero-fill first (with dK and dV below, the
      // fills were 3 % of a (8, 8, 512, 64) causal forward+backward). A sparse normalizer's
      // blocks may skip their products (no non-zero p) or add entry by entry.
      const bool dq_written_first = chunk == 0 && k_blocks > 0 && !sparse;
      if (chunk == 0 && !dq_written_first) std::fill(dq, dq + p.len_q * E, T(0));
      const int64_t first_block = chunk * k_blocks / chunks;
      const int64_t last_block = (chunk + 1) * k_blocks / chunks;
      for (int64_t kb = first_block; kb < last_block; ++kb) {
        const int64_t j0 = kb * kBackwardKeyBlock;
        const int64_t cols = std::min(kBackwardKeyBlock, p.len_k - j0);
        T* dk = grad_key + (b * p.len_k + j0) * E;
        T* dv = grad_value + (b * p.len_k + j0) * Ev;
        // Rows of dK and dV [0, written) hold their sums so far: the first products write
        // theirs, rows that later products reach are zero-filled just before, and the rest at
        // the end.
        int64_t written = 0;
        const auto zero_rows = [&](int64_t from, int64_t to) {
          std::fill(dk + from * E, dk + to * E, T(0));
          std::fill(dv + from * Ev, dv + to * Ev, T(0));
        };
        if constexpr (std::is_same_v<T, float>) {
          if (packing) {
            f32_pack_b(true, cols, E, p.key.row(b, j0), p.key.row_stride, keys_t.data());
            f32_pack_b(true, cols, Ev, p.value.row(b, j0), p.value.row_stride, values_t.data());
            if (!in_place) {
              f32_pack_b(false, E, cols, p.key.row(b, j0), p.key.row_stride, keys_n.data());
            }
          }
        }
        // Under the causal mask, queries before j0 see none of these keys.
        const int64_t i_start = p.causal ? (j0 / kBackwardQueryBlock) * kBackwardQueryBlock : 0;
        if (grad_weights && i_start > 0 && p.len_q > 0) {
          // dP of the hidden pairs, which the loop below skips: nothing else needs them.
          const int64_t rows = std::min(i_start, p.len_q);
          block_gemm(p, false, true, rows, cols, Ev, T(1), grad_output.row(b, 0),
                     grad_output.row_stride, p.value.row(b, j0), p.value.row_stride, T(0),
                     grad_weights + b * p.len_q * p.len_k + j0, p.len_k);
        }
        for (int64_t i0 = i_start, step; i0 < p.len_q; i0 += step) {
          // (the same steps with grad_weights: its call's other gradients are bitwise those
          // of the call without, the hidden pairs adding exact zeros)
          step = p.causal && i0 < j0 + cols ? kBackwardDiagonalRows : kBackwardQueryBlock;
          const int64_t rows = std::min(step, p.len_q - i0);
          // Under the causal mask the block's rows see at most the keys up to its last row:
          // the rest have P = dS = 0 and are skipped (but for dP, which grad_weights wants
          // at every position).
          const int64_t vis = p.causal && !grad_weights ? std::min(cols, i0 + rows - j0) : cols;
          if (vis <= 0) continue;
          const T* q = p.query.row(b, i0);
          const T* dout = grad_output.row(b, i0);
          // P_ij: the forward's weights when it kept them, else recomputed from the scores
          // (with a sparse normalizer's s beside them).
          const T* probs_ij = probs.data();
          int64_t ld_probs = ld;
          int64_t nonzeros = rows * vis;
          if (probs_kept) {
            probs_ij = probs_kept + (b * p.len_q + i0) * p.len_k + j0;
            ld_probs = p.len_k;
            if (sparse) {
              nonzeros = sparse_support_from_probs(probs_ij, ld_probs, support.data(), ld, rows,
                                                   vis, nz);
            }
          } else {
            product(keys_t.data(), cols, E, true, rows, vis, E, p.scale, q, p.query.row_stride,
                    p.key.row(b, j0), p.key.row_stride, T(0), probs.data(), ld);
            if (sparse) {
              nonzeros = sparse_backward_rows(probs.data(), ld, support.data(), ld, rows, vis,
                                              mask_block(p, b, i0, j0), p.mask.row_stride,
                                              visible_base(p, i0, j0), nz,
                                              row_stat + b * p.len_q + i0);
            } else {
              probs_from_lse(probs.data(), rows, vis, ld, mask_block(p, b, i0, j0),
                             p.mask.row_stride, visible_base(p, i0, j0),
                             row_stat + b * p.len_q + i0);
            }
          }
          // A sparse block without non-zero p adds nothing; with few, its gradients go entry by
          // entry instead of four dense products (both only where dP is not wanted whole).
          if (nonzeros == 0 && !grad_weights) continue;
          const bool by_entry = sparse && !grad_weights && !dropout &&
                                nonzeros * kSparseBackwardFactor < rows * vis;
          const T beta_kv = written > 0 ? T(1) : T(0);
          if ((written > 0 || by_entry) && vis > written) zero_rows(written, vis);
          written = std::max(written, vis);
          if (by_entry) {
            sparse_backward_block(probs_ij, ld_probs, support.data(), ld, rows, vis, dout,
                                  grad_output.row_stride, q, p.query.row_stride,
                                  p.key.row(b, j0), p.key.row_stride, p.value.row(b, j0),
                                  p.value.row_stride, delta.data() + b * p.len_q + i0, p.scale,
                                  E, Ev, dq + i0 * E, dk, dv,
                                  grad_mask ? grad_mask + (b * p.len_q + i0) * p.len_k + j0
                                            : nullptr,
                                  p.len_k,
                                  weights_grad ? weights_grad + (b * p.len_q + i0) * p.len_k + j0
                                               : nullptr,
                                  p.len_k);
            continue;
          }
          // dV_j += (P ⊙ D)ᵀ·dO_i
          const T* used_ij = probs_ij;
          int64_t ld_used = ld_probs;
          if (dropout) {
            for (int64_t r = 0; r < rows; ++r) {
              std::copy(probs_ij + r * ld_probs, probs_ij + r * ld_probs + vis,
                        dropped.data() + r * ld);
            }
            dropout_rows(p.dropout, b * p.len_q + i0, j0, dropped.data(), rows, vis, ld,
                         T(p.dropout.kept_scale()));
            used_ij = dropped.data();
            ld_used = ld;
          }
          rows_product(true, vis, Ev, rows, T(1), used_ij, ld_used, dout,
                       grad_output.row_stride, beta_kv, dv, Ev);
          // dP = dO_i·V_jᵀ, then dS = P ⊙ (dP − delta)
          product(values_t.data(), cols, Ev, true, rows, vis, Ev, T(1), dout,
                  grad_output.row_stride, p.value.row(b, j0), p.value.row_stride, T(0),
                  dprobs.data(), ld);
          if (grad_weights) {
            T* gw = grad_weights + (b * p.len_q + i0) * p.len_k + j0;
            for (int64_t r = 0; r < rows; ++r) {
              std::copy(dprobs.data() + r * ld, dprobs.data() + r * ld + cols, gw + r * p.len_k);
            }
          }
          if (weights_grad) {
            const T* g = weights_grad + (b * p.len_q + i0) * p.len_k + j0;
            for (int64_t r = 0; r < rows; ++r) {
              T* dp = dprobs.data() + r * ld;
              for (int64_t c = 0; c < vis; ++c) dp[c] += g[r * p.len_k + c];
            }
          }
          // The gradient at P is D ⊙ (the gradient at the weights used).
          if (dropout) {
            dropout_rows(p.dropout, b * p.len_q + i0, j0, dprobs.data(), rows, vis, ld,
                         T(p.dropout.kept_scale()));
          }
          softmax_grad_block(sparse ? support.data() : probs_ij, sparse ? ld : ld_probs,
                             dprobs.data(), ld, rows, vis, delta.data() + b * p.len_q + i0);
          if (grad_mask) {
            T* gm = grad_mask + (b * p.len_q + i0) * p.len_k + j0;
            for (int64_t r = 0; r < rows; ++r) {
              std::copy(dprobs.data() + r * ld, dprobs.data() + r * ld + vis, gm + r * p.len_k);
            }
          }
          // dK_j += scale·dSᵀ·Q_i ;  dQ_i += scale·dS·K_j
          rows_product(true, vis, E, rows, p.scale, dprobs.data(), ld, q, p.query.row_stride,
                       beta_kv, dk, E);
          const T beta_dq = dq_written_first && kb == 0 ? T(0) : T(1);
          if (in_place) {
            rows_product(false, rows, E, vis, p.scale, dprobs.data(), ld, p.key.row(b, j0),
                         p.key.row_stride, beta_dq, dq + i0 * E, E);
          } else {
            product(keys_n.data(), E, cols, false, rows, E, vis, p.scale, dprobs.data(), ld,
                    p.key.row(b, j0), p.key.row_stride, beta_dq, dq + i0 * E, E);
          }
        }
        zero_rows(written, cols);
      }
    }
  });

  if (chunks > 1) {
    at::parallel_for(0, dq_size, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t c = 1; c < chunks; ++c) {
        const T* part = dq_parts.data() + (c - 1) * dq_size;
        for (int64_t i = begin; i < end; ++i) grad_query[i] += part[i];
      }
    });
  }
}

template void attention_forward<float>(const AttentionProblem<float>&, float*, float*, float*,
                                       uint16_t*, float*, const WeightSummaries<float>*);
template void attention_forward<double>(const AttentionProblem<double>&, double*, double*,
                                        double*, uint16_t*, double*,
                                        const WeightSummaries<double>*);
template void attention_backward<float>(const AttentionProblem<float>&,
                                        const BatchedRows<float>&, const float*, const float*,
                                        const float*, float*, float*, float*, float*,
                                        float*, const float*);
template void attention_backward<double>(const AttentionProblem<double>&,
                                         const BatchedRows<double>&, const double*,
                                         const double*, const double*, double*, double*,
                                         double*, double*, double*, const double*);

template bool weights_undropped_fit<float>(int64_t, int64_t, int64_t);
template bool weights_undropped_fit<double>(int64_t, int64_t, int64_t);
template bool attention_is_small<float>(const AttentionProblem<float>&);
template bool attention_is_small<double>(const AttentionProblem<double>&);
template void attention_forward_rows<float>(const AttentionProblem<float>&,
                                            const OutputRows<float>&, float*);
template void attention_forward_rows<double>(const AttentionProblem<double>&,
                                             const OutputRows<double>&, double*);
template void attention_backward_rows<float>(const AttentionProblem<float>&,
                                             const BatchedRows<float>&, const float*,
                                             const OutputRows<float>&, const OutputRows<float>&,
                                             const OutputRows<float>&);
template void attention_backward_rows<double>(const AttentionProblem<double>&,
                                              const BatchedRows<double>&, const double*,
                                              const OutputRows<double>&,
                                              const OutputRows<double>&,
                                              const OutputRows<double>&);

}  // namespace attnlab::cpu

#pragma once
// The row step of the sparse normalizers (sparsemax α = 2, entmax-1.5 α = 1.5, α-entmax for any
// α > 1) for the blocked attention kernel (attention_kernel.cpp), as softmax_rows.h is
// softmax's: thresholds of whole rows of scores, the support's p and s, and the backward's
// recomputation from τ. The formulas are in attention_kernel.h.
//
// Thresholds: sparsemax and entmax-1.5 exactly (Newton steps from below on the convex threshold
// equation, ended by the closed-form solve on the found support, a sort as fallback); any other
// α by bracketed Newton/bisection to below the float resolution, the probabilities then
// renormalised. Each row's candidates are relative to its max, where sums are well conditioned.

#include <cstdint>

namespace attnlab::cpu {

enum class SparseKind { kSparsemax, kEntmax15, kBisect };

struct SparseNormalizer {
  SparseKind kind;
  double alpha;
  double am1;  // α − 1: scores enter as (α − 1)·z
  double r;    // 1/(α − 1): p = d^r with d = (α − 1)·z − τ > 0; s = p^{2−α} = d^{r−1}
};

// The normalizer of α > 1.
SparseNormalizer sparse_normalizer(double alpha);

// Each row's support as a list: the keys with p > 0, their p and s/Σs. Row r's entries start
// at start[r]; state[r] is kRowValues, kRowEmpty (no visible key: zeros) or kRowNaN.
template <typename T>
struct SupportLists {
  int32_t* index;
  T* p;
  T* s;
  int64_t* start;
  int64_t* count;
  int8_t* state;
};
constexpr int8_t kRowValues = 0, kRowEmpty = 1, kRowNaN = 2;

// Scratch of one row: candidate values (room for cols + 8) and keys (cols), and the
// threshold's working set (cols).
template <typename T>
struct RowScratch {
  T* value;
  int32_t* key;
  T* work;
};

// Row r of the scores x [rows, cols] (ldx apart) sees keys j < clamp(visible_base + r, 0, cols)
// (kAllVisible: all); mask (nullable) is added first. For T = float and double:
//
// sparse_forward_rows: thresholds into tau[r] (absolute, as in attention_forward) and each
//   row's support into the lists (x is overwritten with the masked scores). Returns the lists'
//   total length.
// sparse_forward_rows_dense, for short rows: every visible key a candidate, p into x in place
//   and s/Σs into sup (lds apart), dense, with zeros (NaN for a NaN row) past the visible keys
//   up to cols.
// sparse_dense_rows: the lists as dense rows [rows, cols] (ld apart): p, or s/Σs when support.
// sparse_gather_rows: out_r = Σ p·v and u_r = Σ (s/Σs)·v over each row's list, P·V and S·V
//   on the support only.
// sparse_backward_rows: the backward's scores x → p in place and s = p^{2−α} (unnormalised)
//   into s, from the stored τ. Returns the number of non-zeros (a NaN row counts in full).
// sparse_support_from_probs: s = p^{2−α} from the forward's probabilities p. Returns the
//   number of non-zero p.
// sparse_backward_block: the gradients of one backward block from its non-zero p only, added
//   into dq, dk and dv (rows of E, E, Ev, contiguous): dz = s·(dO_r·v_c − delta_r);
//   dV_c += p·dO_r; dK_c += scale·dz·q_r; dQ_r += scale·dz·k_c. grad_mask (nullable, ld_mask
//   apart) receives dz at those entries. extra_dp (nullable, ld_extra apart) is added to
//   dO_r·v_c: a gradient arriving at the weights.
#define ATTNLAB_SPARSE_ROWS_API(ATTR, T)                                                        \
  ATTR int64_t sparse_forward_rows(T* x, int64_t ldx, int64_t rows, int64_t cols,              \
                                   const T* mask, int64_t mask_ld, int64_t visible_base,       \
                                   const SparseNormalizer& nz, T* tau,                         \
                                   const RowScratch<T>& scratch, const SupportLists<T>& out)   \
      ATTNLAB_SPARSE_BODY(T, forward_rows_impl, x, ldx, rows, cols, mask, mask_ld,          \
                          visible_base, nz, tau, scratch, out)                                               \
  ATTR void sparse_forward_rows_dense(T* x, int64_t ldx, T* sup, int64_t lds, int64_t rows,    \
                                      int64_t cols, const T* mask, int64_t mask_ld,            \
                                      int64_t visible_base, const SparseNormalizer& nz, T* tau, \
                                      const RowScratch<T>& scratch)                            \
      ATTNLAB_SPARSE_BODY(T, forward_rows_dense_impl, x, ldx, sup, lds, rows, cols, mask,         \
                          mask_ld, visible_base, nz, tau, scratch)                             \
  ATTR void sparse_dense_rows(const SupportLists<T>& lists, int64_t rows, int64_t cols, T* dst, \
                              int64_t ld, bool support)                                        \
      ATTNLAB_PLAIN_BODY(dense_rows_impl(lists, rows, cols, dst, ld, support))                 \
  ATTR void sparse_gather_rows(const SupportLists<T>& lists, int64_t rows, const T* v,          \
                               int64_t ldv, int64_t dim_v, T* out, T* u)                       \
      ATTNLAB_PLAIN_BODY(gather_rows_impl(lists, rows, v, ldv, dim_v, out, u))                 \
  ATTR int64_t sparse_backward_rows(T* x, int64_t ldx, T* s, int64_t lds, int64_t rows,        \
                                    int64_t cols, const T* mask, int64_t mask_ld,              \
                                    int64_t visible_base, const SparseNormalizer& nz,          \
                                    const T* tau)                                              \
      ATTNLAB_SPARSE_BODY(T, backward_rows_impl, x, ldx, s, lds, rows, cols, mask, mask_ld,       \
                          visible_base, nz, tau)                                               \
  ATTR int64_t sparse_support_from_probs(const T* p, int64_t ldp, T* s, int64_t lds,           \
                                         int64_t rows, int64_t cols,                           \
                                         const SparseNormalizer& nz)                           \
      ATTNLAB_SPARSE_BODY(T, support_from_probs_impl, p, ldp, s, lds, rows, cols, nz)             \
  ATTR void sparse_backward_block(const T* probs, int64_t ldp, const T* s, int64_t lds,        \
                                  int64_t rows, int64_t cols, const T* dout, int64_t ld_dout,  \
                                  const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v, \
                                  int64_t ldv, const T* delta, T scale, int64_t E, int64_t Ev,  \
                                  T* dq, T* dk, T* dv, T* grad_mask, int64_t ld_mask,          \
                                  const T* extra_dp, int64_t ld_extra)                         \
      ATTNLAB_PLAIN_BODY(backward_sparse_block_impl(probs, ldp, s, lds, rows, cols, dout,      \
                                                    ld_dout, q, ldq, k, ldk, v, ldv, delta,    \
                                                    scale, E, Ev, dq, dk, dv, grad_mask,       \
                                                    ld_mask, extra_dp, ld_extra))

// Declarations here; sparse_rows.cpp defines the same list with bodies, per instruction set.
#define ATTNLAB_SPARSE_BODY(...) ;
#define ATTNLAB_PLAIN_BODY(...) ;
ATTNLAB_SPARSE_ROWS_API(, float)
ATTNLAB_SPARSE_ROWS_API(, double)
#undef ATTNLAB_SPARSE_BODY
#undef ATTNLAB_PLAIN_BODY

}  // namespace attnlab::cpu

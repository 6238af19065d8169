#include "cpu/attention/small_attention.h"

#include "cpu/isa/isa.h"
#include "cpu/attention/small_attention_impl.h"

namespace attnlab::cpu {

// The float kernels: 64-byte vectors compiled for AVX-512 and for any x86-64, and their
// 32-byte-vector copies (small_attention_avx2.cpp) where the CPU has AVX2 and FMA but not
// AVX-512. GCC 12's x86-64-v3 clone of the 64-byte code ran every comparison, select and
// shuffle lane by lane (21,378 of small_attention_rows<float>'s 49,851 instructions were
// scalar), so it is not built; the branch is taken outside the clones.
namespace {
ATTNLAB_SMALL_ATTENTION_FLOAT_KERNELS(ATTNLAB_AVX512_CLONES, rows_64, backward_64)
}  // namespace

void small_attention_rows(int64_t rows, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                          const float* q, int64_t ldq, const float* k, int64_t ldk,
                          const float* v, int64_t ldv, const float* mask, int64_t mask_ld,
                          int64_t visible_base, float scale, float* out, int64_t ld_out,
                          float* lse, float* weights, int64_t ld_weights,
                          const Dropout* dropout, int64_t dropout_row0) {
  const auto kernel = avx2_without_avx512() ? avx2::small_attention_rows : rows_64;
  kernel(rows, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask, mask_ld, visible_base, scale,
         out, ld_out, lse, weights, ld_weights, dropout, dropout_row0);
}

void small_attention_backward(int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v,
                              const float* q, int64_t ldq, const float* k, int64_t ldk,
                              const float* v, int64_t ldv, const float* mask, int64_t mask_ld,
                              int64_t visible_base, float scale, const float* dout,
                              int64_t ld_dout, const float* lse, const float* probs, float* dq,
                              int64_t ld_dq, float* dk, int64_t ld_dk, float* dv, int64_t ld_dv,
                              float* dmask, float* dweights,
                              const Dropout* dropout, int64_t dropout_row0) {
  const auto kernel = avx2_without_avx512() ? avx2::small_attention_backward : backward_64;
  kernel(len_q, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask, mask_ld, visible_base, scale,
         dout, ld_dout, lse, probs, dq, ld_dq, dk, ld_dk, dv, ld_dv, dmask, dweights,
         dropout, dropout_row0);
}

ATTNLAB_ISA_CLONES void small_attention_rows(int64_t rows, int64_t len_k, int64_t dim_qk,
                                             int64_t dim_v, const double* q, int64_t ldq,
                                             const double* k, int64_t ldk, const double* v,
                                             int64_t ldv, const double* mask, int64_t mask_ld,
                                             int64_t visible_base, double scale, double* out,
                                             int64_t ld_out, double* lse, double* weights,
                                             int64_t ld_weights,
                                             const Dropout* dropout, int64_t dropout_row0) {
  small_attention_rows_impl(rows, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask, mask_ld,
                            visible_base, scale, out, ld_out, lse, weights, ld_weights,
                            dropout, dropout_row0);
}

ATTNLAB_ISA_CLONES void small_attention_backward(
    int64_t len_q, int64_t len_k, int64_t dim_qk, int64_t dim_v, const double* q, int64_t ldq,
    const double* k, int64_t ldk, const double* v, int64_t ldv, const double* mask, int64_t mask_ld,
    int64_t visible_base, double scale, const double* dout, int64_t ld_dout, const double* lse,
    const double* probs, double* dq, int64_t ld_dq, double* dk, int64_t ld_dk, double* dv,
    int64_t ld_dv, double* dmask, double* dweights, const Dropout* dropout, int64_t dropout_row0) {
  small_attention_backward_impl(len_q, len_k, dim_qk, dim_v, q, ldq, k, ldk, v, ldv, mask,
                                mask_ld, visible_base, scale, dout, ld_dout, lse, probs,
                                dq, ld_dq, dk, ld_dk, dv, ld_dv, dmask, dweights,
                                dropout, dropout_row0);
}

}  // namespace attnlab::cpu

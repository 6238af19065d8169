#pragma once
// The float32 GEMM that attnlab's CPU kernels run, as one call over torch's intra-op threads: the
// rate the benchmarks hold those kernels to, beside torch.mm's. A BLAS need not use all of a
// CPU's vector width (on an AMD Zen 5 core, with full-width AVX-512, MKL's sgemm ran at about
// half the FMA peak), so torch.mm alone would understate what the machine can do.
#include <cstdint>

namespace attnlab {

// C[m×n] = op(A)·op(B) (row-major, leading dimensions lda, ldb, ldc; op(X) = Xᵀ when trans_x;
// C's previous contents ignored) through the route cpu_float32_products() names, the larger of
// C's two sizes split among torch's intra-op threads. m, n, k >= 0.
void cpu_float32_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc);

// The float32 multiply-add peak of this CPU on torch's intra-op threads, in GFLOP/s (2 FLOP per
// lane of an FMA): every thread at once runs independent FMAs on registers alone (AVX-512, else
// AVX2, else 0) for about `seconds`, and their rates are summed. The bound no float32 product
// can pass; the benchmarks print it beside the GEMM rates (an AMD Zen 5 core: 256 GFLOP/s).
double cpu_float32_fma_peak(double seconds = 0.05);

}  // namespace attnlab

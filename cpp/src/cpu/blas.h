#pragma once
// Row-major GEMM on raw pointers, over the Fortran BLAS that torch links (MKL in the x86-64
// wheels) or the system BLAS. Called from inside at::parallel_for, where MKL runs sequentially.

#include <cstdint>
#include <type_traits>

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc);
// MKL's C entry point behind mkl_set_num_threads_local (mkl_service.h maps the name; the
// lower-case symbol is the Fortran one, taking a pointer). Weak: absent with other BLAS.
int MKL_Set_Num_Threads_Local(int nthreads) __attribute__((weak));
}

namespace attnlab::cpu {

// Within its scope this thread's BLAS calls run sequentially: the kernels call BLAS on small
// blocks from inside at::parallel_for, where a threaded BLAS would only add fork/join overhead.
class SequentialBlasScope {
 public:
  SequentialBlasScope() {
    if (MKL_Set_Num_Threads_Local) previous_ = MKL_Set_Num_Threads_Local(1);
  }
  ~SequentialBlasScope() {
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous_);
  }
  SequentialBlasScope(const SequentialBlasScope&) = delete;
  SequentialBlasScope& operator=(const SequentialBlasScope&) = delete;

 private:
  int previous_ = 0;
};

// C[m×n] = alpha·op(A)·op(B) + beta·C, all row-major with leading dimensions lda, ldb, ldc.
// op(X) = Xᵀ when trans_x. A row-major matrix is the column-major matrix of its transpose, so
// this is the column-major product Cᵀ = op(B)ᵀ·op(A)ᵀ.
template <typename T>
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                 const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&ta, &tb, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
  } else {
    dgemm_(&ta, &tb, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
  }
}

}  // namespace attnlab::cpu

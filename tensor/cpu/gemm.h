// tensor/cpu/gemm.h — BLAS-style GEMM on raw row-major buffers, for kernels that manage their
// own memory (convolution's im2col): C[M,N] = alpha op(A) op(B) + beta C, where op(A) is
// [M,K] (A stored [M,K] with leading dim lda, or [K,M] when trans_a), likewise op(B) [K,N].
// float32 runs loom's packed GEMM (tensor/cpu/packed_gemm.h) with the kernels of the instruction
// set in use; float64, tiny products and the generic path run Eigen's. Either uses the OpenMP
// threads unless called inside a parallel region.
#pragma once

#include <cstdint>

namespace loom::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

extern template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                 int64_t, const float*, int64_t, float, float*, int64_t);
extern template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                  int64_t, const double*, int64_t, double, double*, int64_t);

}  // namespace loom::cpu

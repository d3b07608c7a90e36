// tensor/cpu/gemm.cpp — GEMM on the CPU. float32 runs loom's own packed GEMM (the driver and the
// micro-kernels of tensor/cpu/packed_gemm.h, which conv2d shares; the structure of BLIS and
// GotoBLAS) with the kernel of the instruction set in use (AVX2 + FMA or AVX-512, Note [CPU
// instruction sets]); float64, tiny products and the generic path use Eigen.
//
// Note [GEMM blocking]
// C[M,N] = alpha A[M,K] B[K,N] + beta C, computed in blocks sized for the caches. Each thread
// takes a range of C's columns (or rows, where M > N) and runs, on its own packing buffers:
//   for jc in its columns by NC:            B block KC x NC stays in L2/L3
//     for pc in K by KC:
//       pack B[pc:+KC, jc:+NC] into panels of NR columns, k-major
//       for ic in M by MC:
//         pack A[ic:+MC, pc:+KC] into panels of MR rows, k-major (alpha folded in; L2)
//         for jr in NC by NR:
//           for ir in MC by MR:
//             micro-kernel: C[ir:+MR, jr:+NR] += A_panel B_panel       (B panel stays in L1)
// The AVX2 micro-kernel keeps the whole MR x NR = 6 x 16 tile of C in twelve 8-float registers
// and, per k, loads two vectors of B, broadcasts six values of A and issues twelve FMAs; the
// AVX-512 one keeps 12 x 32 in 24 16-float registers, 24 FMAs per k. Packing
// turns any layout of A and B (transposed or not) into the contiguous streams the kernel reads,
// and pads partial panels with zeros so the kernel never branches on edges. When C's rows are a
// multiple of 4 KiB apart and K takes several passes, the passes between the first and the last
// accumulate in a scratch copy of C instead (Note [Staging C] in tensor/cpu/packed_gemm.h).

#include "tensor/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>

#include "tensor/cpu/packed_gemm.h"
#include "tensor/cpu/scratch.h"
#include "tensor/parallel.h"

namespace loom::cpu {

namespace {

template <typename T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ColMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Outer = Eigen::OuterStride<>;

// C += alpha op(A) op(B) through Eigen's GEMM (beta already applied).
template <typename T>
void eigen_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  Eigen::Map<RowMajor<T>, 0, Outer> C(c, m, n, Outer(ldc));
  // A row-major [K,M] buffer is a column-major [M,K] matrix: transposing is a change of map.
  auto run = [&](const auto& A) {
    if (trans_b) {
      Eigen::Map<const ColMajor<T>, 0, Outer> B(b, k, n, Outer(ldb));
      C.noalias() += alpha * A * B;
    } else {
      Eigen::Map<const RowMajor<T>, 0, Outer> B(b, k, n, Outer(ldb));
      C.noalias() += alpha * A * B;
    }
  };
  if (trans_a)
    run(Eigen::Map<const ColMajor<T>, 0, Outer>(a, m, k, Outer(lda)));
  else
    run(Eigen::Map<const RowMajor<T>, 0, Outer>(a, m, k, Outer(lda)));
}

template <typename T>
void scale_c(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  if (beta == T(1)) return;
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0))
      std::fill(row, row + n, T(0));  // beta = 0 ignores C, NaNs included
    else
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
  }
}

// C += alpha op(A) op(B) by the packed driver of tensor/cpu/packed_gemm.h. Threads split C into
// ranges of whole panels, so that no two write the same element, and each packs its own blocks:
// a thread with a range of C's columns packs all of A, one with a range of rows all of B. So C
// is split along the dimension that makes the smaller operand the one packed by every thread:
// by rows where M > N (the K x N operand is the smaller), else by columns. A thread's panels are
// the ones one thread would use (whole MR rows or NR columns from 0), so every element is the
// same sum in the same order whatever the split. alpha is folded into the packed A block.
template <typename B, typename T = typename B::Scalar>
void threaded_packed_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                          const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc,
                          bool accumulate) {
  const int64_t a_rs = trans_a ? 1 : lda, a_cs = trans_a ? lda : 1;
  const int64_t b_rs = trans_b ? 1 : ldb, b_cs = trans_b ? ldb : 1;
  const bool by_rows = m > n;
  const int64_t unit = by_rows ? B::mr : B::nr, extent = by_rows ? m : n;
  const int64_t panels = (extent + unit - 1) / unit;
  parallel_for(0, panels, 2, [&](int64_t lo, int64_t hi) {
    const int64_t first = lo * unit, count = std::min(extent, hi * unit) - first;
    const int64_t i0 = by_rows ? first : 0, rows = by_rows ? count : m;
    const int64_t j0 = by_rows ? 0 : first, cols = by_rows ? n : count;
    ScratchFrame frame;
    T* b_scratch = frame.get<T>(B::kc * ((B::nc + B::nr - 1) / B::nr * B::nr));
    T* a_scratch = frame.get<T>(B::mc * B::kc);
    auto a_block = [&](int64_t ic, int64_t mc, int64_t pc, int64_t kc, T* scratch) -> const T* {
      pack_a<B>(a + (i0 + ic) * a_rs + pc * a_cs, a_rs, a_cs, mc, kc, scratch);
      if (alpha != T(1)) {
        const int64_t packed = (mc + B::mr - 1) / B::mr * B::mr * kc;
        for (int64_t i = 0; i < packed; ++i) scratch[i] *= alpha;
      }
      return scratch;
    };
    auto pack_b = [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, T* dst) {
      const T* src = b + pc * b_rs + (j0 + jc) * b_cs;
      if (b_cs == 1)
        pack_b_rows<B>(src, b_rs, kc, nc, dst);
      else
        pack_b_strided<B>(src, b_rs, b_cs, kc, nc, dst);
    };
    packed_gemm<B>(rows, cols, k, a_block, pack_b, c + i0 * ldc + j0, ldc, accumulate, b_scratch,
                   a_scratch, balanced_kc<B>(k));
  });
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    // Below about 32^3 multiply-adds the packing costs more than it saves. With beta = 0 the
    // first pass over K writes C instead of adding to it: no pass to clear C first.
    if (m * n * k >= 32 * 32 * 32 && n >= 8 && alpha != T(0) && with_packed_kernel([&]<CpuIsa I>() {
          if (beta != T(0)) scale_c(m, n, beta, c, ldc);
          threaded_packed_gemm<Kernel<T, I>>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c,
                                             ldc, /*accumulate=*/beta != T(0));
        }))
      return;
  }
  scale_c(m, n, beta, c, ldc);
  if (k == 0 || alpha == T(0)) return;
  eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace loom::cpu

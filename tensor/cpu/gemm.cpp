// tensor/cpu/gemm.cpp — GEMM on the CPU. float32 runs loom's own blocked kernel (packing plus
// an AVX2/FMA register-tile micro-kernel, the structure of BLIS and GotoBLAS) where the CPU has
// those instructions; float64, tiny products and other CPUs use Eigen.
//
// Note [GEMM blocking]
// C[M,N] = alpha A[M,K] B[K,N] + beta C, computed in blocks sized for the caches:
//   for jc in N by NC:                      B block KC x NC stays in L3
//     for pc in K by KC:
//       pack B[pc:+KC, jc:+NC] into panels of NR columns, k-major      (threads share it)
//       for ic in M by MC:
//         pack A[ic:+MC, pc:+KC] into panels of MR rows, k-major       (A block stays in L2)
//         for jr in NC by NR (split across threads):
//           for ir in MC by MR:
//             micro-kernel: C[ir:+MR, jr:+NR] += alpha A_panel B_panel  (B panel stays in L1)
// The micro-kernel keeps the whole MR x NR = 6 x 16 tile of C in twelve 8-float registers and,
// per k, loads two vectors of B, broadcasts six values of A and issues twelve FMAs. Packing
// turns any layout of A and B (transposed or not) into the contiguous streams the kernel reads,
// and pads partial panels with zeros so the kernel never branches on edges.

#include "tensor/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdlib>
#include <memory>

#include "tensor/parallel.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOOM_GEMM_AVX2 1
#endif

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

#ifdef LOOM_GEMM_AVX2

constexpr int64_t kMR = 6, kNR = 16;  // register tile
constexpr int64_t kKC = 256;          // depth of a packed block: a B panel is 16 KiB (L1)
constexpr int64_t kMC = 120;          // rows of a packed A block: 120 KiB (L2)
constexpr int64_t kNC = 3072;         // columns of a packed B block: 3 MiB (L3)

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, AlignedFree>;
Buffer aligned_floats(int64_t n) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// Packs rows [i0, i0+mc) x depth [p0, p0+kc) of op(A) into panels of kMR rows: panel r holds,
// for each p, the kMR values A[i0 + r*kMR + 0..5][p] (zeros past the last row).
void pack_a(bool trans, const float* a, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
            float* out) {
  for (int64_t r = 0; r < mc; r += kMR) {
    const int64_t rows = std::min(kMR, mc - r);
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t i = 0; i < kMR; ++i) {
        const int64_t row = i0 + r + i, col = p0 + p;
        out[i] = i < rows ? (trans ? a[col * lda + row] : a[row * lda + col]) : 0.0f;
      }
      out += kMR;
    }
  }
}

// Packs depth [p0, p0+kc) x columns [j0 + panel*kNR, +kNR) of op(B) for panels
// [panel_begin, panel_end): for each p, kNR consecutive values (zeros past the last column).
void pack_b(bool trans, const float* b, int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
            int64_t panel_begin, int64_t panel_end, float* out) {
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    const int64_t col0 = j0 + panel * kNR, cols = std::min(kNR, nc - panel * kNR);
    float* dst = out + panel * kNR * kc;
    for (int64_t p = 0; p < kc; ++p) {
      const int64_t row = p0 + p;
      if (!trans && cols == kNR) {
        std::copy(b + row * ldb + col0, b + row * ldb + col0 + kNR, dst);
      } else {
        for (int64_t j = 0; j < kNR; ++j)
          dst[j] = j < cols ? (trans ? b[(col0 + j) * ldb + row] : b[row * ldb + col0 + j]) : 0.0f;
      }
      dst += kNR;
    }
  }
}

// C[0:mr, 0:nr] += alpha * sum_p A_panel[p][0:6] (outer) B_panel[p][0:16]. Twelve accumulators,
// row i of the tile in c<i>0 (columns 0-7) and c<i>1 (columns 8-15). They are twelve named
// variables rather than an array: GCC keeps an array of __m256 in memory and stores it back on
// every iteration, which halves the kernel's speed.
void micro_kernel(int64_t kc, const float* a, const float* b, float alpha, float* c, int64_t ldc,
                  int64_t mr, int64_t nr) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    __m256 ai = _mm256_broadcast_ss(a + 0);
    c00 = _mm256_fmadd_ps(ai, b0, c00);
    c01 = _mm256_fmadd_ps(ai, b1, c01);
    ai = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(ai, b0, c10);
    c11 = _mm256_fmadd_ps(ai, b1, c11);
    ai = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_fmadd_ps(ai, b0, c20);
    c21 = _mm256_fmadd_ps(ai, b1, c21);
    ai = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_fmadd_ps(ai, b0, c30);
    c31 = _mm256_fmadd_ps(ai, b1, c31);
    ai = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_fmadd_ps(ai, b0, c40);
    c41 = _mm256_fmadd_ps(ai, b1, c41);
    ai = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_fmadd_ps(ai, b0, c50);
    c51 = _mm256_fmadd_ps(ai, b1, c51);
    a += kMR;
    b += kNR;
  }
  const __m256 acc[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                              {c30, c31}, {c40, c41}, {c50, c51}};
  const __m256 va = _mm256_set1_ps(alpha);
  if (mr == kMR && nr == kNR) {
    for (int i = 0; i < kMR; ++i) {
      float* row = c + i * ldc;
      _mm256_storeu_ps(row, _mm256_fmadd_ps(va, acc[i][0], _mm256_loadu_ps(row)));
      _mm256_storeu_ps(row + 8, _mm256_fmadd_ps(va, acc[i][1], _mm256_loadu_ps(row + 8)));
    }
    return;
  }
  alignas(32) float tile[kMR][kNR];  // an edge tile: add only the valid part
  for (int i = 0; i < kMR; ++i) {
    _mm256_store_ps(tile[i], _mm256_mul_ps(va, acc[i][0]));
    _mm256_store_ps(tile[i] + 8, _mm256_mul_ps(va, acc[i][1]));
  }
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) c[i * ldc + j] += tile[i][j];
}

// The blocked loops of Note [GEMM blocking]; threads split the packing and the jr loop.
void blocked_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                   int64_t ldc) {
  const int64_t nc_max = std::min(kNC, (n + kNR - 1) / kNR * kNR);
  const int64_t kc_max = std::min(kKC, k);
  const int64_t mc_max = std::min(kMC, (m + kMR - 1) / kMR * kMR);
  Buffer packed_b = aligned_floats(nc_max * kc_max);
  Buffer packed_a = aligned_floats(mc_max * kc_max);
  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = std::min(kNC, n - jc), panels = (nc + kNR - 1) / kNR;
    for (int64_t pc = 0; pc < k; pc += kKC) {
      const int64_t kc = std::min(kKC, k - pc);
      parallel_for(0, panels, 4, [&](int64_t lo, int64_t hi) {
        pack_b(trans_b, b, ldb, pc, kc, jc, nc, lo, hi, packed_b.get());
      });
      for (int64_t ic = 0; ic < m; ic += kMC) {
        const int64_t mc = std::min(kMC, m - ic);
        pack_a(trans_a, a, lda, ic, mc, pc, kc, packed_a.get());
        // Each thread takes whole B panels (columns of C), so no two write the same C.
        parallel_for(0, panels, 2, [&](int64_t lo, int64_t hi) {
          for (int64_t jr = lo; jr < hi; ++jr) {
            const int64_t nr = std::min(kNR, nc - jr * kNR);
            const float* bp = packed_b.get() + jr * kNR * kc;
            for (int64_t ir = 0; ir < mc; ir += kMR) {
              const int64_t mr = std::min(kMR, mc - ir);
              micro_kernel(kc, packed_a.get() + ir * kc, bp, alpha,
                           c + (ic + ir) * ldc + jc + jr * kNR, ldc, mr, nr);
            }
          }
        });
      }
    }
  }
}

#endif  // LOOM_GEMM_AVX2

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  scale_c(m, n, beta, c, ldc);
  if (k == 0 || alpha == T(0)) return;
#ifdef LOOM_GEMM_AVX2
  if constexpr (std::is_same_v<T, float>) {
    // Below about 32^3 multiply-adds the packing costs more than it saves.
    if (m * n * k >= 32 * 32 * 32 && n >= 8) {
      blocked_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
      return;
    }
  }
#endif
  eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace loom::cpu

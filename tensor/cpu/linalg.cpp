// tensor/cpu/linalg.cpp — GEMM through Eigen's blocked, vectorised kernels. Tensors are mapped
// onto Eigen matrices in place: a row-major map when the last dim has unit stride, a
// column-major map when the first dim does (a transposed view), so no operand is copied unless
// it has no unit stride at all.

#include "tensor/linalg.h"

#include <Eigen/Core>

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/gemm.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

namespace loom::cpu {

template <typename T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ColMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Outer = Eigen::OuterStride<>;

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  Eigen::Map<RowMajor<T>, 0, Outer> C(c, m, n, Outer(ldc));
  if (beta == T(0))
    C.setZero();
  else if (beta != T(1))
    C *= beta;
  if (k == 0) return;
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

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace loom::cpu

namespace loom::kernels {

namespace {

// A 2-D operand as GEMM sees it: a buffer, whether it is stored transposed, its leading dim.
struct Operand {
  Tensor storage;  // keeps a contiguous copy alive when one was needed
  bool transposed = false;
  int64_t ld = 1;
};

Operand as_operand(const Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  if (t.stride(1) == 1 || cols == 1) return {t, false, rows <= 1 ? cols : t.stride(0)};
  if (t.stride(0) == 1 || rows == 1) return {t, true, cols <= 1 ? rows : t.stride(1)};
  return {contiguous(t), false, cols};  // no unit stride: the one case that copies
}

void check_mm(const char* op, const Tensor& a, const Tensor& b) {
  common_device(op, {a, b});
  LOOM_CHECK(a.dim() == 2 && b.dim() == 2, ShapeError, op,
             ": expected 2-D inputs; got a=", a.sizes(), " b=", b.sizes());
  LOOM_CHECK(a.size(1) == b.size(0), ShapeError, op, ": inner dimensions differ; got a=", a.sizes(),
             " b=", b.sizes());
  LOOM_CHECK(a.dtype() == b.dtype(), DTypeError, op, ": dtypes differ; got a=", a.dtype(),
             " b=", b.dtype());
  if (a.is_cuda()) no_cuda_kernel(op);
}

}  // namespace

void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  check_mm("mm", a, b);
  LOOM_CHECK(out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(1) &&
                 (out.stride(1) == 1 || out.size(1) <= 1),
             ShapeError, "mm: output must be [", a.size(0), ", ", b.size(1),
             "] with a unit inner stride; got out=", out.sizes());
  LOOM_CHECK(out.dtype() == a.dtype(), DTypeError, "mm: output is ", out.dtype(),
             " but the inputs are ", a.dtype());
  out.bump_version();
  const Operand A = as_operand(a), B = as_operand(b);
  const int64_t ldc = out.size(0) <= 1 ? out.size(1) : out.stride(0);
  dispatch_floating(a.dtype(), "mm", [&]<typename T>() {
    cpu::gemm<T>(A.transposed, B.transposed, a.size(0), b.size(1), a.size(1), static_cast<T>(alpha),
                 static_cast<const T*>(A.storage.data()), A.ld,
                 static_cast<const T*>(B.storage.data()), B.ld, static_cast<T>(beta),
                 static_cast<T*>(out.data()), ldc);
  });
}

Tensor mm(const Tensor& a, const Tensor& b) {
  check_mm("mm", a, b);
  Tensor out = empty({a.size(0), b.size(1)}, a.dtype(), a.device());
  mm_out(out, a, b);
  return out;
}

Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, double beta, double alpha) {
  check_mm("addmm", a, b);
  const Shape shape{a.size(0), b.size(1)};
  LOOM_CHECK(broadcast_shapes(c.sizes(), shape, "addmm") == shape, ShapeError,
             "addmm: input shape=", c.sizes(), " does not broadcast to ", shape, " (a=", a.sizes(),
             " b=", b.sizes(), ")");
  Tensor out = empty(shape, a.dtype(), a.device());
  copy_(out, c);
  mm_out(out, a, b, alpha, beta);
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  common_device("bmm", {a, b});
  LOOM_CHECK(a.dim() == 3 && b.dim() == 3, ShapeError,
             "bmm: expected 3-D inputs; got a=", a.sizes(), " b=", b.sizes());
  LOOM_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), ShapeError,
             "bmm: batch or inner dimensions differ; got a=", a.sizes(), " b=", b.sizes());
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, a.dtype(), a.device());
  const int64_t batch = a.size(0);
  // Many small products: one thread per matrix. Few large ones: Eigen threads each product.
  const int64_t work = a.size(1) * a.size(2) * b.size(2);
  if (batch > 1 && work < 64 * 64 * 64) {
    parallel_for(0, batch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) mm_out(select(out, 0, i), select(a, 0, i), select(b, 0, i));
    });
  } else {
    for (int64_t i = 0; i < batch; ++i) mm_out(select(out, 0, i), select(a, 0, i), select(b, 0, i));
  }
  return out;
}

}  // namespace loom::kernels

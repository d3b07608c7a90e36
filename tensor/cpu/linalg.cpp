// tensor/cpu/linalg.cpp — matrix products on tensors, through cpu::gemm (tensor/cpu/gemm.cpp).
// An operand is read in place: as a row-major matrix when its last dim has unit stride, as a
// column-major one (a transposed view) when its first dim does; only an operand with no unit
// stride at all is copied. The front (tensor/linalg.cpp) checks the shapes and dtypes.

#include "tensor/cpu/linalg.h"

#include "tensor/copy.h"
#include "tensor/cpu/gemm.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

namespace loom::cpu {

namespace {

using kernels::select;

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
  return {kernels::contiguous(t), false, cols};  // no unit stride: the one case that copies
}

}  // namespace

void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
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

Tensor bmm(const Tensor& a, const Tensor& b) {
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, a.dtype(), a.device());
  const int64_t batch = a.size(0);
  // Many small products: one thread per matrix. Few large ones: Eigen threads each product.
  const int64_t work = a.size(1) * a.size(2) * b.size(2);
  if (batch > 1 && work < 64 * 64 * 64) {
    parallel_for(0, batch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        mm_out(select(out, 0, i), select(a, 0, i), select(b, 0, i), 1.0, 0.0);
    });
  } else {
    for (int64_t i = 0; i < batch; ++i)
      mm_out(select(out, 0, i), select(a, 0, i), select(b, 0, i), 1.0, 0.0);
  }
  return out;
}

}  // namespace loom::cpu

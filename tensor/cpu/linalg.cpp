// tensor/cpu/linalg.cpp — matrix products on tensors, through cpu::gemm (tensor/cpu/gemm.cpp).
// An operand is read in place: as a row-major matrix when its last dim has unit stride, as a
// column-major one (a transposed view) when its first dim does; only an operand with no unit
// stride at all is copied.

#include "tensor/linalg.h"

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cuda_backend.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

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
}

}  // namespace

// Note [16-bit products on the CPU]
//   A float16 or bfloat16 product has the semantics of a GPU's tensor cores: the operands are
//   16-bit values, the products are accumulated in float32, and the result is rounded once to
//   16 bits. CPUs with 16-bit dot-product instructions (AVX-512 BF16, AMX) would multiply the
//   16-bit operands directly; x86 CPUs with AVX2 and FMA only, like the ones loom is built and
//   tested on, have no such instructions, so the operands are widened to float32 (exactly:
//   every 16-bit value is a float32 value), multiplied by the float32 GEMM and the result
//   narrowed. The numbers are those of a 16-bit product; the speed is float32's plus the
//   widening, and the gain is memory: activations saved for backward take half the bytes.
//   conv2d and its backward do the same (tensor/cpu/conv.cpp). On CUDA, cuBLAS and cuDNN take
//   16-bit operands themselves, on tensor cores.
void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  check_mm("mm", a, b);
  LOOM_CHECK(out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(1) &&
                 (out.stride(1) == 1 || out.size(1) <= 1),
             ShapeError, "mm: output must be [", a.size(0), ", ", b.size(1),
             "] with a unit inner stride; got out=", out.sizes());
  LOOM_CHECK(out.dtype() == a.dtype(), DTypeError, "mm: output is ", out.dtype(),
             " but the inputs are ", a.dtype());
  // cuda_backend().mm_out bumps out's version itself.
  if (on_cuda("mm", {out, a})) return cuda_backend().mm_out(out, a, b, alpha, beta);
  if (is_16bit_float(a.dtype())) {  // Note [16-bit products on the CPU]
    const Tensor out32 = beta == 0.0 ? empty(out.sizes(), kFloat32) : to_dtype(out, kFloat32);
    mm_out(out32, widened(a), widened(b), alpha, beta);
    copy_(out, out32);  // bumps out's version
    return;
  }
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
  LOOM_CHECK(a.dtype() == b.dtype(), DTypeError, "bmm: dtypes differ; got a=", a.dtype(),
             " b=", b.dtype());
  if (a.is_cuda()) return cuda_backend().bmm(a, b);
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

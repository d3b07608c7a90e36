// tensor/linalg.cpp — the front of the matrix products (tensor/linalg.h): the shape, dtype and
// device checks, the one device switch of mm_out and bmm, to the CUDA backend
// (tensor/cuda_backend.h) or to the GEMM calls of tensor/cpu/linalg.cpp, and the CPU's 16-bit
// rule. mm and addmm are built on mm_out.

#include "tensor/linalg.h"

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/linalg.h"
#include "tensor/cuda_backend.h"

namespace loom::kernels {

namespace {

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
//   16 bits. Two ways to get there on the CPU:
//   - bfloat16 on CPUs with AVX512_BF16 (cpu_isa() kAvx512Bf16): mm_out and bmm multiply the
//     16-bit operands directly with vdpbf16ps, 32 multiply-adds per instruction against the 16
//     of a float32 FMA (cpu::gemm_bf16, Note [bf16 dot products] in tensor/cpu/bf16_gemm.h),
//     into a float32 result rounded once. vdpbf16ps adds the two products of a pair of k one
//     after the other and counts denormals as zero, so its results are not bitwise those of the
//     widened path below: each float32 sum is within k roundings of float32 of the other.
//     Whether it is faster depends on how many vdpbf16ps the CPU issues per cycle: where it
//     issues one every two cycles against two FMAs per cycle, its peak is half float32's
//     (bf16_gemm_bench measures both). So by default it is used only where it is measured to
//     be faster (Note [When bf16 dot products pay] in tensor/cpu/linalg.cpp; LOOM_BF16_DOT).
//   - Everywhere else (float16; bfloat16 without AVX512_BF16, like the AVX2 machines loom is
//     also built and tested on, with LOOM_CPU_ISA below avx512_bf16, or where the kernel does
//     not pay): the operands are
//     widened to float32 (exactly: every 16-bit value is a float32 value), multiplied by the
//     float32 GEMM and the result narrowed. The numbers are those of a 16-bit product; the
//     speed is float32's plus the widening, and the gain is memory: activations saved for
//     backward take half the bytes.
//   On CPUs with AMX the bfloat16 kernel is the tile one (Note [bf16 products on AMX tiles]),
//   and conv2d of bfloat16 runs on the same products (Note [bf16 convolutions] in
//   tensor/cpu/conv_bf16.cpp) wherever mm does; float16 and grouped convolutions widen.
//   AVX512-FP16 is not used yet. On CUDA, cuBLAS and cuDNN take 16-bit operands themselves, on
//   tensor cores.
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
  if (is_16bit_float(a.dtype()) && !cpu::multiplies_16bit(a.dtype())) {
    // Note [16-bit products on the CPU]: widened.
    const Tensor out32 = beta == 0.0 ? empty(out.sizes(), kFloat32) : to_dtype(out, kFloat32);
    mm_out(out32, widened(a), widened(b), alpha, beta);
    copy_(out, out32);  // bumps out's version
    return;
  }
  cpu::mm_out(out, a, b, alpha, beta);
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
  if (on_cuda("bmm", {a, b})) return cuda_backend().bmm(a, b);
  // Note [16-bit products on the CPU]: the whole batch widened at once, unless the CPU
  // multiplies this 16-bit dtype itself.
  if (is_16bit_float(a.dtype()) && !cpu::multiplies_16bit(a.dtype()))
    return to_dtype(bmm(widened(a), widened(b)), a.dtype());
  return cpu::bmm(a, b);
}

}  // namespace loom::kernels

// tensor/cpu/linalg.cpp — matrix products on tensors, through cpu::gemm (tensor/cpu/gemm.cpp),
// or cpu::gemm_bf16 (tensor/cpu/bf16_gemm.cpp) for bfloat16 into a float32 result rounded once.
// An operand is read in place: as a row-major matrix when its last dim has unit stride, as a
// column-major one (a transposed view) when its first dim does; only an operand with no unit
// stride at all is copied. The front (tensor/linalg.cpp) checks the shapes and dtypes.

#include "tensor/cpu/linalg.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "tensor/copy.h"
#include "tensor/cpu/bf16_gemm.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu_info.h"
#include "tensor/dispatch.h"
#include "tensor/error.h"
#include "tensor/parallel.h"
#include "tensor/view.h"

namespace loom::cpu {

namespace {

using kernels::copy_;
using kernels::select;
using kernels::to_dtype;

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

// out = beta out + alpha a @ b, out of a's dtype, or float32 for bfloat16 operands.
void gemm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  const Operand A = as_operand(a), B = as_operand(b);
  const int64_t ldc = out.size(0) <= 1 ? out.size(1) : out.stride(0);
  if (a.dtype() == kBFloat16) {
    cpu::gemm_bf16(A.transposed, B.transposed, a.size(0), b.size(1), a.size(1),
                   static_cast<float>(alpha), static_cast<const BFloat16*>(A.storage.data()), A.ld,
                   static_cast<const BFloat16*>(B.storage.data()), B.ld, static_cast<float>(beta),
                   static_cast<float*>(out.data()), ldc);
    return;
  }
  dispatch_floating(a.dtype(), "mm", [&]<typename T>() {
    cpu::gemm<T>(A.transposed, B.transposed, a.size(0), b.size(1), a.size(1), static_cast<T>(alpha),
                 static_cast<const T*>(A.storage.data()), A.ld,
                 static_cast<const T*>(B.storage.data()), B.ld, static_cast<T>(beta),
                 static_cast<T*>(out.data()), ldc);
  });
}

}  // namespace

void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  if (a.dtype() == kBFloat16) {  // summed in float32, rounded once
    const Tensor out32 = beta == 0.0 ? empty(out.sizes(), kFloat32) : to_dtype(out, kFloat32);
    gemm_out(out32, a, b, alpha, beta);
    copy_(out, out32);  // bumps out's version
    return;
  }
  out.bump_version();
  gemm_out(out, a, b, alpha, beta);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  // bfloat16: the whole batch summed into one float32 result, rounded once at the end.
  const DType result = a.dtype() == kBFloat16 ? kFloat32 : a.dtype();
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, result, a.device());
  const int64_t batch = a.size(0);
  // Many small products: one thread per matrix. Few large ones: the GEMM threads each product.
  const int64_t work = a.size(1) * a.size(2) * b.size(2);
  if (batch > 1 && work < 64 * 64 * 64) {
    parallel_for(0, batch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        gemm_out(select(out, 0, i), select(a, 0, i), select(b, 0, i), 1.0, 0.0);
    });
  } else {
    for (int64_t i = 0; i < batch; ++i)
      gemm_out(select(out, 0, i), select(a, 0, i), select(b, 0, i), 1.0, 0.0);
  }
  return result == a.dtype() ? out : to_dtype(out, a.dtype());
}

// Note [When bf16 dot products pay]
//   vdpbf16ps does twice the multiply-adds of a float32 FMA per instruction, but CPUs issue it
//   at different rates. On the Intel Xeon of docs/cpu_speed.md it issues once every two cycles
//   while 512-bit FMAs issue twice per cycle, so its peak is half float32's and the widened path
//   is faster. Elsewhere it may issue as fast as the FMAs, and then it doubles the rate. So the
//   default is decided by measurement, once per process: the kernel is used when the dot-product
//   peak on one thread is at least 1.25 times the float32 FMA peak (bf16_peak_ratio: about 2.0
//   on an AMD EPYC with AVX512_BF16, 0.5 on that Xeon). On AMX the kernel is the tile one,
//   measured the same way (14 times float32 on that Xeon). The two paths give different bits
//   (Note [bf16 dot products]), so the measurement must not flip with the machine's load: it
//   takes the best of 15 alternating samples of about a millisecond each (best_rate_ratio). The
//   median of three samples of each peak, taken one after the other, fell below 1.25 on the
//   EPYC with two busy processes on its two cores, and a fixed seed then gave other bits.
//   LOOM_BF16_DOT=on|off fixes the choice outright.
namespace {

constexpr double kBf16DotPays = 1.25;

std::atomic<int> g_bf16_dot_policy{-1};  // -1 until LOOM_BF16_DOT has been read

Bf16DotPolicy policy_from_env() {
  const char* text = std::getenv("LOOM_BF16_DOT");
  const std::string_view value = text ? text : "";
  if (value.empty() || value == "auto") return Bf16DotPolicy::kAuto;
  if (value == "on") return Bf16DotPolicy::kOn;
  if (value == "off") return Bf16DotPolicy::kOff;
  throw ValueError(detail::str("LOOM_BF16_DOT=", value, ": expected auto, on or off"));
}

}  // namespace

Bf16DotPolicy bf16_dot_policy() {
  int policy = g_bf16_dot_policy.load(std::memory_order_relaxed);
  if (policy < 0) {
    int unset = -1;
    g_bf16_dot_policy.compare_exchange_strong(unset, static_cast<int>(policy_from_env()));
    policy = g_bf16_dot_policy.load(std::memory_order_relaxed);
  }
  return static_cast<Bf16DotPolicy>(policy);
}

Bf16DotPolicy set_bf16_dot_policy(Bf16DotPolicy policy) {
  const Bf16DotPolicy previous = bf16_dot_policy();
  g_bf16_dot_policy.store(static_cast<int>(policy));
  return previous;
}

double bf16_dot_speedup() {
  const CpuIsa isa = cpu_isa();
  if (isa < CpuIsa::kAvx512Bf16) return 0.0;
  if (isa >= CpuIsa::kAmxBf16) {
    static const double amx = bf16_peak_ratio(/*amx=*/true);
    return amx;
  }
  static const double dot = bf16_peak_ratio(/*amx=*/false);
  return dot;
}

bool multiplies_16bit(DType dtype) {
  if (dtype != kBFloat16 || !bf16_dot_products()) return false;
  switch (bf16_dot_policy()) {
    case Bf16DotPolicy::kOn:
      return true;
    case Bf16DotPolicy::kOff:
      return false;
    case Bf16DotPolicy::kAuto:
      break;
  }
  return bf16_dot_speedup() >= kBf16DotPays;
}

}  // namespace loom::cpu

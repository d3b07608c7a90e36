// tensor/cpu/linalg.h — the CPU matrix products (tensor/linalg.h), which its front
// (tensor/linalg.cpp) calls for CPU tensors, shapes and dtypes checked, 16-bit operands widened.
#pragma once

#include "tensor/tensor.h"

namespace loom::cpu {

// out = beta * out + alpha * (a @ b), out [M,N] with a unit inner stride, of a's dtype; bumps
// out's version. bfloat16 operands are summed in float32 (cpu::gemm_bf16) and the result
// rounded once. A dtype other than float32, float64 or bfloat16 raises DTypeError.
void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta);
// a [B,M,K] @ b [B,K,N] -> [B,M,N], one GEMM per matrix.
Tensor bmm(const Tensor& a, const Tensor& b);

// Whether mm_out and bmm take operands of this 16-bit dtype as they are: bfloat16 where the
// CPU has bfloat16 dot products (cpu::bf16_dot_products) and bf16_dot_policy() says to use them.
// Elsewhere the front widens them (Note [16-bit products on the CPU] in tensor/linalg.cpp).
bool multiplies_16bit(DType dtype);

// When bfloat16 products take the dot-product kernel (Note [When bf16 dot products pay]):
// kAuto (the default, or LOOM_BF16_DOT=auto) where it is measured to be faster than float32's
// FMAs; kOn (LOOM_BF16_DOT=on) wherever the CPU has it; kOff (LOOM_BF16_DOT=off) never.
enum class Bf16DotPolicy { kAuto, kOn, kOff };
Bf16DotPolicy bf16_dot_policy();
Bf16DotPolicy set_bf16_dot_policy(Bf16DotPolicy policy);  // returns the previous one
// The measured ratio of the bfloat16 kernel's peak to the float32 FMA peak on one thread, for
// the kernel cpu_isa() picks: AMX tiles (amx_bf16_peak_gflops) at kAmxBf16, vdpbf16ps
// (bf16_dot_peak_gflops) at kAvx512Bf16, 0 below. Each measured once per process, on first use.
double bf16_dot_speedup();

}  // namespace loom::cpu

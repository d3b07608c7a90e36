// tensor/cpu_info.h — what CPU this is and what it can do: its name, the vector instructions it
// has (detected at run time, whatever the build's -march), and its float32 FMA peak (and bfloat16
// dot-product peak) measured on the spot, the denominator of a model-FLOPs utilisation (MFU).
// Benchmarks print the first two beside their figures, since figures from different machines do not
// compare.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace loom {

// Note [CPU instruction sets]
//   loom is compiled for a baseline (CMake's LOOM_CPU_BASELINE, x86-64-v3 by default: AVX2, FMA,
//   F16C), which every part of it may use; the kernels that gain from wider or newer units (the
//   packed GEMM and conv2d micro-kernels) are compiled besides for the sets above it, with
//   per-function target attributes, and picked at run time from what cpuid reports, as oneDNN
//   and OpenBLAS do. The set in use is the highest the CPU has, capped by LOOM_CPU_ISA (or
//   set_max_cpu_isa) so that every lower path can be run, and tested, on a CPU that has a
//   higher one. kGeneric is the portable path: Eigen's GEMM, compiled for the baseline only.
//   kAmxBf16 adds the AMX tile unit's bfloat16 products (Note [bf16 products on AMX tiles] in
//   tensor/cpu/bf16_gemm.h); it counts as present only where the kernel (Linux) lets this
//   process use the tile registers, which it asks for once, at detection.
enum class CpuIsa { kGeneric, kAvx2, kAvx512, kAvx512Bf16, kAmxBf16 };

// "generic", "avx2", "avx512", "avx512_bf16", "amx_bf16": LOOM_CPU_ISA's names.
std::string_view to_string(CpuIsa isa);

// LOOM_CPU_ISA's value to a set; ValueError naming the accepted names otherwise.
CpuIsa parse_cpu_isa(std::string_view name);

// The highest set this CPU runs (kAvx2 means AVX2 and FMA; kAvx512, AVX512F; kAvx512Bf16,
// AVX512F and AVX512_BF16; kAmxBf16, those and AMX-TILE and AMX-BF16, enabled by the OS for
// this process).
CpuIsa detected_cpu_isa();

// The set the kernels use: detected_cpu_isa(), capped by set_max_cpu_isa's last value or else
// LOOM_CPU_ISA (read at the first call; an unknown name raises ValueError at every call).
// Cheap: an atomic load after the first call.
CpuIsa cpu_isa();

// Caps cpu_isa() at `isa` from now on, in place of LOOM_CPU_ISA (a cap above the CPU changes
// nothing); returns the cap in force before.
CpuIsa set_max_cpu_isa(CpuIsa isa);

// /proc/cpuinfo's "model name" ("unknown CPU" where there is none).
std::string cpu_model_name();

// The vector instruction sets this CPU has and how wide: "AVX-512 (BF16, FP16, AMX-BF16)",
// "AVX2 + FMA", "SSE4.2" ...
std::string cpu_vector_isa();

// float32 GFLOP/s of `threads` threads each running independent FMA chains that never leave the
// registers (12 accumulators) on vectors of `bits` (256 or 512; 0 for scalar FMAs): the cores'
// FMA throughput at that width. Median of three samples of about 30 ms each; 0 where the CPU
// (or this build) has no FMA of that width. A machine whose other processes keep cores busy
// measures lower, as its kernels will run.
double fma_peak_gflops(int threads, int bits);

// The peak of the widest vector that runs at full rate: the larger of the 256- and 512-bit
// peaks (some CPUs run 512-bit FMAs at half rate, so 256 bits reach their peak). The
// denominator of a utilisation, which the narrower peak would overstate.
double fma_peak_gflops(int threads);

// bfloat16 GFLOP/s of `threads` threads each running 12 independent chains of 512-bit
// vdpbf16ps (32 multiply-adds, 64 FLOPs, each), measured as fma_peak_gflops is: the peak of a
// bfloat16 GEMM on a CPU with AVX512_BF16 (Note [bf16 dot products] in tensor/cpu/bf16_gemm.h);
// 0 where the CPU (or this build) has none.
double bf16_dot_peak_gflops(int threads);
// bfloat16 GFLOP/s of `threads` threads each running 4 independent chains of tdpbf16ps on
// 16 x 16 float32 tiles (16 x 16 x 32 multiply-adds each), measured as fma_peak_gflops is: the
// peak of the AMX kernel; 0 where detected_cpu_isa() is below kAmxBf16.
double amx_bf16_peak_gflops(int threads);

// The ratio of two rates, each the best of `rounds` samples, the two sampled in alternation
// (numerator, denominator, numerator, ...); 0 when the denominator never exceeds 0. Another
// process on the core can only slow a sample, so the best of many short ones is close to the
// unloaded rate even when most were slowed, where a median of a few long ones moves with the
// load (and a decision taken on it flips between runs).
double best_rate_ratio(const std::function<double()>& numerator,
                       const std::function<double()>& denominator, int rounds);

// On one thread, the bfloat16 peak (amx_bf16_peak_gflops with `amx`, else bf16_dot_peak_gflops)
// over the float32 FMA peak of the widest full-rate vector (fma_peak_gflops): best_rate_ratio of
// 15 rounds of samples of about a millisecond. 0 where the bfloat16 instructions do not run.
// The measurement behind Note [When bf16 dot products pay] in tensor/cpu/linalg.cpp.
double bf16_peak_ratio(bool amx);

}  // namespace loom

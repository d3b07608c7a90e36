// bench/bf16_gemm_bench.cpp — bfloat16 GEMM 1024x1024x1024 through loom::matmul, on 1 and 2
// threads, against float32's and against the bfloat16 product widened to float32 (the path of
// CPUs without AVX512_BF16, Note [16-bit products on the CPU]), and as a fraction of this
// machine's peak for the bfloat16 kernel in use, measured by the same binary: chains of
// vdpbf16ps that never leave the registers (32 multiply-adds each; bf16_dot_peak_gflops), or of
// AMX tile products where the kernel is AMX's (amx_bf16_peak_gflops). Each repetition
// takes a peak sample, then the three GEMMs back to back; the table gives medians, and the
// ratios are medians of the per-repetition ratios: on a shared machine the load changes between
// repetitions, not within one.
//   bf16_gemm_bench [--size N] [--repeats R]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "loom.h"
#include "machine.h"
#include "stats.h"

namespace {

using loom::bench::median;
using Clock = std::chrono::steady_clock;

// GFLOP/s of a @ b, a [n, n], over four products in a row (one AMX product of 1024^3 takes a
// few milliseconds, and the first after other work runs slower).
double gflops(const loom::Tensor& a, const loom::Tensor& b) {
  constexpr int kProducts = 4;
  const int64_t n = a.size(0);
  const auto start = Clock::now();
  for (int i = 0; i < kProducts; ++i) loom::Tensor c = loom::matmul(a, b);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return kProducts * 2.0 * n * n * n / seconds / 1e9;
}

struct Row {
  std::vector<double> bf16, widened, fp32, peak, bf16_over_fp32, bf16_over_peak;
};

// `repeats` rounds of: a peak sample, bfloat16 on the kernel, bfloat16 widened, float32.
Row measure(int64_t n, int repeats, int threads, loom::CpuIsa top) {
  loom::manual_seed(0);
  const loom::Tensor a = loom::randn({n, n}), b = loom::randn({n, n});
  const loom::Tensor a16 = a.to(loom::kBFloat16), b16 = b.to(loom::kBFloat16);
  auto widened = [&] {  // the cap below avx512_bf16, never above the path in use
    const loom::CpuIsa before = loom::set_max_cpu_isa(std::min(top, loom::CpuIsa::kAvx512));
    const double g = gflops(a16, b16);
    loom::set_max_cpu_isa(before);
    return g;
  };
  // Warm-up: the scratch arenas and the thread pool.
  gflops(a16, b16);
  widened();
  gflops(a, b);
  Row row;
  for (int r = 0; r < repeats; ++r) {
    const double peak = top >= loom::CpuIsa::kAmxBf16 ? loom::amx_bf16_peak_gflops(threads)
                                                      : loom::bf16_dot_peak_gflops(threads);
    const double bf16 = gflops(a16, b16), wide = widened(), fp32 = gflops(a, b);
    row.bf16.push_back(bf16);
    row.widened.push_back(wide);
    row.fp32.push_back(fp32);
    row.peak.push_back(peak);
    row.bf16_over_fp32.push_back(bf16 / fp32);
    row.bf16_over_peak.push_back(peak > 0 ? bf16 / peak : 0.0);
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 1024;
  int repeats = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--size")) n = std::stoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
  }
  loom::bench::print_machine();
  const loom::CpuIsa top = loom::cpu_isa();
  if (top < loom::CpuIsa::kAvx512Bf16)
    std::printf("No bfloat16 dot products on this path: the bf16 column is the widened path\n");
  for (int threads : {1, 2})
    std::printf(
        "Peaks, %d thread(s): bf16 dot products %.1f GFLOP/s; AMX tiles %.1f; float32 FMA %.1f\n",
        threads, loom::bf16_dot_peak_gflops(threads), loom::amx_bf16_peak_gflops(threads),
        loom::fma_peak_gflops(threads));
  std::printf("The bf16 column runs the %s kernel; its peak is the bf16 peak column's\n",
              top >= loom::CpuIsa::kAmxBf16      ? "AMX tile"
              : top >= loom::CpuIsa::kAvx512Bf16 ? "vdpbf16ps"
                                                 : "widened (float32)");
  std::printf("GEMM %lldx%lldx%lld through loom::matmul (median of %d)\n",
              static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(n),
              repeats);
  std::printf(
      "| threads | bf16 GFLOP/s | bf16 widened GFLOP/s | float32 GFLOP/s | bf16 / float32 | "
      "bf16 peak GFLOP/s | bf16 / peak |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    loom::set_num_threads(threads);
    const Row row = measure(n, repeats, threads, top);
    std::printf("| %d | %.1f | %.1f | %.1f | %.2f | %.1f | %.2f |\n", threads, median(row.bf16),
                median(row.widened), median(row.fp32), median(row.bf16_over_fp32), median(row.peak),
                median(row.bf16_over_peak));
  }
  return 0;
}

// bench/gemm_bench.cpp — float32 GEMM 1024x1024x1024 through loom::matmul, in GFLOP/s on 1 and
// 2 threads and on each instruction-set path this CPU runs (Note [CPU instruction sets]),
// beside this machine's FMA peak measured by the same binary: loops of independent vector FMAs
// that never leave the registers, at 256 and 512 bits, the larger taken (a CPU that runs 512-bit
// FMAs at half rate reaches its peak with 256 bits, and a 512-bit kernel must be held to the
// 512-bit peak where that is higher). GEMM and peak are measured in alternation, each GEMM right
// after a peak sample, and the ratio is the median of the per-pair ratios: on a shared machine
// the load changes between samples, not within one. Each path is also held to its own peak, that
// of the widest vector it uses: the AVX2 path's 256-bit FMAs cannot reach a 512-bit peak, and
// on an AVX2-only CPU the two columns are the same.
//   gemm_bench [--size N] [--repeats R]

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

struct Sample {
  double gemm, peak, own_peak;
};

// The FMA width of a path's kernels: 0 for scalar code.
int path_bits(loom::CpuIsa isa) {
  switch (isa) {
    case loom::CpuIsa::kAvx512:
      return 512;
    case loom::CpuIsa::kAvx2:
      return 256;
    default:  // Eigen, vectorised for the build's baseline
#if defined(__AVX512F__)
      return 512;
#elif defined(__AVX2__) && defined(__FMA__)
      return 256;
#else
      return 0;
#endif
  }
}

// (GEMM, peak, the path's peak) samples taken back to back.
std::vector<Sample> measure(int64_t n, int repeats, int threads, int own_bits) {
  loom::manual_seed(0);
  const loom::Tensor a = loom::randn({n, n}), b = loom::randn({n, n});
  loom::Tensor c = loom::matmul(a, b);  // warm-up
  std::vector<Sample> samples;
  for (int r = 0; r < repeats; ++r) {
    const double peak = loom::fma_peak_gflops(threads);
    const double own = own_bits == 512 ? peak : loom::fma_peak_gflops(threads, own_bits);
    const auto start = Clock::now();
    c = loom::matmul(a, b);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    samples.push_back({2.0 * n * n * n / seconds / 1e9, peak, own});
  }
  return samples;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 1024;
  int repeats = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--size")) n = std::stoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
  }
  loom::bench::print_machine();
  for (int threads : {1, 2})
    std::printf("FMA peak, %d thread(s): %.1f GFLOP/s at 256 bits, %.1f at 512 bits\n", threads,
                loom::fma_peak_gflops(threads, 256), loom::fma_peak_gflops(threads, 512));
  std::printf("GEMM %lldx%lldx%lld float32 (median of %d)\n", static_cast<long long>(n),
              static_cast<long long>(n), static_cast<long long>(n), repeats);
  std::printf(
      "| path | threads | loom GFLOP/s | FMA peak GFLOP/s | loom / peak | the path's peak "
      "(bits) | loom / the path's peak |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  // Every path up to the one in use (LOOM_CPU_ISA caps it), the widest first.
  const loom::CpuIsa top = loom::cpu_isa();
  for (const loom::CpuIsa isa :
       {loom::CpuIsa::kAvx512, loom::CpuIsa::kAvx2, loom::CpuIsa::kGeneric}) {
    if (isa > top) continue;
    loom::set_max_cpu_isa(isa);
    for (int threads : {1, 2}) {
      loom::set_num_threads(threads);
      const int bits = path_bits(isa);
      const std::vector<Sample> samples = measure(n, repeats, threads, bits);
      std::vector<double> gemm, peak, ratio, own, own_ratio;
      for (const Sample& s : samples) {
        gemm.push_back(s.gemm);
        peak.push_back(s.peak);
        ratio.push_back(s.peak > 0 ? s.gemm / s.peak : 0.0);
        own.push_back(s.own_peak);
        own_ratio.push_back(s.own_peak > 0 ? s.gemm / s.own_peak : 0.0);
      }
      std::printf("| %s | %d | %.1f | %.1f | %.2f | %.1f (%d) | %.2f |\n",
                  std::string(loom::to_string(isa)).c_str(), threads, median(gemm), median(peak),
                  median(ratio), median(own), bits, median(own_ratio));
    }
  }
  return 0;
}

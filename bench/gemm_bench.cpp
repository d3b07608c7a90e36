// bench/gemm_bench.cpp — float32 GEMM 1024x1024x1024 through loom::matmul, in GFLOP/s on 1 and
// 2 threads, beside this machine's FMA peak measured by the same binary: a loop of independent
// vector FMAs that never leaves the registers, so it runs at the core's FMA throughput. The two
// are measured in alternation, each GEMM right after a peak sample, and the ratio is the median
// of the per-pair ratios: on a shared machine the load changes between samples, not within one.
//   gemm_bench [--size N] [--repeats R]

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "loom.h"
#include "stats.h"

namespace {

using loom::bench::median;

using Clock = std::chrono::steady_clock;

// GFLOP/s of `threads` threads each running chains of FMAs on 12 independent accumulators
// (enough to hide the FMA latency on two pipes). Counts 2 flops per lane per FMA.
double fma_peak_gflops(int threads) {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr int kIterations = 4'000'000;
  constexpr int kLanes = 8, kAccumulators = 12;
  std::vector<double> samples;
  for (int rep = 0; rep < 3; ++rep) {
    float sink = 0;
    const auto start = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      __m256 acc[kAccumulators];
      for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
      const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
      for (int it = 0; it < kIterations; ++it)
        for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
      float out[kLanes];
      __m256 total = acc[0];
      for (int i = 1; i < kAccumulators; ++i) total = _mm256_add_ps(total, acc[i]);
      _mm256_storeu_ps(out, total);
      sink += out[0];
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (sink == 12345.f) std::printf(" ");  // keeps the loop observable
    samples.push_back(2.0 * kLanes * kAccumulators * static_cast<double>(kIterations) * threads /
                      seconds / 1e9);
  }
  return median(samples);
#else
  (void)threads;
  return 0;
#endif
}

struct Sample {
  double gemm, peak;
};

// Pairs of (GEMM, peak) samples taken back to back.
std::vector<Sample> measure(int64_t n, int repeats, int threads) {
  loom::manual_seed(0);
  const loom::Tensor a = loom::randn({n, n}), b = loom::randn({n, n});
  loom::Tensor c = loom::matmul(a, b);  // warm-up
  std::vector<Sample> samples;
  for (int r = 0; r < repeats; ++r) {
    const double peak = fma_peak_gflops(threads);
    const auto start = Clock::now();
    c = loom::matmul(a, b);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    samples.push_back({2.0 * n * n * n / seconds / 1e9, peak});
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
  std::printf("GEMM %lldx%lldx%lld float32 (median of %d)\n", static_cast<long long>(n),
              static_cast<long long>(n), static_cast<long long>(n), repeats);
  std::printf("| threads | loom GFLOP/s | FMA peak GFLOP/s | loom / peak |\n");
  std::printf("|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    loom::set_num_threads(threads);
    const std::vector<Sample> samples = measure(n, repeats, threads);
    std::vector<double> gemm, peak, ratio;
    for (const Sample& s : samples) {
      gemm.push_back(s.gemm);
      peak.push_back(s.peak);
      ratio.push_back(s.peak > 0 ? s.gemm / s.peak : 0.0);
    }
    std::printf("| %d | %.1f | %.1f | %.2f |\n", threads, median(gemm), median(peak),
                median(ratio));
  }
  return 0;
}

// tensor/cpu_info.cpp — the CPU's name, its vector instructions, and its measured FMA peak.

#include "tensor/cpu_info.h"

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <vector>

namespace loom {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "unknown CPU";
}

std::string cpu_vector_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    std::string extras;
    auto add = [&](bool has, const char* name) {
      if (has) extras += extras.empty() ? name : std::string(", ") + name;
    };
    add(__builtin_cpu_supports("avx512bf16"), "BF16");
    add(__builtin_cpu_supports("avx512fp16"), "FP16");
    add(__builtin_cpu_supports("amx-bf16"), "AMX-BF16");
    return extras.empty() ? "AVX-512" : "AVX-512 (" + extras + ")";
  }
  if (__builtin_cpu_supports("avx2")) return __builtin_cpu_supports("fma") ? "AVX2 + FMA" : "AVX2";
  if (__builtin_cpu_supports("avx")) return "AVX";
  if (__builtin_cpu_supports("sse4.2")) return "SSE4.2";
  return "SSE2";
#else
  return "unknown vector instructions";
#endif
}

namespace {

constexpr int kAccumulators = 12;  // independent chains: enough to hide the FMA latency

// FMAs per thread in `iterations` rounds of the chains, at vector width V (lanes of float).
template <typename V, int kLanesPerVector, typename Fma, typename Init, typename Sum>
double one_sample(int threads, int64_t iterations, Init init, Fma fma, Sum sum) {
  float sink = 0;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    V acc[kAccumulators];
    for (int i = 0; i < kAccumulators; ++i) acc[i] = init(0.001f * static_cast<float>(i));
    const V a = init(0.999999f), b = init(1e-7f);
    for (int64_t it = 0; it < iterations; ++it)
      for (int i = 0; i < kAccumulators; ++i) acc[i] = fma(acc[i], a, b);
    for (int i = 0; i < kAccumulators; ++i) sink += sum(acc[i]);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (sink == 12345.f) return 0;  // keeps the chains observable
  return 2.0 * kLanesPerVector * kAccumulators * static_cast<double>(iterations) * threads /
         seconds / 1e9;
}

// The best of the vector widths this build has: where a CPU runs 512-bit FMAs at half rate,
// the 256-bit ones reach its peak.
double sample(int threads, int64_t iterations) {
  double best = one_sample<float, 1>(
      threads, iterations / 8, [](float x) { return x; },
      [](float x, float a, float b) { return std::fma(x, a, b); }, [](float x) { return x; });
#if defined(__AVX2__) && defined(__FMA__)
  best = std::max(best, one_sample<__m256, 8>(
                            threads, iterations, [](float x) { return _mm256_set1_ps(x); },
                            [](__m256 x, __m256 a, __m256 b) { return _mm256_fmadd_ps(x, a, b); },
                            [](__m256 x) { return _mm256_cvtss_f32(x); }));
#endif
#if defined(__AVX512F__)
  best = std::max(best, one_sample<__m512, 16>(
                            threads, iterations, [](float x) { return _mm512_set1_ps(x); },
                            [](__m512 x, __m512 a, __m512 b) { return _mm512_fmadd_ps(x, a, b); },
                            [](__m512 x) { return _mm512_reduce_add_ps(x); }));
#endif
  return best;
}

}  // namespace

double fma_peak_gflops(int threads) {
  threads = std::max(threads, 1);
  sample(threads, 100'000);  // wakes the cores and the thread pool
  std::vector<double> samples;
  for (int rep = 0; rep < 3; ++rep) samples.push_back(sample(threads, 2'000'000));
  std::sort(samples.begin(), samples.end());
  return samples[1];
}

}  // namespace loom

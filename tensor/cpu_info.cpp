// tensor/cpu_info.cpp — the CPU's name, its vector instructions, and its measured FMA peak.

#include "tensor/cpu_info.h"

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#include "tensor/error.h"

namespace loom {

namespace {

constexpr CpuIsa kIsas[] = {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16,
                            CpuIsa::kAmxBf16};
constexpr CpuIsa kHighest = CpuIsa::kAmxBf16;

// set_max_cpu_isa's cap, or -1 until LOOM_CPU_ISA has been read.
std::atomic<int> g_max_isa{-1};

}  // namespace

std::string_view to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric:
      return "generic";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512_bf16";
    case CpuIsa::kAmxBf16:
      return "amx_bf16";
  }
  return "?";
}

CpuIsa parse_cpu_isa(std::string_view name) {
  for (const CpuIsa isa : kIsas)
    if (name == to_string(isa)) return isa;
  throw ValueError(
      detail::str("LOOM_CPU_ISA=", name,
                  ": not an instruction set loom has kernels for; use generic, "
                  "avx2, avx512, avx512_bf16 or amx_bf16 (Note [CPU instruction sets] in "
                  "tensor/cpu_info.h)"));
}

#if defined(__x86_64__)
namespace {

// Whether this CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22), the OS saves
// the tile state (XCR0 bits 17 and 18), and Linux lets this process use it: the tile data is
// 8 KiB of state per thread, which Linux hands out only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA, once per process, before any thread touches a tile).
bool amx_bf16_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (((edx >> 24) & 1) == 0 || ((edx >> 22) & 1) == 0) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || ((ecx >> 27) & 1) == 0) return false;  // OSXSAVE
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

}  // namespace
#endif

CpuIsa detected_cpu_isa() {
#if defined(__x86_64__) || defined(__i386__)
  static const CpuIsa detected = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
      if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::kAvx512;
#if defined(__x86_64__)
      if (amx_bf16_usable()) return CpuIsa::kAmxBf16;
#endif
      return CpuIsa::kAvx512Bf16;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
    return CpuIsa::kGeneric;
  }();
  return detected;
#else
  return CpuIsa::kGeneric;
#endif
}

CpuIsa cpu_isa() {
  int cap = g_max_isa.load(std::memory_order_relaxed);
  if (cap < 0) {
    const char* text = std::getenv("LOOM_CPU_ISA");
    const CpuIsa from_env = text == nullptr || *text == '\0' ? kHighest : parse_cpu_isa(text);
    int unset = -1;
    g_max_isa.compare_exchange_strong(unset, static_cast<int>(from_env));
    cap = g_max_isa.load(std::memory_order_relaxed);
  }
  return std::min(detected_cpu_isa(), static_cast<CpuIsa>(cap));
}

CpuIsa set_max_cpu_isa(CpuIsa isa) {
  const int before = g_max_isa.exchange(static_cast<int>(isa));
  return before < 0 ? kHighest : static_cast<CpuIsa>(before);
}

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
    // AVX512-FP16 and AMX-BF16 from CPUID leaf 7 (EDX bits 23 and 22): clang 14 does not know
    // their names in __builtin_cpu_supports.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool leaf7 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx);
    add(leaf7 && ((edx >> 23) & 1), "FP16");
    add(leaf7 && ((edx >> 22) & 1), "AMX-BF16");
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

// GFLOP/s of `threads` threads each running `iterations` rounds of the chains, each FMA on
// `lanes` floats.
double gflops(int threads, int64_t iterations, int lanes, double seconds) {
  return 2.0 * lanes * kAccumulators * static_cast<double>(iterations) * threads / seconds / 1e9;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One thread's chains at one width: VECTOR the type, SET(x) a vector of x, FMA(x, a, b)
// x * a + b, FIRST(x) its first lane; returns a sum of the results, which keeps the chains
// observable. Written out per width, each in a function compiled for that width's instructions
// (target attributes: the build's baseline may lack them). The parallel region stays outside
// these functions: clang's outlined OpenMP bodies do not inherit a target attribute.
#define LOOM_FMA_CHAINS(VECTOR, SET, FMA, FIRST)                                        \
  VECTOR acc[kAccumulators];                                                            \
  for (int i = 0; i < kAccumulators; ++i) acc[i] = SET(0.001f * static_cast<float>(i)); \
  const VECTOR a = SET(0.999999f), b = SET(1e-7f);                                      \
  for (int64_t it = 0; it < iterations; ++it)                                           \
    for (int i = 0; i < kAccumulators; ++i) acc[i] = FMA(acc[i], a, b);                 \
  float sum = 0;                                                                        \
  for (int i = 0; i < kAccumulators; ++i) sum += FIRST(acc[i]);                         \
  return sum;

float identity(float x) { return x; }

float chains_scalar(int64_t iterations) { LOOM_FMA_CHAINS(float, identity, std::fma, identity) }

#if defined(__x86_64__)
[[gnu::target("avx2,fma")]] float chains_256(int64_t iterations) {
  LOOM_FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_cvtss_f32)
}

// Through memory: GCC 12's own lane-extracting intrinsics warn about their headers.
[[gnu::target("avx512f")]] inline float first_lane(__m512 x) {
  float lanes[16];
  _mm512_storeu_ps(lanes, x);
  return lanes[0];
}

[[gnu::target("avx512f")]] float chains_512(int64_t iterations) {
  LOOM_FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, first_lane)
}

// x + the dot products of the bfloat16 pairs of a and b (each float rounded to bfloat16 and
// paired with itself): one vdpbf16ps, 32 multiply-adds. The conversions of the loop's
// constants are hoisted out of the loop.
[[gnu::target("avx512f,avx512bf16")]] inline __m512 dot_bf16(__m512 x, __m512 a, __m512 b) {
  return _mm512_dpbf16_ps(x, _mm512_cvtne2ps_pbh(a, a), _mm512_cvtne2ps_pbh(b, b));
}

[[gnu::target("avx512f,avx512bf16")]] float chains_bf16_512(int64_t iterations) {
  LOOM_FMA_CHAINS(__m512, _mm512_set1_ps, dot_bf16, first_lane)
}

// Four independent chains of tdpbf16ps on 16 x 16 float32 tiles (tmm0-3) from two A tiles and
// two B tiles of ones (tmm4-7), three rounds of the four per iteration: twelve products of
// 16 x 16 x 32 multiply-adds, as the FMA chains' twelve accumulators. Each thread configures
// its tiles and releases them after.
[[gnu::target("amx-tile,amx-bf16")]] float chains_amx(int64_t iterations) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  alignas(64) uint16_t ones[16 * 32];
  std::fill(std::begin(ones), std::end(ones), uint16_t{0x3f80});  // bfloat16 1.0
  alignas(64) float out[16 * 16];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int round = 0; round < 3; ++round) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}
#endif
#undef LOOM_FMA_CHAINS

// GFLOP/s of `threads` threads each running `chains` for `iterations` rounds, each FMA on
// `lanes` floats.
double timed(float (*chains)(int64_t), int threads, int64_t iterations, int lanes) {
  float sink = 0;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += chains(iterations);
  const double seconds = seconds_since(start);
  if (sink == 12345.f) return 0;
  return gflops(threads, iterations, lanes, seconds);
}

// sample's and peak's `bits` for 512-bit vdpbf16ps chains and for AMX tiles (0, 256 and 512
// are FMAs).
constexpr int kBf16Dots = -1, kAmxTiles = -2;

double sample(int threads, int64_t iterations, int bits) {
#if defined(__x86_64__)
  if (bits == 256)
    return detected_cpu_isa() >= CpuIsa::kAvx2 ? timed(chains_256, threads, iterations, 8) : 0;
  if (bits == 512)
    return detected_cpu_isa() >= CpuIsa::kAvx512 ? timed(chains_512, threads, iterations, 16) : 0;
  if (bits == kBf16Dots)
    return detected_cpu_isa() >= CpuIsa::kAvx512Bf16
               ? timed(chains_bf16_512, threads, iterations, 32)
               : 0;
  // Twelve tile products of 16 x 16 x 32 per iteration (8192 "lanes"), each some 16 cycles:
  // a sixteenth of the iterations takes about as long as the FMA chains.
  if (bits == kAmxTiles)
    return detected_cpu_isa() >= CpuIsa::kAmxBf16
               ? timed(chains_amx, threads, iterations / 16, 16 * 16 * 32)
               : 0;
#endif
  return bits == 0 ? timed(chains_scalar, threads, iterations / 8, 1) : 0;
}

// The median of three samples of `bits`' chains after a short one; 0 where they do not run.
double peak(int threads, int bits) {
  threads = std::max(threads, 1);
  if (sample(threads, 100'000, bits) == 0) return 0;  // also wakes the cores and the thread pool
  std::vector<double> samples;
  for (int rep = 0; rep < 3; ++rep) samples.push_back(sample(threads, 2'000'000, bits));
  std::sort(samples.begin(), samples.end());
  return samples[1];
}

}  // namespace

double fma_peak_gflops(int threads, int bits) {
  LOOM_CHECK(bits == 0 || bits == 256 || bits == 512, ValueError,
             "fma_peak_gflops: bits must be 0, 256 or 512; got ", bits);
  return peak(threads, bits);
}

double bf16_dot_peak_gflops(int threads) { return peak(threads, kBf16Dots); }

double amx_bf16_peak_gflops(int threads) { return peak(threads, kAmxTiles); }

double fma_peak_gflops(int threads) {
  const double wide = std::max(fma_peak_gflops(threads, 256), fma_peak_gflops(threads, 512));
  return wide > 0 ? wide : fma_peak_gflops(threads, 0);
}

double best_rate_ratio(const std::function<double()>& numerator,
                       const std::function<double()>& denominator, int rounds) {
  double best_numerator = 0, best_denominator = 0;
  for (int round = 0; round < rounds; ++round) {
    best_numerator = std::max(best_numerator, numerator());
    best_denominator = std::max(best_denominator, denominator());
  }
  return best_denominator > 0 ? best_numerator / best_denominator : 0;
}

double bf16_peak_ratio(bool amx) {
  const int bits = amx ? kAmxTiles : kBf16Dots;
  if (sample(1, 10'000, bits) == 0) return 0;  // also wakes the core
  // A 512-bit chain of 250'000 iterations is 3 million dependent-free instructions: about a
  // millisecond, shorter than the time slice a busy neighbour gets.
  constexpr int64_t kIterations = 250'000;
  constexpr int kRounds = 15;
  return best_rate_ratio(
      [&] { return sample(1, kIterations, bits); },
      [&] { return std::max(sample(1, kIterations, 256), sample(1, kIterations, 512)); }, kRounds);
}

}  // namespace loom

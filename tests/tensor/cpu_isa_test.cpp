// tests/tensor/cpu_isa_test.cpp — Note [CPU instruction sets]: LOOM_CPU_ISA's names, the cap
// that lets a lower path run on a CPU with a higher one, the FMA peaks per width, and the
// float32 GEMM of every path this CPU runs against float64 on shapes that hit every edge of the
// packed driver (conv2d's paths are in conv_test). A path above this CPU is skipped, saying so.

#include <cstring>
#include <string>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/packed_gemm.h"
#include "tensor/cpu_info.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr CpuIsa kAll[] = {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16,
                           CpuIsa::kAmxBf16};

// Caps cpu_isa() for one scope.
class IsaCap {
 public:
  explicit IsaCap(CpuIsa isa) : before_(set_max_cpu_isa(isa)) {}
  ~IsaCap() { set_max_cpu_isa(before_); }

 private:
  CpuIsa before_;
};

TEST(CpuIsa, NamesRoundTripAndAnUnknownOneIsAValueError) {
  for (const CpuIsa isa : kAll) EXPECT_EQ(parse_cpu_isa(to_string(isa)), isa);
  EXPECT_LOOM_ERROR(parse_cpu_isa("avx3"), ValueError,
                    {"LOOM_CPU_ISA=avx3", "generic, avx2, avx512, avx512_bf16 or amx_bf16"});
  EXPECT_LOOM_ERROR(parse_cpu_isa(""), ValueError, {"LOOM_CPU_ISA="});
}

TEST(CpuIsa, TheCapLowersThePathAndNeverRaisesIt) {
  const CpuIsa detected = detected_cpu_isa();
  std::printf("[ detected ] %s: %s\n", cpu_vector_isa().c_str(),
              std::string(to_string(detected)).c_str());
  for (const CpuIsa cap : kAll) {
    IsaCap scope(cap);
    EXPECT_EQ(cpu_isa(), std::min(cap, detected)) << to_string(cap);
  }
  // What the detection says agrees with the longer description of the CPU.
  const std::string described = cpu_vector_isa();
  EXPECT_EQ(detected >= CpuIsa::kAvx512, described.rfind("AVX-512", 0) == 0) << described;
  EXPECT_EQ(detected >= CpuIsa::kAvx512Bf16, described.find("BF16") != std::string::npos)
      << described;
  EXPECT_EQ(detected == CpuIsa::kAvx2, described == "AVX2 + FMA") << described;
  // AMX counts only where the CPU has it (the OS may still refuse it: then kAvx512Bf16).
  if (detected >= CpuIsa::kAmxBf16) {
    EXPECT_NE(described.find("AMX-BF16"), std::string::npos) << described;
  }
}

TEST(CpuIsa, EachWidthsPeakIsMeasuredWhereTheCpuHasIt) {
  const CpuIsa detected = detected_cpu_isa();
  const double scalar = fma_peak_gflops(1, 0), p256 = fma_peak_gflops(1, 256),
               p512 = fma_peak_gflops(1, 512);
  std::printf("[ measured ] 1 thread: scalar %.1f, 256-bit %.1f, 512-bit %.1f GFLOP/s\n", scalar,
              p256, p512);
  EXPECT_GT(scalar, 0);
  EXPECT_EQ(p256 > 0, detected >= CpuIsa::kAvx2);
  EXPECT_EQ(p512 > 0, detected >= CpuIsa::kAvx512);
  if (p256 > 0) {
    EXPECT_GT(p256, 2 * scalar);  // 8 lanes against 1: far more, even when noisy
  }
  EXPECT_LOOM_ERROR(fma_peak_gflops(1, 128), ValueError, {"fma_peak_gflops", "128"});
}

// A decision taken on a ratio of two measured rates must not move with the machine's load:
// here the numerator's true rate is 200 and the denominator's 100, but load slows nine of ten
// numerator samples to 90 and one denominator sample in ten. The median of each, or the first
// sample of each, puts the ratio at 0.9; the best of each finds 2.
TEST(CpuIsa, ARatioOfRatesTakesTheBestSampleOfEachInAlternation) {
  std::string order;
  int n = 0, d = 0;
  const auto numerator = [&] {
    order += 'n';
    return n++ % 10 == 7 ? 200.0 : 90.0;
  };
  const auto denominator = [&] {
    order += 'd';
    return d++ % 10 == 3 ? 50.0 : 100.0;
  };
  EXPECT_DOUBLE_EQ(best_rate_ratio(numerator, denominator, 10), 2.0);
  EXPECT_EQ(order, "ndndndndndndndndndnd");
  EXPECT_DOUBLE_EQ(best_rate_ratio(
                       numerator, [] { return 0.0; }, 3),
                   0.0);
}

TEST(CpuIsa, TheBf16PeakRatioIsMeasuredWhereTheCpuHasTheInstructions) {
  const CpuIsa detected = detected_cpu_isa();
  const double dot = bf16_peak_ratio(/*amx=*/false), amx = bf16_peak_ratio(/*amx=*/true);
  std::printf("[ measured ] bfloat16 over float32 peak: vdpbf16ps %.2f, AMX %.2f\n", dot, amx);
  EXPECT_EQ(dot > 0, detected >= CpuIsa::kAvx512Bf16);
  EXPECT_EQ(amx > 0, detected >= CpuIsa::kAmxBf16);
  if (dot > 0) {
    // vdpbf16ps does 32 multiply-adds against a 512-bit FMA's 16: where it issues at all, it
    // is at most 2x float32's peak, and CPUs seen so far issue it at half or full rate.
    EXPECT_GT(dot, 0.3);
    EXPECT_LT(dot, 2.6);
  }
}

#if LOOM_PACKED_GEMM_SIMD
// Note [Prefetching the C tile]: whatever the depth, the 24 lines of the tile are fetched once
// each (early, or one per kStride steps of the spread), the spread covers at most 96 steps and
// ends kLead steps before the stores (or at once when there are fewer).
TEST(CpuIsa, TheCTilePrefetchFetchesEachLineOnceAndEndsBeforeTheStores) {
  using cpu::TilePrefetch;
  for (int64_t steps = 0; steps <= 400; ++steps) {
    const TilePrefetch s(steps);
    const int64_t spread = s.spread_end - s.quiet;
    EXPECT_EQ(s.early + (spread + TilePrefetch::kStride - 1) / TilePrefetch::kStride,
              TilePrefetch::kLines)
        << steps << " steps";
    EXPECT_GE(s.quiet, 0) << steps;
    EXPECT_LE(spread, TilePrefetch::kLines * TilePrefetch::kStride) << steps;
    EXPECT_EQ(steps - s.spread_end, std::min<int64_t>(TilePrefetch::kLead, steps)) << steps;
    if (steps >= TilePrefetch::kLead + TilePrefetch::kLines * TilePrefetch::kStride) {
      EXPECT_EQ(s.early, 0) << steps << " steps: deep enough to spread every line";
    }
  }
}
#endif

// C = alpha op(A) op(B) + beta C in float32 on the path `isa`, against float64.
void check_gemm(CpuIsa isa, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                float beta) {
  IsaCap scope(isa);
  manual_seed(m * 1000 + n * 10 + k);
  const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}), b = randn(tb ? Shape{n, k} : Shape{k, n});
  const Tensor c0 = randn({m, n});
  Tensor c = c0.clone();
  cpu::gemm<float>(ta, tb, m, n, k, alpha, a.data_ptr<float>(), ta ? m : k, b.data_ptr<float>(),
                   tb ? k : n, beta, c.data_ptr<float>(), n);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const std::vector<double> cv = c0.to_vector<double>();
  std::vector<double> want(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += av[ta ? p * m + i : i * k + p] * bv[tb ? j * k + p : p * n + j];
      want[i * n + j] = alpha * sum + beta * cv[i * n + j];
    }
  EXPECT_TRUE(test::tensors_close(c, tensor(want, {m, n}), 1e-4, 1e-4))
      << to_string(isa) << ": " << (ta ? "A^T " : "A ") << (tb ? "B^T " : "B ") << m << "x" << n
      << "x" << k << " alpha " << alpha << " beta " << beta;
}

TEST(CpuIsa, EveryPathThisCpuRunsMultipliesCorrectly) {
  // Shapes: edges of the register tiles (6 x 16, 12 x 32) and of the cache blocks (KC 192 and
  // 256, MC 120 and 144), several passes over K, balanced ones among them (Note [Balanced K
  // blocks]: 1024 is 5 x 176 + 144 on the AVX-512 path), K under and just over the 96 steps in
  // which the AVX-512 kernel prefetches C (Note [Prefetching the C tile]), rows 4 KiB apart
  // (Note [Staging C]).
  struct Case {
    int64_t m, n, k;
  };
  const std::vector<Case> cases = {{37, 45, 41},   {12, 32, 192},   {13, 33, 193},
                                   {145, 70, 520}, {64, 1024, 300}, {121, 97, 257},
                                   {25, 40, 1024}, {24, 64, 100},   {30, 1024, 385}};
  for (const CpuIsa isa : kAll) {
    if (isa > detected_cpu_isa()) {
      std::printf("[ skipped  ] %s: this CPU has %s\n", std::string(to_string(isa)).c_str(),
                  cpu_vector_isa().c_str());
      continue;
    }
    for (const Case& c : cases)
      for (const bool ta : {false, true})
        for (const bool tb : {false, true}) check_gemm(isa, ta, tb, c.m, c.n, c.k, 1.0f, 0.0f);
    check_gemm(isa, false, false, 50, 70, 90, 0.5f, 1.5f);  // alpha folded into A, beta on C
    check_gemm(isa, true, false, 50, 70, 90, -2.0f, 1.0f);
  }
}

// Note [Edge tiles]: the last tile of an A block with 4 or 8 real rows runs a shorter kernel,
// whose rows must be the bits the full kernel gives them. So the first m rows of a product are
// compared with the same rows of a product whose m is a whole number of tiles: 64 and 68 rows
// end in tiles of 4 and 8 (of 12), 66 in 6 rows of the 8-row kernel, 148 in one of 4 in the
// second MC block, and 70 (10 rows) in a full tile; two passes over K, C accumulated (beta 1)
// and not. The rows past m must be left as they were.
TEST(CpuIsa, EdgeTilesGiveTheirRowsTheBitsOfAFullTile) {
  const int64_t k = 300, n = 100, rows = 156;
  manual_seed(11);
  const Tensor a = randn({rows, k}), b = randn({k, n}), c0 = randn({rows, n});
  for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa > detected_cpu_isa()) continue;
    IsaCap scope(isa);
    for (const float beta : {0.0f, 1.0f}) {
      Tensor whole = c0.clone();
      cpu::gemm<float>(false, false, rows, n, k, 1.0f, a.data_ptr<float>(), k, b.data_ptr<float>(),
                       n, beta, whole.data_ptr<float>(), n);
      for (const int64_t m : {64, 66, 68, 70, 148}) {
        Tensor part = c0.clone();
        cpu::gemm<float>(false, false, m, n, k, 1.0f, a.data_ptr<float>(), k, b.data_ptr<float>(),
                         n, beta, part.data_ptr<float>(), n);
        EXPECT_EQ(std::memcmp(part.data(), whole.data(), m * n * sizeof(float)), 0)
            << to_string(isa) << ": " << m << " rows, beta " << beta;
        EXPECT_EQ(std::memcmp(part.data_ptr<float>() + m * n, c0.data_ptr<float>() + m * n,
                              (rows - m) * n * sizeof(float)),
                  0)
            << to_string(isa) << ": the rows past " << m << " were written";
      }
    }
  }
}

// The AVX-512 float kernel's K block, for balanced_kc.
struct Blocks {
  static constexpr int64_t kc = 192;
};

TEST(CpuIsa, BalancedKBlocksKeepThePassCountAndAreEvenWithinEight) {
  for (int64_t k = 1; k <= 3000; ++k) {
    const int64_t depth = cpu::balanced_kc<Blocks>(k);
    const int64_t passes = (k + depth - 1) / depth;
    ASSERT_LE(depth, Blocks::kc) << "k " << k;
    ASSERT_EQ(depth % 8, 0) << "k " << k;
    ASSERT_EQ(passes, (k + Blocks::kc - 1) / Blocks::kc) << "k " << k;
    // The last pass is at most 8 per pass shorter than the others.
    ASSERT_GE(k - (passes - 1) * depth, depth - 8 * passes) << "k " << k;
  }
  EXPECT_EQ(cpu::balanced_kc<Blocks>(1024), 176);
  EXPECT_EQ(cpu::balanced_kc<Blocks>(192), 192);
}

TEST(CpuIsa, ACappedPathRunsOtherKernels) {
  // The paths sum in different orders, so a product of 256-long dot products differs in some
  // bits between any two of them: evidence that the cap reaches the dispatch.
  const Tensor a = randn({96, 256}), b = randn({256, 128});
  std::vector<Tensor> results;
  std::vector<CpuIsa> isas;
  for (const CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa > detected_cpu_isa()) continue;
    IsaCap scope(isa);
    results.push_back(matmul(a, b));
    isas.push_back(isa);
  }
  if (results.size() < 2) GTEST_SKIP() << "one path on this CPU: " << cpu_vector_isa();
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_NE(std::memcmp(results[0].data(), results[i].data(), results[0].nbytes()), 0)
        << to_string(isas[0]) << " and " << to_string(isas[i]) << " gave the same bits";
    EXPECT_TRUE(test::tensors_close(results[i], results[0], 1e-4, 1e-4));
  }
}

}  // namespace
}  // namespace loom

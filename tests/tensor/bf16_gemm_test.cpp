// tests/tensor/bf16_gemm_test.cpp — Note [bf16 dot products] and Note [bf16 products on AMX
// tiles]: cpu::gemm_bf16's vdpbf16ps and AMX kernels, each against float64 and against the
// widened float32 path, on shapes at the edges of its tiles and
// blocks (odd k among them), both layouts of each operand, alpha and beta, 1 and 2 threads; mm,
// addmm and bmm of bfloat16 tensors through it (Note [16-bit products on the CPU]); and, on every
// CPU, the widened path that a CPU without AVX512_BF16 takes, or one capped below avx512_bf16,
// bit for bit. The kernels' tests run each kernel the CPU has (capping cpu_isa() at avx512_bf16
// for vdpbf16ps) and skip where it has neither, saying so.

#include "tensor/cpu/bf16_gemm.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/linalg.h"
#include "tensor/cpu_info.h"
#include "tensor/linalg.h"
#include "test_util.h"

namespace loom {
namespace {

// float32's unit roundoff, and bfloat16's (half its epsilon 2^-7).
constexpr double kU32 = 0x1p-24, kU16 = 0x1p-8;

// Caps cpu_isa() and sets the thread count for one scope.
class Scope {
 public:
  Scope(CpuIsa isa, int threads) : isa_(set_max_cpu_isa(isa)), threads_(get_num_threads()) {
    set_num_threads(threads);
  }
  ~Scope() {
    set_num_threads(threads_);
    set_max_cpu_isa(isa_);
  }

 private:
  CpuIsa isa_;
  int threads_;
};

#define SKIP_WITHOUT_BF16()                                                                 \
  if (detected_cpu_isa() < CpuIsa::kAvx512Bf16)                                             \
  GTEST_SKIP() << "this CPU has " << cpu_vector_isa() << ", no AVX512_BF16: the vdpbf16ps " \
               << "kernel cannot run here (the widened path's tests still do)"

// The instruction sets whose bfloat16 kernels this CPU runs: avx512_bf16 (vdpbf16ps), and
// amx_bf16 (tiles) above it.
std::vector<CpuIsa> kernel_isas() {
  std::vector<CpuIsa> isas;
  for (const CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAmxBf16})
    if (isa <= detected_cpu_isa()) isas.push_back(isa);
  return isas;
}

// One GEMM problem: bfloat16 operands as stored (A [m, k] or [k, m] when ta, likewise B) and a
// float32 C, with its float64 reference alpha op(A) op(B) + beta C and, per element, the bound
// of a float32 evaluation of it: (k + 2) roundings of float32 on the sum of the magnitudes.
struct Problem {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  Tensor a, b, c0;  // bfloat16, bfloat16, float32
  std::vector<double> want, bound;

  Problem(bool ta_, bool tb_, int64_t m_, int64_t n_, int64_t k_, float alpha_, float beta_)
      : ta(ta_), tb(tb_), m(m_), n(n_), k(k_), alpha(alpha_), beta(beta_) {
    manual_seed(m * 7919 + n * 31 + k);
    a = randn(ta ? Shape{k, m} : Shape{m, k}).to(kBFloat16);
    b = randn(tb ? Shape{n, k} : Shape{k, n}).to(kBFloat16);
    c0 = randn({m, n});
    const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    const std::vector<double> cv = c0.to_vector<double>();
    want.resize(m * n);
    bound.resize(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = av[ta ? p * m + i : i * k + p] * bv[tb ? j * k + p : p * n + j];
          sum += x;
          magnitude += std::fabs(x);
        }
        want[i * n + j] = alpha * sum + beta * cv[i * n + j];
        bound[i * n + j] = (static_cast<double>(k) + 2) * kU32 *
                           (std::fabs(alpha) * magnitude + std::fabs(beta * cv[i * n + j]));
      }
  }

  // C by gemm_bf16 on the path cpu_isa() picks.
  Tensor run() const {
    Tensor c = c0.clone();
    cpu::gemm_bf16(ta, tb, m, n, k, alpha, a.data_ptr<BFloat16>(), ta ? m : k,
                   b.data_ptr<BFloat16>(), tb ? k : n, beta, c.data_ptr<float>(), n);
    return c;
  }

  // C by the float32 GEMM on the widened operands: the widened path of the Note.
  Tensor widened() const {
    Tensor c = c0.clone();
    const Tensor a32 = a.to(kFloat32), b32 = b.to(kFloat32);
    cpu::gemm<float>(ta, tb, m, n, k, alpha, a32.data_ptr<float>(), ta ? m : k,
                     b32.data_ptr<float>(), tb ? k : n, beta, c.data_ptr<float>(), n);
    return c;
  }

  std::string name() const {
    return detail::str(ta ? "A^T " : "A ", tb ? "B^T " : "B ", m, "x", n, "x", k, " alpha ", alpha,
                       " beta ", beta);
  }
};

// Every element of c within `scale` times its bound of `reference`.
::testing::AssertionResult within_bound(const Tensor& c, const std::vector<double>& reference,
                                        const std::vector<double>& bound, double scale) {
  const std::vector<double> got = c.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - reference[i]) <= scale * bound[i]))
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs "
                                           << reference[i] << ", bound " << scale * bound[i];
  return ::testing::AssertionSuccess();
}

bool same_bits(const Tensor& x, const Tensor& y) {
  return x.sizes() == y.sizes() && std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

// Shapes at the edges of the 12 x 32 tile, of the K block (384 k) and the M block (144 rows),
// odd k (a last pair with a zero half) and k below one group of the packers' 8 pairs, C's rows
// 4 KiB apart with several passes over K (Note [Staging C]), more columns than one N block.
struct Shape3 {
  int64_t m, n, k;
};
const std::vector<Shape3> kShapes = {{1, 1, 1},     {12, 32, 2},    {13, 33, 3},
                                     {37, 45, 41},  {11, 31, 17},   {145, 70, 385},
                                     {24, 64, 768}, {121, 97, 769}, {5, 3100, 21}};

TEST(Bf16Gemm, TheKernelIsWithinFloat32RoundingOfFloat64AndOfTheWidenedPath) {
  SKIP_WITHOUT_BF16();
  for (const CpuIsa isa : kernel_isas())
    for (const int threads : {1, 2}) {
      Scope scope(isa, threads);
      ASSERT_TRUE(cpu::bf16_dot_products());
      ASSERT_EQ(cpu::amx_bf16_products(), isa == CpuIsa::kAmxBf16);
      for (const Shape3& s : kShapes)
        for (const bool ta : {false, true})
          for (const bool tb : {false, true}) {
            const Problem p(ta, tb, s.m, s.n, s.k, 1.0f, 0.0f);
            const std::string where =
                detail::str(p.name(), ", ", to_string(isa), ", ", threads, " threads");
            const Tensor c = p.run(), widened = p.widened();
            EXPECT_TRUE(within_bound(c, p.want, p.bound, 1.0)) << where;
            // Each is within its bound of float64, so within twice of the other.
            EXPECT_TRUE(within_bound(c, widened.to_vector<double>(), p.bound, 2.0))
                << where << ", against the widened path";
          }
    }
}

TEST(Bf16Gemm, AlphaScalesTheFloat32ResultAndBetaC) {
  SKIP_WITHOUT_BF16();
  for (const CpuIsa isa : kernel_isas()) {
    Scope scope(isa, 2);
    struct Scalars {
      float alpha, beta;
    };
    // alpha alone, beta alone, both (the product staged apart), and C ignored when beta is 0.
    for (const Scalars s : {Scalars{0.5f, 0.0f}, Scalars{1.0f, 1.0f}, Scalars{1.0f, -1.5f},
                            Scalars{-2.0f, 0.25f}, Scalars{0.0f, 2.0f}})
      for (const bool ta : {false, true}) {
        const Problem p(ta, !ta, 50, 70, 401, s.alpha, s.beta);
        EXPECT_TRUE(within_bound(p.run(), p.want, p.bound, 1.0)) << p.name() << to_string(isa);
      }
    Problem nan_c(false, false, 13, 40, 9, 1.0f, 0.0f);
    nan_c.c0.fill_(std::nan(""));
    EXPECT_TRUE(within_bound(nan_c.run(), nan_c.want, nan_c.bound, 1.0))
        << "beta 0 ignores NaN, " << to_string(isa);
    // k = 0: C = beta C.
    const Problem empty(false, false, 4, 40, 0, 1.0f, 0.5f);
    EXPECT_TRUE(within_bound(empty.run(), empty.want, empty.bound, 1.0))
        << empty.name() << to_string(isa);
  }
}

TEST(Bf16Gemm, ThreadsSplitColumnsSoTheBitsDoNotDependOnThem) {
  SKIP_WITHOUT_BF16();
  const Problem p(false, true, 100, 333, 500, 1.0f, 1.0f);
  for (const CpuIsa isa : kernel_isas()) {
    Tensor one, two;
    {
      Scope scope(isa, 1);
      one = p.run();
    }
    {
      Scope scope(isa, 2);
      two = p.run();
    }
    EXPECT_TRUE(same_bits(one, two)) << to_string(isa);
  }
}

// Note [Edge tiles] in tensor/cpu/packed_gemm.h: the vdpbf16ps kernel's last tile with 4 or 8
// real rows (of 12) runs a shorter kernel; its rows are the bits a full tile gives them (the
// first m rows against a product with a whole number of tiles, C accumulated and not), and
// the rows past m are left alone.
TEST(Bf16Gemm, EdgeTilesGiveTheirRowsTheBitsOfAFullTile) {
  SKIP_WITHOUT_BF16();
  Scope scope(CpuIsa::kAvx512Bf16, 2);
  const cpu::Bf16DotPolicy policy = cpu::set_bf16_dot_policy(cpu::Bf16DotPolicy::kOn);
  const int64_t k = 801, n = 100, rows = 156;
  manual_seed(12);
  const Tensor a = randn({rows, k}).to(kBFloat16), b = randn({k, n}).to(kBFloat16);
  const Tensor c0 = randn({rows, n});
  for (const float beta : {0.0f, 1.0f}) {
    Tensor whole = c0.clone();
    cpu::gemm_bf16(false, false, rows, n, k, 1.0f, a.data_ptr<BFloat16>(), k,
                   b.data_ptr<BFloat16>(), n, beta, whole.data_ptr<float>(), n);
    for (const int64_t m : {64, 66, 68, 70, 148}) {
      Tensor part = c0.clone();
      cpu::gemm_bf16(false, false, m, n, k, 1.0f, a.data_ptr<BFloat16>(), k, b.data_ptr<BFloat16>(),
                     n, beta, part.data_ptr<float>(), n);
      EXPECT_EQ(std::memcmp(part.data(), whole.data(), m * n * sizeof(float)), 0)
          << m << " rows, beta " << beta;
      EXPECT_EQ(std::memcmp(part.data_ptr<float>() + m * n, c0.data_ptr<float>() + m * n,
                            (rows - m) * n * sizeof(float)),
                0)
          << "the rows past " << m << " were written";
    }
  }
  cpu::set_bf16_dot_policy(policy);
}

#if LOOM_PACKED_GEMM_SIMD
// The packer of a row-major B [k, n] as gemm_bf16_pair_panels asks for it: 32-column panels of
// k-pairs, the low half the even k, zeros past n and past an odd k.
cpu::PairPanelPacker plain_pairs(const BFloat16* b, int64_t k, int64_t n) {
  return [=](int64_t pc, int64_t kc, int64_t j, int64_t nc, uint32_t* dst) {
    const int64_t pairs = (kc + 1) / 2;
    for (int64_t panel = 0; panel * 32 < nc; ++panel)
      for (int64_t q = 0; q < pairs; ++q)
        for (int64_t l = 0; l < 32; ++l) {
          const int64_t col = j + panel * 32 + l, lo = pc + 2 * q;
          const bool inside = panel * 32 + l < nc;
          const uint16_t low = inside ? b[lo * n + col].bits : 0;
          const uint16_t high =
              inside && lo + 1 < pc + kc && lo + 1 < k ? b[(lo + 1) * n + col].bits : 0;
          dst[(panel * pairs + q) * 32 + l] = low | static_cast<uint32_t>(high) << 16;
        }
  };
}

TEST(Bf16Gemm, CallerPackedPanelsGiveTheBitsOfThePackedB) {
  SKIP_WITHOUT_BF16();
  if (detected_cpu_isa() >= CpuIsa::kAmxBf16) GTEST_SKIP() << "AMX runs the tile kernel";
  // Odd k across two K blocks, n past a panel: as conv2d's patch panels feed it.
  const int64_t m = 29, n = 75, k = 801;
  manual_seed(5);
  const Tensor a = randn({m, k}).to(kBFloat16), b = randn({k, n}).to(kBFloat16);
  for (const int threads : {1, 2}) {
    Scope scope(CpuIsa::kAvx512Bf16, threads);
    Tensor packed = empty({m, n}), plain = empty({m, n});
    cpu::gemm_bf16(false, false, m, n, k, 1.0f, a.data_ptr<BFloat16>(), k, b.data_ptr<BFloat16>(),
                   n, 0.0f, plain.data_ptr<float>(), n);
    cpu::gemm_bf16_pair_panels(m, n, k, a.data_ptr<BFloat16>(), k,
                               plain_pairs(b.data_ptr<BFloat16>(), k, n), packed.data_ptr<float>(),
                               n);
    EXPECT_TRUE(same_bits(packed, plain)) << threads << " threads";
    // Accumulating into C (conv2d's weight gradient sums its chunks so) is gemm_bf16's beta 1.
    const Tensor c0 = randn({m, n});
    Tensor added = c0.clone(), plain_added = c0.clone();
    cpu::gemm_bf16(false, false, m, n, k, 1.0f, a.data_ptr<BFloat16>(), k, b.data_ptr<BFloat16>(),
                   n, 1.0f, plain_added.data_ptr<float>(), n);
    cpu::gemm_bf16_pair_panels(m, n, k, a.data_ptr<BFloat16>(), k,
                               plain_pairs(b.data_ptr<BFloat16>(), k, n), added.data_ptr<float>(),
                               n, /*accumulate=*/true);
    EXPECT_TRUE(same_bits(added, plain_added)) << threads << " threads, accumulating";
    EXPECT_FALSE(same_bits(added, packed)) << "C was not added";
  }
  Scope below(CpuIsa::kAvx512, 1);
  EXPECT_LOOM_ERROR(cpu::gemm_bf16_pair_panels(m, n, k, a.data_ptr<BFloat16>(), k,
                                               plain_pairs(b.data_ptr<BFloat16>(), k, n),
                                               empty({m, n}).data_ptr<float>(), n),
                    ValueError, {"gemm_bf16_pair_panels", "avx512", "k=801"});
}
#endif

TEST(Bf16Gemm, TheKernelSumsInAnotherOrderThanTheWidenedPath) {
  SKIP_WITHOUT_BF16();
  // Evidence that the kernel ran: 512-long sums in pairs differ in some bits from the float32
  // GEMM's, and stay within the bound.
  const Problem p(false, false, 64, 96, 512, 1.0f, 0.0f);
  for (const CpuIsa isa : kernel_isas()) {
    Scope scope(isa, 2);
    const Tensor c = p.run(), widened = p.widened();
    EXPECT_FALSE(same_bits(c, widened)) << to_string(isa);
    EXPECT_TRUE(within_bound(c, widened.to_vector<double>(), p.bound, 2.0)) << to_string(isa);
  }
}

TEST(Bf16Gemm, DenormalsCountAsZeroInTheKernel) {
  SKIP_WITHOUT_BF16();
  // vdpbf16ps reads a denormal bfloat16 as 0; the widened path multiplies it.
  const Tensor a = full({1, 2}, 1e-39).to(kBFloat16), b = full({2, 32}, 1.0).to(kBFloat16);
  ASSERT_NE(a.to_vector<double>()[0], 0.0);
  Tensor c = zeros({1, 32});
  for (const CpuIsa isa : kernel_isas()) {
    Scope scope(isa, 1);
    cpu::gemm_bf16(false, false, 1, 32, 2, 1.0f, a.data_ptr<BFloat16>(), 2, b.data_ptr<BFloat16>(),
                   32, 0.0f, c.data_ptr<float>(), 32);
    EXPECT_EQ(c.to_vector<double>()[0], 0.0) << to_string(isa);
  }
  {
    Scope scope(CpuIsa::kAvx512, 1);
    cpu::gemm_bf16(false, false, 1, 32, 2, 1.0f, a.data_ptr<BFloat16>(), 2, b.data_ptr<BFloat16>(),
                   32, 0.0f, c.data_ptr<float>(), 32);
  }
  EXPECT_GT(c.to_vector<double>()[0], 0.0);
}

// beta c + alpha a @ b in float64 from the bfloat16 values, and the bound on that result rounded
// to bfloat16 from a float32 evaluation: the float32 bound f of Problem, then one rounding to
// bfloat16, at most u16 (|want| + f).
struct Reference {
  std::vector<double> want, bound;
};
Reference reference_mm(const Tensor& a, const Tensor& b, double alpha = 1, double beta = 0,
                       const Tensor& c = Tensor()) {
  const Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64);
  Reference r{kernels::mm(a64, b64).to_vector<double>(),
              kernels::mm(a64.abs(), b64.abs()).to_vector<double>()};
  const std::vector<double> cv =
      c.defined() ? c.to_vector<double>() : std::vector<double>(r.want.size());
  const double roundings = static_cast<double>(a.size(1)) + 2;
  for (size_t i = 0; i < r.want.size(); ++i) {
    r.want[i] = alpha * r.want[i] + beta * cv[i];
    const double f = roundings * kU32 * (std::fabs(alpha) * r.bound[i] + std::fabs(beta * cv[i]));
    r.bound[i] = f + kU16 * (std::fabs(r.want[i]) + f);
  }
  return r;
}

// mm (each operand also as a transposed view), addmm and bmm of bfloat16 through the kernel of
// `isa`, within the bound of a float32 evaluation rounded once.
void mm_addmm_and_bmm_use_the_kernel(CpuIsa isa) {
  Scope scope(isa, 2);
  const cpu::Bf16DotPolicy policy = cpu::set_bf16_dot_policy(cpu::Bf16DotPolicy::kOn);
  EXPECT_TRUE(cpu::multiplies_16bit(kBFloat16));
  EXPECT_FALSE(cpu::multiplies_16bit(kFloat16));
  manual_seed(3);
  const Tensor a = randn({77, 301}).to(kBFloat16), b = randn({301, 45}).to(kBFloat16);
  // mm, with each operand also as a transposed view.
  const Reference r = reference_mm(a, b);
  for (const Tensor& out : {kernels::mm(a, b), kernels::mm(a.t().contiguous().t(), b),
                            kernels::mm(a, b.t().contiguous().t())}) {
    EXPECT_EQ(out.dtype(), kBFloat16);
    EXPECT_TRUE(within_bound(out, r.want, r.bound, 1.0));
  }
  // The widened path is within the same bound of float64: the two within twice of each other.
  Tensor widened;
  {
    Scope capped(CpuIsa::kAvx512, 2);
    widened = kernels::mm(a, b);
  }
  EXPECT_TRUE(within_bound(kernels::mm(a, b), widened.to_vector<double>(), r.bound, 2.0));
  // addmm: beta c + alpha a b, c added in float32 before the one rounding.
  const Tensor c = randn({77, 45}).to(kBFloat16);
  const Reference rc = reference_mm(a, b, -2.0, 0.5, c);
  EXPECT_TRUE(within_bound(kernels::addmm(c, a, b, 0.5, -2.0), rc.want, rc.bound, 1.0));
  // bmm: small matrices (one thread each) and large ones (threads inside each product).
  for (const Shape3 s : {Shape3{9, 20, 33}, Shape3{70, 80, 99}}) {
    const int64_t batch = 3;
    const Tensor x = randn({batch, s.m, s.k}).to(kBFloat16);
    const Tensor y = randn({batch, s.k, s.n}).to(kBFloat16);
    const Tensor out = kernels::bmm(x, y);
    EXPECT_EQ(out.dtype(), kBFloat16);
    for (int64_t i = 0; i < batch; ++i) {
      const Reference ri = reference_mm(x.select(0, i), y.select(0, i));
      EXPECT_TRUE(within_bound(out.select(0, i), ri.want, ri.bound, 1.0))
          << "bmm " << s.m << "x" << s.n << "x" << s.k << ", matrix " << i;
    }
  }
  cpu::set_bf16_dot_policy(policy);
}

TEST(Bf16Gemm, MmAddmmAndBmmOfBfloat16TensorsUseTheKernel) {
  SKIP_WITHOUT_BF16();
  for (const CpuIsa isa : kernel_isas()) {
    SCOPED_TRACE(to_string(isa));
    mm_addmm_and_bmm_use_the_kernel(isa);
  }
}

// Note [When bf16 dot products pay]: by default the kernel is used where its measured peak is
// at least 1.25 times float32's; on and off override the measurement.
// Each kernel has its own measured speed-up: AMX's is its tile peak's.
TEST(Bf16Gemm, TheKernelIsUsedWhereItIsMeasuredFasterUnlessForced) {
  SKIP_WITHOUT_BF16();
  std::vector<double> speedups;
  for (const CpuIsa isa : kernel_isas()) {
    Scope scope(isa, 1);
    const double speedup = cpu::bf16_dot_speedup();
    speedups.push_back(speedup);
    EXPECT_GT(speedup, 0) << to_string(isa);
    EXPECT_EQ(cpu::bf16_dot_speedup(), speedup) << "measured once";
    const cpu::Bf16DotPolicy policy = cpu::set_bf16_dot_policy(cpu::Bf16DotPolicy::kAuto);
    EXPECT_EQ(cpu::multiplies_16bit(kBFloat16), speedup >= 1.25)
        << to_string(isa) << ": speedup " << speedup;
    cpu::set_bf16_dot_policy(cpu::Bf16DotPolicy::kOff);
    EXPECT_FALSE(cpu::multiplies_16bit(kBFloat16));
    cpu::set_bf16_dot_policy(cpu::Bf16DotPolicy::kOn);
    EXPECT_TRUE(cpu::multiplies_16bit(kBFloat16));
    cpu::set_bf16_dot_policy(policy);
  }
  if (speedups.size() == 2) {
    EXPECT_NE(speedups[0], speedups[1]) << "one measurement per kernel";
  }
  const cpu::Bf16DotPolicy policy = cpu::bf16_dot_policy();
  {
    Scope capped(CpuIsa::kAvx512, 1);  // forced on, but the CPU path in use has no kernel
    cpu::set_bf16_dot_policy(cpu::Bf16DotPolicy::kOn);
    EXPECT_FALSE(cpu::multiplies_16bit(kBFloat16));
    cpu::set_bf16_dot_policy(policy);
  }
}

// The widened path, on every CPU: gemm_bf16 below avx512_bf16 is the float32 GEMM of the
// widened operands, and mm, addmm and bmm give the bits they gave before the kernel existed.
TEST(Bf16Gemm, BelowAvx512Bf16ItIsTheWidenedProductBitForBit) {
  for (const CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa > detected_cpu_isa()) continue;
    for (const int threads : {1, 2}) {
      Scope scope(isa, threads);
      EXPECT_FALSE(cpu::bf16_dot_products()) << to_string(isa);
      EXPECT_FALSE(cpu::multiplies_16bit(kBFloat16)) << to_string(isa);
      for (const Shape3& s : {Shape3{13, 33, 3}, Shape3{145, 70, 385}})
        for (const bool ta : {false, true}) {
          const Problem p(ta, !ta, s.m, s.n, s.k, 1.0f, 0.5f);
          EXPECT_TRUE(same_bits(p.run(), p.widened())) << to_string(isa) << ": " << p.name();
        }
      manual_seed(5);
      const Tensor a = randn({40, 300}).to(kBFloat16), b = randn({300, 50}).to(kBFloat16);
      const Tensor c = randn({40, 50}).to(kBFloat16);
      const Tensor a32 = a.to(kFloat32), b32 = b.to(kFloat32);
      EXPECT_TRUE(same_bits(kernels::mm(a, b), kernels::mm(a32, b32).to(kBFloat16)))
          << to_string(isa);
      EXPECT_TRUE(same_bits(kernels::addmm(c, a, b, 0.5, 2.0),
                            kernels::addmm(c.to(kFloat32), a32, b32, 0.5, 2.0).to(kBFloat16)))
          << to_string(isa);
      const Tensor x = randn({4, 20, 30}).to(kBFloat16), y = randn({4, 30, 10}).to(kBFloat16);
      EXPECT_TRUE(
          same_bits(kernels::bmm(x, y), kernels::bmm(x.to(kFloat32), y.to(kFloat32)).to(kBFloat16)))
          << to_string(isa);
    }
  }
}

TEST(Bf16Gemm, BadOperandsNameTheOpAndTheShapes) {
  const Tensor a = zeros({2, 3}).to(kBFloat16), b = zeros({4, 5}).to(kBFloat16);
  EXPECT_LOOM_ERROR(kernels::mm(a, b), ShapeError, {"mm", "[2, 3]", "[4, 5]"});
  EXPECT_LOOM_ERROR(kernels::mm(a, zeros({3, 5})), DTypeError, {"mm", "bfloat16", "float32"});
  EXPECT_LOOM_ERROR(kernels::bmm(zeros({2, 2, 3}).to(kBFloat16), zeros({3, 3, 4}).to(kBFloat16)),
                    ShapeError, {"bmm", "[2, 2, 3]", "[3, 3, 4]"});
}

TEST(Bf16Gemm, TheDotProductPeakIsMeasuredWhereTheCpuHasIt) {
  const double peak = bf16_dot_peak_gflops(1), amx = amx_bf16_peak_gflops(1);
  std::printf(
      "[ measured ] 1 thread: bf16 dot products %.1f GFLOP/s, AMX tiles %.1f, 512-bit FMA %.1f\n",
      peak, amx, fma_peak_gflops(1, 512));
  EXPECT_EQ(peak > 0, detected_cpu_isa() >= CpuIsa::kAvx512Bf16);
  EXPECT_EQ(amx > 0, detected_cpu_isa() >= CpuIsa::kAmxBf16);
}

}  // namespace
}  // namespace loom

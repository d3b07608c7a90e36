// tests/tensor/vec_math_test.cpp — the branch-free float32 exp, sigmoid and tanh GELU of
// tensor/cpu/vec_math.h against long double references, on every float in their working range
// stepped a few thousand ulps at a time, and at their edges (0, subnormal results, infinities,
// NaN). Errors are in ulps of the float32 result.

#include "tensor/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace loom::cpu {
namespace {

// |got - want| in units of the last place of want as a float (the spacing at |want|).
double ulps(float got, long double want) {
  const auto w = static_cast<float>(want);
  const float spacing =
      std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity()) - std::fabs(w);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / spacing);
}

// The floats in their numeric order as integers: -0 and +0 both at 0, negative floats below.
int64_t order(float x) {
  const int32_t bits = std::bit_cast<int32_t>(x);
  return bits < 0 ? -int64_t{bits & 0x7fffffff} : int64_t{bits};
}
float from_order(int64_t o) {
  return o < 0 ? -std::bit_cast<float>(static_cast<int32_t>(-o))
               : std::bit_cast<float>(static_cast<int32_t>(o));
}

// Calls f on floats from lo to hi, one every `step` representable values, and on hi.
template <typename F>
void sweep(float lo, float hi, int64_t step, F f) {
  for (int64_t o = order(lo); o < order(hi); o += step) f(from_order(o));
  f(hi);
}

long double sigmoid_ref(long double x) { return 1.0L / (1.0L + std::exp(-x)); }
// The references are in the sigmoid form too: in the tanh form even long double loses 1 +
// tanh(u) to cancellation where u is very negative.
constexpr long double kScale = 0.79788456080286535588L, kCubic = 0.044715L;
long double gelu_z(long double x) { return 2.0L * kScale * (x + kCubic * x * x * x); }
long double gelu_ref(long double x) { return x * sigmoid_ref(gelu_z(x)); }
long double gelu_grad_ref(long double x) {
  const long double s = sigmoid_ref(gelu_z(x));
  return s + 2.0L * x * s * (1.0L - s) * kScale * (1.0L + 3.0L * kCubic * x * x);
}

TEST(VecMath, ExpNonpositiveIsWithinTwoUlps) {
  double worst = 0;
  sweep(-87.0f, 0.0f, 97, [&](float x) {
    worst = std::max(worst, ulps(exp_nonpositive(x), std::exp(static_cast<long double>(x))));
  });
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-88.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
}

TEST(VecMath, SigmoidIsWithinFourUlpsEverywhere) {
  double worst = 0;
  sweep(-80.0f, 80.0f, 997,
        [&](float x) { worst = std::max(worst, ulps(sigmoid_float(x), sigmoid_ref(x))); });
  EXPECT_LE(worst, 4.0);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sigmoid_float(inf), 1.0f);
  EXPECT_EQ(sigmoid_float(-inf), 0.0f);
  EXPECT_EQ(sigmoid_float(0.0f), 0.5f);
  EXPECT_TRUE(std::isnan(sigmoid_float(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMath, GeluTanhIsAsCloseAsItsFloatArgumentAllows) {
  // x s(z) with z = 2 sqrt(2/pi) (x + 0.044715 x^3) formed in float32: z carries a relative error
  // of a few 2^-24, which exp turns into a relative error of about |z| times that in the result
  // (any float32 GELU has it). So the bound is a few ulps plus that.
  constexpr double kEps = 0x1p-24;
  sweep(-12.0f, 12.0f, 499, [&](float x) {
    const long double want = gelu_ref(x);
    // Where z is below -87 (exp_nonpositive's 0) or x is subnormal, the result is below 1e-36
    // in magnitude, and is only held to that.
    if (gelu_z(x) < -87 || std::fabs(x) < std::numeric_limits<float>::min()) {
      EXPECT_LE(std::fabs(gelu_tanh_float(x)), 1e-36f) << x;
      return;
    }
    const double relative = static_cast<double>(std::fabs((gelu_tanh_float(x) - want) / want));
    const double bound = 8 * kEps + 4 * kEps * static_cast<double>(std::fabs(gelu_z(x)));
    EXPECT_LE(relative, bound) << x;
  });
  EXPECT_EQ(gelu_tanh_float(-30.0f), 0.0f);
  EXPECT_EQ(gelu_tanh_float(0.0f), 0.0f);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(gelu_tanh_float(inf), inf);
  // -inf times sigmoid(-inf) = 0: NaN, as 0.5 x (1 + tanh(u)) gives in PyTorch.
  EXPECT_TRUE(std::isnan(gelu_tanh_float(-inf)));
  EXPECT_TRUE(std::isnan(gelu_tanh_float(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMath, GeluTanhBackwardIsWithinThreeUlpsOfOne) {
  // The derivative lies in [-0.17, 1.13] and crosses 0 near x = -0.75, so the bound is absolute:
  // 3e-7, 2.5 ulps of 1 (the tanh form in float32 with glibc's tanhf reaches 5.6e-7).
  sweep(-12.0f, 12.0f, 499, [&](float x) {
    const long double error =
        std::fabs(static_cast<long double>(gelu_tanh_backward_float(1.0f, x)) - gelu_grad_ref(x));
    EXPECT_LE(error, 3e-7L) << x;
  });
  EXPECT_EQ(gelu_tanh_backward_float(2.0f, 0.0f), 1.0f);  // the slope at 0 is 1/2
  EXPECT_EQ(gelu_tanh_backward_float(1.0f, 40.0f), 1.0f);
  EXPECT_EQ(gelu_tanh_backward_float(1.0f, -40.0f), 0.0f);
}

}  // namespace
}  // namespace loom::cpu

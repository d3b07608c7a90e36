// The device's 16-bit conversions (tensor/cuda/float16.h) are plain integer code, host and
// device: checked here on the CPU against loom::Half and loom::BFloat16, so that a GPU's
// conversions give the CPU's bits without a GPU to run them on.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/cuda/float16.h"
#include "tensor/dtype.h"

namespace loom::cuda {
namespace {

uint32_t bits(float f) { return float_to_bits(f); }

TEST(Float16Bits, EveryHalfWidensToTheHostsFloat) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    Half host;
    host.bits = static_cast<uint16_t>(h);
    const float expected = static_cast<float>(host);
    const float got = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(bits(got), bits(expected)) << "half bits 0x" << std::hex << h;
    }
  }
}

TEST(Float16Bits, EveryBFloat16WidensToTheHostsFloat) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    BFloat16 host;
    host.bits = static_cast<uint16_t>(b);
    ASSERT_EQ(bits(bfloat16_to_float(static_cast<uint16_t>(b))), bits(static_cast<float>(host)))
        << std::hex << b;
  }
}

// Floats narrow as the host constructors round: a sweep over the whole bit range (a prime
// stride reaches every exponent and many mantissas), and every value at and next to the
// halfway points of the normal and subnormal ranges, where ties to even decide.
TEST(Float16Bits, FloatsNarrowToTheHostsBits) {
  int64_t checked = 0;
  const auto check = [&](uint32_t u) {
    const float f = bits_to_float(u);
    ASSERT_EQ(float_to_half(f), Half(f).bits) << "float bits 0x" << std::hex << u;
    ASSERT_EQ(float_to_bfloat16(f), BFloat16(f).bits) << "float bits 0x" << std::hex << u;
    ++checked;
  };
  for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) check(static_cast<uint32_t>(u));
  for (uint32_t h = 0; h < 0x7c00u; ++h) {  // every finite positive half and its neighbours
    const uint32_t at = bits(half_to_float(static_cast<uint16_t>(h)));
    const uint32_t halfway = at + (h < 0x400u ? 0u : 0x1000u);  // normal: half an ulp above
    for (uint32_t u : {at, at + 1, halfway - 1, halfway, halfway + 1}) {
      check(u);
      check(u | 0x80000000u);
    }
  }
  for (uint32_t e = 100; e < 114; ++e)  // the subnormal halfway points: 2^-25 .. 2^-14
    for (uint32_t m : {0u, 1u, 0x3fffffu, 0x400000u, 0x400001u, 0x7fffffu}) check(e << 23 | m);
  check(bits(std::numeric_limits<float>::infinity()));
  check(bits(65504.0f));
  check(bits(65520.0f));  // rounds up to infinity in float16
  EXPECT_GT(checked, 100000);
}

TEST(Float16Bits, NaNStaysNaNAndInfinityStaysInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(nan))));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(nan))));
  EXPECT_EQ(half_to_float(float_to_half(-inf)), -inf);
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(inf)), inf);
  EXPECT_EQ(half_to_float(float_to_half(1e6f)), inf);  // beyond 65504: overflows
}

TEST(Float16Bits, MathTypesWidenAndRoundBack) {
  static_assert(std::is_same_v<math_t<Half>, float>);
  static_assert(std::is_same_v<math_t<BFloat16>, float>);
  static_assert(std::is_same_v<math_t<double>, double>);
  static_assert(std::is_same_v<math_t<int32_t>, int32_t>);
  // 1 + 2^-11 is halfway between two halves: ties to even rounds it down to 1.
  EXPECT_EQ(to_math(from_math<Half>(1.0f + 0x1p-11f)), 1.0f);
  EXPECT_EQ(to_math(from_math<Half>(1.0f + 0x1p-10f)), 1.0f + 0x1p-10f);
  EXPECT_EQ(to_math(from_math<BFloat16>(3.0)), 3.0f);
  EXPECT_EQ(from_math<int64_t>(7.0), 7);
}

}  // namespace
}  // namespace loom::cuda

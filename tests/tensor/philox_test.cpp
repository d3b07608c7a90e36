// tests/tensor/philox_test.cpp — the host/device Philox of tensor/philox.h against the CPU's
// loom::philox4x32 and the uniform maps of tensor/random.h, bit for bit, and its Box-Muller and
// integer maps against what rand/randn/randint draw after manual_seed. Plain C++: runs anywhere.

#include "tensor/philox.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "loom.h"
#include "tensor/index.h"
#include "tensor/random.h"
#include "test_util.h"

namespace loom {
namespace {

// A few hand-picked 64-bit values (words that carry into the high half, all ones, ...) and a
// stream of pseudo-random ones.
std::vector<uint64_t> sample_values() {
  std::vector<uint64_t> v = {0,
                             1,
                             2,
                             3,
                             0xffffffffull,
                             0x100000000ull,
                             0x123456789abcdef0ull,
                             0x8000000000000000ull,
                             ~0ull,
                             ~0ull - 1,
                             67280421310721ull};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 40; ++i) {  // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    v.push_back(z ^ (z >> 31));
  }
  return v;
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

TEST(Philox, EqualsTheCpuGenerator) {
  const std::vector<uint64_t> values = sample_values();
  const std::vector<uint64_t> subsequences = {0, 1, values[6], values[20], ~uint64_t{0}};
  int64_t checked = 0;
  for (uint64_t seed : values)
    for (uint64_t counter : values)
      for (uint64_t subsequence : subsequences) {
        const std::array<uint32_t, 4> expected = philox4x32(seed, counter, subsequence);
        const philox::Lanes got = philox::philox4x32(seed, counter, subsequence);
        for (int k = 0; k < 4; ++k)
          ASSERT_EQ(got[k], expected[k]) << "seed=" << seed << " counter=" << counter
                                         << " subsequence=" << subsequence << " lane " << k;
        ++checked;
      }
  EXPECT_EQ(checked, 51 * 51 * 5);
}

TEST(Philox, KnownAnswers) {
  // Random123's Philox4x32-10 vectors: counter words (lo, hi, sub lo, sub hi), key (lo, hi).
  const philox::Lanes zero = philox::philox4x32(0, 0, 0);
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
  const philox::Lanes pi =
      philox::philox4x32(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull);
  EXPECT_EQ(pi[0], 0xd16cfe09u);
  EXPECT_EQ(pi[1], 0x94fdccebu);
  EXPECT_EQ(pi[2], 0x5001e420u);
  EXPECT_EQ(pi[3], 0x24126ea1u);
}

TEST(Philox, UniformMapsEqualTheCpuOnes) {
  std::vector<uint32_t> bits = {0u,          1u,          255u,        256u,
                                0x7fffffffu, 0x80000000u, 0xffffff00u, 0xffffffffu};
  for (uint64_t v : sample_values()) {
    bits.push_back(static_cast<uint32_t>(v));
    bits.push_back(static_cast<uint32_t>(v >> 32));
  }
  for (uint32_t b : bits) {
    ASSERT_EQ(float_bits(philox::uniform_float(b)), float_bits(uniform_float(b))) << b;
    EXPECT_GE(philox::uniform_float(b), 0.0f);
    EXPECT_LT(philox::uniform_float(b), 1.0f);
    for (uint32_t lo : bits) {
      ASSERT_EQ(double_bits(philox::uniform_double(b, lo)), double_bits(uniform_double(b, lo)))
          << b << " " << lo;
      EXPECT_LT(philox::uniform_double(b, lo), 1.0);
    }
  }
}

// rand, randn and randint after manual_seed: element i from the documented lanes of counter
// 0 + i/4 (uniform) or 0 + i/2 (normal, integer), through the header's maps.
TEST(Philox, FactoriesDrawWhatTheHeaderComputes) {
  const uint64_t seed = 1234567;
  const int64_t n = 4099;  // not a multiple of 4: the last counter is partly used
  manual_seed(seed);
  const std::vector<float> u = rand({n}, kFloat32).to_vector<float>();
  manual_seed(seed);
  const std::vector<double> u64 = rand({n}, kFloat64).to_vector<double>();
  manual_seed(seed);
  const std::vector<double> z = randn({n}, kFloat64).to_vector<double>();
  manual_seed(seed);
  const std::vector<float> z32 = randn({n}, kFloat32).to_vector<float>();
  manual_seed(seed);
  const std::vector<int64_t> k = randint(-5, 1000003, {n}, kInt64).to_vector<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const philox::Lanes r4 = philox::philox4x32(seed, static_cast<uint64_t>(i / 4));
    ASSERT_EQ(float_bits(u[i]), float_bits(philox::uniform_float(r4[i % 4]))) << i;
    ASSERT_EQ(double_bits(u64[i]),
              double_bits(static_cast<double>(philox::uniform_float(r4[i % 4]))))
        << i;
    const philox::Lanes r2 = philox::philox4x32(seed, static_cast<uint64_t>(i / 2));
    const int lane = static_cast<int>(i % 2) * 2;
    const double normal = philox::box_muller(r2[lane], r2[lane + 1]);
    ASSERT_EQ(double_bits(z[i]), double_bits(normal)) << i;
    ASSERT_EQ(float_bits(z32[i]), float_bits(static_cast<float>(normal))) << i;
    ASSERT_EQ(k[i], philox::uniform_int(r2[lane], r2[lane + 1], -5, 1000008)) << i;
  }
}

TEST(Philox, DropoutMaskIsTheUniformMapAgainstP) {
  // Note [Dropout mask]: element i kept when uniform_float(lane i%4 of counter first + i/4) >= p.
  const uint64_t seed = 99, first = 17;
  const double p = 0.3;
  const int64_t n = 1001;
  const Tensor x = ones({n}, kFloat64);
  const std::vector<double> y = kernels::dropout_masked(x, p, seed, first).to_vector<double>();
  for (int64_t i = 0; i < n; ++i) {
    const philox::Lanes r = philox::philox4x32(seed, first + static_cast<uint64_t>(i / 4));
    const bool keep = static_cast<double>(philox::uniform_float(r[i % 4])) >= p;
    ASSERT_EQ(y[i], keep ? 1.0 / (1.0 - p) : 0.0) << i;
  }
}

}  // namespace
}  // namespace loom

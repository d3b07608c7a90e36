// tests/cuda/random_cuda_test.cpp — the CUDA random fills (tensor/cuda/random.h) against the CPU
// factories for the same (seed, counter): rand and randint bit for bit, randn to the last bits
// of the two math libraries (philox::box_muller), plus ranges and argument errors. Every test
// skips without a GPU.

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/cuda/random.h"
#include "tensor/philox.h"
#include "tensor/view.h"

namespace loom::test {
namespace {

::testing::AssertionResult same_bits(const Tensor& on_cuda, const Tensor& on_cpu) {
  const Tensor a = on_cuda.to(kCPU).contiguous(), b = on_cpu.contiguous();
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << "shape or dtype differs";
  const size_t item = a.itemsize();
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(static_cast<const char*>(a.data()) + i * item,
                    static_cast<const char*>(b.data()) + i * item, item) != 0)
      return ::testing::AssertionFailure() << "element " << i << " differs";
  return ::testing::AssertionSuccess();
}

const int64_t kSizes[] = {1, 7, 1000003};

TEST(CudaRandom, UniformEqualsRandBitForBit) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64})
    for (int64_t n : kSizes) {
      manual_seed(2024);
      rand({5}, dtype);  // moves the offset to counter 2
      const Tensor expected = rand({n}, dtype);
      const Tensor t = empty({n}, dtype, kCuda0);
      cuda::fill_uniform_(t, 2024, 2, 0.0, 1.0);
      EXPECT_TRUE(same_bits(t, expected)) << dtype << " n=" << n;
    }
  // A contiguous target whose data is not 16-byte aligned takes the scalar stores.
  manual_seed(5);
  const Tensor expected = rand({1001});
  const Tensor base = empty({1002}, kFloat32, kCuda0);
  const Tensor shifted = kernels::slice(base, 0, 1, 1002);
  cuda::fill_uniform_(shifted, 5, 0, 0.0, 1.0);
  EXPECT_TRUE(same_bits(shifted, expected));
}

TEST(CudaRandom, UniformWithBounds) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor t = empty({4099}, kFloat64, kCuda0);
  cuda::fill_uniform_(t, 77, 10, -3.0, 5.0);
  const std::vector<double> got = t.to(kCPU).to_vector<double>();
  for (int64_t i = 0; i < 4099; ++i) {
    const philox::Lanes r = philox::philox4x32(77, 10 + static_cast<uint64_t>(i / 4));
    const double expected = -3.0 + 8.0 * static_cast<double>(philox::uniform_float(r[i % 4]));
    ASSERT_EQ(got[i], expected) << i;
    ASSERT_GE(got[i], -3.0);
    ASSERT_LT(got[i], 5.0);
  }
}

TEST(CudaRandom, NormalEqualsRandn) {
  LOOM_SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    manual_seed(31);
    const Tensor expected64 = randn({n}, kFloat64);
    const Tensor expected32 = randn({n}, kFloat32);  // counters (n + 1) / 2 on
    const Tensor t64 = empty({n}, kFloat64, kCuda0), t32 = empty({n}, kFloat32, kCuda0);
    cuda::fill_normal_(t64, 31, 0, 0.0, 1.0);
    cuda::fill_normal_(t32, 31, static_cast<uint64_t>((n + 1) / 2), 0.0, 1.0);
    // log and cos of CUDA and glibc may differ in the last bits (see philox::box_muller).
    EXPECT_TRUE(cuda_matches_cpu(t64, expected64, 1e-14, 1e-14)) << "n=" << n;
    EXPECT_TRUE(cuda_matches_cpu(t32, expected32, 1e-6, 1e-7)) << "n=" << n;
  }
  // mean + std * z.
  manual_seed(8);
  const Tensor z = randn({999}, kFloat64);
  const Tensor t = empty({999}, kFloat64, kCuda0);
  cuda::fill_normal_(t, 8, 0, 2.0, 0.5);
  EXPECT_TRUE(cuda_matches_cpu(t, z * 0.5 + 2.0, 1e-14, 1e-14));
}

TEST(CudaRandom, RandintEqualsCpuBitForBit) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kInt64, kInt32, kFloat32, kFloat64, kUInt8})
    for (int64_t n : kSizes) {
      const int64_t low = dtype == kUInt8 ? 0 : -17, high = dtype == kUInt8 ? 250 : 1000003;
      manual_seed(9);
      const Tensor expected = randint(low, high, {n}, dtype);
      const Tensor t = empty({n}, dtype, kCuda0);
      cuda::fill_randint_(t, 9, 0, low, high);
      EXPECT_TRUE(same_bits(t, expected)) << dtype << " n=" << n;
    }
}

TEST(CudaRandom, BadArgumentsRaise) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor t = empty({4, 3}, kFloat32, kCuda0);
  EXPECT_LOOM_ERROR(cuda::fill_uniform_(kernels::transpose(t, 0, 1), 1, 0, 0.0, 1.0), ValueError,
                    {"rand", "contiguous", "[3, 4]"});
  EXPECT_LOOM_ERROR(cuda::fill_randint_(t, 1, 0, 5, 5), ValueError, {"randint", "low=5"});
  EXPECT_LOOM_ERROR(cuda::fill_normal_(empty({2}, kInt64, kCuda0), 1, 0, 0.0, 1.0), DTypeError,
                    {"randn"});
  EXPECT_LOOM_ERROR(cuda::fill_uniform_(empty({2}), 1, 0, 0.0, 1.0), DeviceError, {"rand"});
}

}  // namespace
}  // namespace loom::test

// tests/cuda/copy_cuda_test.cpp — copies and fills on one CUDA device against the CPU: every
// dtype pair (float16/bfloat16 rounding bit for bit, edge values included), transposed, sliced
// and expanded sources, strided destinations, more dims than one launch holds, fills of strided
// views, version bumps, the shape error, and channels-last tensors across devices and into
// safetensors. Every test skips without a GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "scratch_dir.h"
#include "tensor/copy.h"
#include "tensor/safetensors.h"
#include "tensor/view.h"

using namespace loom;
using loom::test::cuda_matches_cpu;
using loom::test::kCuda0;
namespace k = loom::kernels;

namespace {

const std::vector<DType> kAllDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                       kInt64,   kInt32,   kUInt8,   kBool};

bool is_signed_dtype(DType dt) { return dt != kUInt8 && dt != kBool; }

// The CUDA result equals the CPU's exactly: same dtype and shape, every value the same
// (infinities and the sign of zero included; NaN matches NaN).
::testing::AssertionResult same_as_cpu(const Tensor& on_cuda, const Tensor& on_cpu) {
  if (!on_cuda.is_cuda() || on_cuda.dtype() != on_cpu.dtype() || on_cuda.sizes() != on_cpu.sizes())
    return cuda_matches_cpu(on_cuda, on_cpu, 0, 0);  // it says what differs
  const std::vector<double> a = on_cuda.to(kCPU).to_vector<double>(),
                            e = on_cpu.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = (std::isnan(a[i]) && std::isnan(e[i])) ||
                      (a[i] == e[i] && std::signbit(a[i]) == std::signbit(e[i]));
    if (!same)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << e[i];
  }
  return ::testing::AssertionSuccess();
}

// src (a CPU tensor) converted to dst_dtype on the GPU and on the CPU: exactly equal.
void expect_converts_like_cpu(const Tensor& src, DType dst_dtype) {
  EXPECT_TRUE(same_as_cpu(src.to(kCuda0).to(dst_dtype), src.to(dst_dtype)))
      << src.dtype() << " -> " << dst_dtype;
}

using View = std::function<Tensor(const Tensor&)>;

}  // namespace

TEST(CudaCopy, EveryDtypePairConvertsLikeTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  // In range for every dtype, fractions and zeros included.
  const Tensor values =
      tensor<double>({0, 0.5, 1, 3.75, 100.25, 127, 2, 64.5, 0.999, 1e-3, 0, 42}, {3, 4});
  const Tensor negatives = tensor<double>({-0.5, -1, -3.75, -100.25, -127, 7}, {2, 3});
  for (DType from : kAllDTypes) {
    const Tensor src = values.to(from);
    for (DType to : kAllDTypes) {
      expect_converts_like_cpu(src, to);
      if (is_signed_dtype(from) && to != kUInt8) expect_converts_like_cpu(negatives.to(from), to);
    }
  }
  // int64 beyond 2^53 converts between integer types without going through double.
  const Tensor wide = tensor<int64_t>({(int64_t{1} << 53) + 1, -(int64_t{1} << 60) - 3, 1 << 20});
  expect_converts_like_cpu(wide, kInt64);
  expect_converts_like_cpu(wide, kInt32);
  expect_converts_like_cpu(wide, kFloat64);
  expect_converts_like_cpu(wide, kFloat32);
  // Random values through every float type, both ways.
  manual_seed(1);
  const Tensor random = randn({100003}, kFloat64) * 100.0;
  for (DType to : {kFloat32, kFloat16, kBFloat16, kInt32, kInt64, kBool})
    expect_converts_like_cpu(random, to);
  for (DType from : {kFloat32, kFloat16, kBFloat16}) {
    const Tensor src = random.to(from);
    for (DType to : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt32})
      expect_converts_like_cpu(src, to);
  }
}

TEST(CudaCopy, SixteenBitFloatsRoundToNearestEvenLikeTheCpu) {
  LOOM_SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> edges = {
      0.0,
      -0.0,
      1.0,
      -1.0,
      1.0 + std::ldexp(1.0, -11),      // half: a tie, to even (1)
      1.0 + 3 * std::ldexp(1.0, -11),  // half: a tie, to even (up)
      1.0 + std::ldexp(1.0, -8),       // bfloat16: a tie, to even (1)
      1.0 + 3 * std::ldexp(1.0, -8),   // bfloat16: a tie, to even (up)
      65504.0,
      65519.0,
      65519.99,
      65520.0,
      -65520.0,
      1e5,  // the half's largest and overflow
      std::ldexp(1.0, -14),
      std::ldexp(1.0, -14) - std::ldexp(1.0, -25),  // smallest normal half
      std::ldexp(1.0, -24),
      std::ldexp(1.0, -25),
      3 * std::ldexp(1.0, -25),  // subnormal ties
      std::ldexp(1.0, -26),
      1e-8,
      -6e-8,
      5.9e-8,
      6.1e-5,
      1e-45,
      1e-40,
      3.4e38,
      -3.4e38,
      1e300,
      inf,
      -inf,
      nan,
      0.1,
      1.0 / 3,
      2.0 / 3,
      1234.5678,
      -0.000123};
  const Tensor f64 = tensor<double>(edges);
  for (DType from : {kFloat64, kFloat32}) {
    const Tensor src = f64.to(from);
    for (DType to : {kFloat16, kBFloat16}) {
      expect_converts_like_cpu(src, to);
      expect_converts_like_cpu(src.to(to), kFloat32);
      expect_converts_like_cpu(src.to(to), kFloat64);
      expect_converts_like_cpu(src.to(to), kBool);
    }
  }
  expect_converts_like_cpu(f64.to(kFloat16), kBFloat16);
  expect_converts_like_cpu(f64.to(kBFloat16), kFloat16);
  // Every half bit pattern (as float32 on the CPU) back to half, and to bfloat16.
  std::vector<float> all_halves;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    Half h;
    h.bits = static_cast<uint16_t>(bits);
    all_halves.push_back(static_cast<float>(h));
  }
  const Tensor halves = tensor<float>(all_halves);
  expect_converts_like_cpu(halves, kFloat16);
  expect_converts_like_cpu(halves, kBFloat16);
  expect_converts_like_cpu(halves.to(kFloat16), kFloat32);
  // Float32 values between the halves: every rounding case, many times over.
  manual_seed(2);
  expect_converts_like_cpu(randn({200000}) * 1000.0, kFloat16);
  expect_converts_like_cpu(randn({200000}) * 1e-5, kFloat16);
  expect_converts_like_cpu(randn({200000}) * 1e30, kBFloat16);
}

TEST(CudaCopy, StridedAndBroadcastSources) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(3);
  struct Case {
    std::string name;
    Shape src_shape, dst_shape;
    View src_view;
  };
  const std::vector<Case> cases = {
      {"transposed", {9, 6}, {6, 9}, [](const Tensor& t) { return t.t(); }},
      {"stepped slice", {8, 19}, {8, 5}, [](const Tensor& t) { return t.slice(1, 1, 10, 2); }},
      {"column", {7, 5}, {7}, [](const Tensor& t) { return t.select(1, 2); }},
      {"expanded row",
       {1, 11},
       {4, 11},
       [](const Tensor& t) {
         return t.expand({4, 11});
       }},
      {"broadcast by copy_", {11}, {3, 4, 11}, [](const Tensor& t) { return t; }},
      {"0-d", {}, {5, 3}, [](const Tensor& t) { return t; }},
      {"misaligned", {1001}, {1000}, [](const Tensor& t) { return t.slice(0, 1, 1001); }},
      {"odd large", {100003}, {100003}, [](const Tensor& t) { return t; }},
      {"permuted 3-d",
       {3, 4, 5},
       {5, 3, 4},
       [](const Tensor& t) {
         return t.permute({2, 0, 1});
       }},
  };
  for (const Case& c : cases) {
    for (DType from : {kFloat32, kFloat64, kInt32}) {
      for (DType to : {from, kFloat32, kFloat16, kInt64}) {
        const Tensor src = (randn(c.src_shape, kFloat64) * 10.0).to(from);
        Tensor dst_cpu = zeros(c.dst_shape, to);
        Tensor dst_cuda = zeros(c.dst_shape, to, kCuda0);
        dst_cpu.copy_(c.src_view(src));
        dst_cuda.copy_(c.src_view(src.to(kCuda0)));
        EXPECT_TRUE(same_as_cpu(dst_cuda, dst_cpu)) << c.name << ": " << from << " -> " << to;
      }
    }
  }
}

TEST(CudaCopy, StridedDestinations) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(4);
  const std::vector<std::pair<std::string, View>> views = {
      {"transposed", [](const Tensor& t) { return t.t(); }},
      {"column", [](const Tensor& t) { return t.select(1, 3); }},
      {"stepped slice", [](const Tensor& t) { return t.slice(1, 0, 8, 3); }},
      {"inner block", [](const Tensor& t) { return t.slice(0, 1, 5).slice(1, 2, 6); }},
  };
  for (const auto& [name, view] : views) {
    for (DType to : {kFloat32, kFloat16, kUInt8, kBool}) {
      const Tensor base = zeros({8, 8}, to);
      const Tensor base_cuda = base.to(kCuda0);
      const Tensor src = randint(0, 50, view(base).sizes(), kFloat64);
      const uint64_t version = base_cuda.version();
      k::copy_(view(base), src);
      k::copy_(view(base_cuda), src.to(kCuda0));
      EXPECT_GT(base_cuda.version(), version) << name;
      EXPECT_TRUE(same_as_cpu(base_cuda, base)) << name << ", " << to;
    }
  }
  // Transposed source into transposed destination, different dtypes.
  const Tensor src = randn({6, 7});
  const Tensor base = zeros({6, 7}, kFloat64), base_cuda = base.to(kCuda0);
  k::copy_(base.t(), src.t());
  k::copy_(base_cuda.t(), src.to(kCuda0).t());
  EXPECT_TRUE(same_as_cpu(base_cuda, base));
}

TEST(CudaCopy, MoreDimsThanOneLaunchHolds) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(5);
  // Ten dims of size 2 with reversed strides: nothing merges, the host loops over two dims.
  const Shape shape(10, 2);
  Shape reversed;
  for (int64_t d = 9; d >= 0; --d) reversed.push_back(d);
  const Tensor src = randn(shape);
  for (DType to : {kFloat32, kFloat64, kBFloat16}) {
    EXPECT_TRUE(same_as_cpu(k::contiguous(src.to(kCuda0).permute(reversed)).to(to),
                            k::contiguous(src.permute(reversed)).to(to)));
    const Tensor dst = zeros(shape, to), dst_cuda = dst.to(kCuda0);
    k::copy_(dst.permute(reversed), src);
    k::copy_(dst_cuda.permute(reversed), src.to(kCuda0));
    EXPECT_TRUE(same_as_cpu(dst_cuda, dst)) << to;
  }
}

TEST(CudaCopy, SameDtypeContiguousCopies) {
  LOOM_SKIP_WITHOUT_GPU();
  manual_seed(6);
  for (DType dt : kAllDTypes) {
    const Tensor x = (randn({100003}) * 50.0).abs().to(dt);  // in range for uint8 too
    const Tensor x_cuda = x.to(kCuda0);
    const Tensor copy = k::clone(x_cuda);
    EXPECT_NE(copy.data(), x_cuda.data());
    EXPECT_TRUE(same_as_cpu(copy, x)) << dt;
    Tensor dst = empty({100003}, dt, kCuda0);
    dst.copy_(x_cuda);
    EXPECT_TRUE(same_as_cpu(dst, x)) << dt;
  }
}

TEST(CudaCopy, FillOnStridedViewsOfEveryDtype) {
  LOOM_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<std::string, View>> views = {
      {"whole", [](const Tensor& t) { return t; }},
      {"stepped columns", [](const Tensor& t) { return t.slice(1, 1, 7, 2); }},
      {"transposed", [](const Tensor& t) { return t.t(); }},
      {"row", [](const Tensor& t) { return t.select(0, 2); }},
  };
  for (DType dt : kAllDTypes) {
    std::vector<double> fill_values = {3.5, 0.0, 1.0, 100.75};
    if (is_signed_dtype(dt)) fill_values.push_back(-2.25);
    if (dt == kFloat16 || dt == kBFloat16 || dt == kFloat32 || dt == kFloat64)
      for (double v : {1e-8, 70000.0, 1.0 / 3, std::numeric_limits<double>::infinity()})
        fill_values.push_back(v);
    for (const auto& [name, view] : views) {
      for (double v : fill_values) {
        const Tensor base = zeros({6, 8}, dt), base_cuda = zeros({6, 8}, dt, kCuda0);
        const uint64_t version = base_cuda.version();
        k::fill_(view(base), v);
        k::fill_(view(base_cuda), v);
        EXPECT_GT(base_cuda.version(), version);
        EXPECT_TRUE(same_as_cpu(base_cuda, base)) << name << ", " << dt << ", " << v;
      }
    }
  }
  // Large contiguous fill (the vector path with a tail), through the Tensor method.
  Tensor big = empty({1000003}, kFloat32, kCuda0);
  big.fill_(-1.25);
  EXPECT_TRUE(same_as_cpu(big, full({1000003}, -1.25)));
  big.zero_();
  EXPECT_TRUE(same_as_cpu(big, zeros({1000003})));
}

TEST(CudaCopy, ShapeErrorNamesBothShapes) {
  LOOM_SKIP_WITHOUT_GPU();
  Tensor dst = zeros({2, 3}, kFloat32, kCuda0);
  const Tensor src = zeros({4}, kFloat32, kCuda0);
  EXPECT_LOOM_ERROR(dst.copy_(src), ShapeError, {"copy_", "[4]", "[2, 3]"});
  EXPECT_LOOM_ERROR(k::copy_(dst, zeros({3, 2, 3}, kFloat64, kCuda0)), ShapeError,
                    {"copy_", "[3, 2, 3]", "[2, 3]"});
}

// Between the host and a GPU a channels-last tensor keeps its format (to(device), as PyTorch's),
// and copies into either format on either side land in the right places (Note [Copies between
// devices]).
TEST(CudaCopy, ChannelsLastCrossesDevicesInItsFormat) {
  LOOM_SKIP_WITHOUT_GPU();
  const MemoryFormat cl = MemoryFormat::kChannelsLast;
  const Tensor x = randn({3, 5, 4, 6});
  const Tensor x_cl = k::contiguous(x, cl);
  const Tensor up = x_cl.to(kCuda0);
  EXPECT_EQ(suggest_memory_format(up), cl);
  EXPECT_TRUE(cuda_matches_cpu(up, x, 0, 0));
  const Tensor down = up.to(kCPU);
  EXPECT_EQ(suggest_memory_format(down), cl);
  EXPECT_TRUE(test::tensors_close(down, x, 0, 0));
  // Contiguous into channels-last and back, both directions, with a dtype change too.
  const Tensor dst = empty(x.sizes(), kFloat32, kCuda0, cl);
  k::copy_(dst, x);
  EXPECT_TRUE(cuda_matches_cpu(dst, x, 0, 0));
  Tensor host = empty(x.sizes(), kFloat64, kCPU);
  k::copy_(host, up);
  EXPECT_TRUE(test::tensors_close(host, x.to(kFloat64), 0, 0));
  // Into a strided host view (staged through a dense host tensor).
  Tensor wide = zeros({3, 5, 4, 12});
  k::copy_(k::slice(wide, 3, 0, 12, 2), up);
  EXPECT_TRUE(test::tensors_close(k::slice(wide, 3, 0, 12, 2), x, 0, 0));
}

// A safetensors file holds row-major bytes: a channels-last CUDA tensor (a weight of a model
// after to(MemoryFormat::kChannelsLast)) comes to the host in its format and is written in the
// logical order all the same.
TEST(CudaCopy, ChannelsLastTensorsAreSavedRowMajor) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor x = randn({4, 3, 2, 5});
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("channels_last.safetensors");
  save_safetensors(path, {{"w", k::contiguous(x, MemoryFormat::kChannelsLast).to(kCuda0)}});
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_TRUE(test::tensors_close(file.at("w"), x, 0, 0));
}

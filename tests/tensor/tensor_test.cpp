// tests/tensor/tensor_test.cpp — the Tensor type: dtypes and their conversions, storage and
// views, factories, the Philox generator, printing, and the errors of each.

#include <cmath>
#include <limits>

#include "tensor/accelerator.h"
#include "tensor/conv.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/index.h"
#include "tensor/loss.h"
#include "tensor/norm.h"
#include "tensor/view.h"
#include "test_util.h"

using namespace loom;
using loom::test::values_are;

TEST(DType, SizesNamesAndPromotion) {
  EXPECT_EQ(itemsize(kFloat32), 4u);
  EXPECT_EQ(itemsize(kBFloat16), 2u);
  EXPECT_EQ(itemsize(kInt64), 8u);
  EXPECT_EQ(itemsize(kBool), 1u);
  EXPECT_STREQ(dtype_name(kBFloat16), "bfloat16");
  EXPECT_EQ(promote_types(kInt64, kFloat32), kFloat32);
  EXPECT_EQ(promote_types(kFloat32, kFloat64), kFloat64);
  EXPECT_EQ(promote_types(kUInt8, kInt32), kInt32);
  EXPECT_EQ(promote_types(kBool, kUInt8), kUInt8);
  EXPECT_EQ(promote_types(kFloat16, kBFloat16), kFloat32);
}

TEST(DType, HalfRoundsToNearestEven) {
  // Exactly representable values survive.
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(static_cast<float>(Half(v)), v) << v;
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
  EXPECT_EQ(static_cast<float>(Half(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(static_cast<float>(Half(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(70000.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::nanf("")))));
  EXPECT_EQ(Half(-0.0f).bits, 0x8000);
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  // Every half converts to float and back unchanged.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    Half h;
    h.bits = static_cast<uint16_t>(bits);
    const float f = h;
    if (std::isnan(f)) continue;
    ASSERT_EQ(Half(f).bits, h.bits) << bits;
  }
}

// Tensor conversions (to_dtype) take a vectorised path for dense float32 <-> float16 and an
// element-by-element one otherwise: both give Half's own rounding, for every half value, the
// ties between them and values beyond the range.
TEST(DType, DenseAndStridedHalfConversionsAgreeWithHalf) {
  std::vector<float> values;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    Half h;
    h.bits = static_cast<uint16_t>(bits);
    const float f = h;
    if (std::isnan(f)) continue;
    values.push_back(f);
    values.push_back(std::nextafter(f, 0.0f));             // rounds to f or its neighbour
    values.push_back(f * (1.0f + std::ldexp(1.0f, -11)));  // about half an ulp away: ties
  }
  values.push_back(1e6f);
  values.push_back(-1e-9f);
  const auto n = static_cast<int64_t>(values.size());
  const Tensor dense = tensor<float>(values, {n});
  const Tensor every_other = kernels::select(kernels::stack({dense, dense}, 1), 1, 0);  // stride 2
  const Tensor from_dense = kernels::to_dtype(dense, kFloat16);
  const Tensor from_strided = kernels::to_dtype(every_other, kFloat16);  // element by element
  const auto* a = from_dense.data_ptr<Half>();
  const auto* b = from_strided.data_ptr<Half>();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i].bits, Half(values[i]).bits) << values[i];
    ASSERT_EQ(b[i].bits, a[i].bits) << values[i];
  }
  // And back: dense float16 to float32 against Half's own conversion.
  const Tensor back = kernels::to_dtype(from_dense, kFloat32);
  const float* c = back.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(c[i], static_cast<float>(a[i])) << values[i];
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
}

TEST(Device, Parses) {
  EXPECT_TRUE(Device("cpu").is_cpu());
  EXPECT_EQ(Device("cuda:3").index, 3);
  EXPECT_EQ(Device("cuda").str(), "cuda:0");
  EXPECT_LOOM_ERROR(Device("tpu"), ValueError, {"device", "tpu"});
  EXPECT_LOOM_ERROR(Device("cuda:x"), ValueError, {"cuda:x"});
}

TEST(Device, CudaWithoutAGpuRaisesDeviceError) {
  // Built without CUDA: "built without CUDA"; built with it on a machine without a GPU: the
  // device is not available. Either way a DeviceError naming the device, never a crash.
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_LOOM_ERROR(zeros({2}, kFloat32, Device("cuda:0")), DeviceError, {"cuda"});
}

TEST(Device, OperandsOnTwoDevicesAreRefusedBeforeAnyKernel) {
  // The device switch checks every operand: a CUDA kernel must never be handed a host pointer.
  // The "CUDA" tensor here is host memory labelled cuda:0; nothing may read it.
  float storage[6] = {};
  const Tensor on_gpu = from_blob(storage, {2, 3}, kFloat32, Device(DeviceType::CUDA, 0));
  const Tensor on_cpu = zeros({2, 3});
  const std::string one_device = "expected all tensors on one device";
  EXPECT_LOOM_ERROR(kernels::softmax_backward(on_cpu, on_gpu, 1), DeviceError,
                    {"softmax_backward", one_device, "cpu", "cuda:0"});
  EXPECT_LOOM_ERROR(kernels::add(on_gpu, on_cpu), DeviceError, {"add", one_device});
  EXPECT_LOOM_ERROR(
      kernels::batch_norm_backward_reduce(on_cpu, on_cpu, zeros({3}), on_gpu.select(0, 0)),
      DeviceError, {"batch_norm_backward_reduce", one_device});
  const Tensor indices = zeros({1, 1, 1, 1}, kInt64);
  float gpu_dout[1] = {};
  EXPECT_LOOM_ERROR(kernels::max_pool2d_backward(
                        from_blob(gpu_dout, {1, 1, 1, 1}, kFloat32, Device(DeviceType::CUDA, 0)),
                        indices, {1, 1, 2, 2}),
                    DeviceError, {"max_pool2d_backward", one_device});
}

TEST(Factory, Basics) {
  EXPECT_TRUE(values_are(zeros({2, 2}), {0, 0, 0, 0}));
  EXPECT_TRUE(values_are(ones({3}, kInt32), {1, 1, 1}));
  EXPECT_TRUE(values_are(full({2}, 2.5, kFloat64), {2.5, 2.5}));
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), kInt64);
  EXPECT_TRUE(values_are(a, {0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(0, 1, 0.25).dtype(), kFloat32);
  EXPECT_TRUE(values_are(arange(0, 1, 0.25), {0, 0.25, 0.5, 0.75}));
  EXPECT_TRUE(values_are(arange(3, 0, -1), {3, 2, 1}));
  EXPECT_TRUE(values_are(linspace(0, 1, 5), {0, 0.25, 0.5, 0.75, 1.0}));
  EXPECT_TRUE(values_are(eye(2, 3), {1, 0, 0, 0, 1, 0}));
  Tensor t = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.data_ptr<float>()[4], 5.0f);
  EXPECT_EQ(scalar_tensor(7).dim(), 0);
  EXPECT_EQ(scalar_tensor(7).item(), 7.0);
}

TEST(Factory, FromBlobSharesMemory) {
  float buffer[4] = {1, 2, 3, 4};
  Tensor t = from_blob(buffer, {2, 2}, kFloat32);
  buffer[3] = 9;
  EXPECT_EQ(t.data_ptr<float>()[3], 9.0f);
  Tensor c = from_data(buffer, {4}, kFloat32);
  buffer[0] = -1;
  EXPECT_EQ(c.data_ptr<float>()[0], 1.0f);
}

TEST(Factory, Errors) {
  EXPECT_LOOM_ERROR(zeros({2, -1}), ShapeError, {"empty", "[2, -1]"});
  EXPECT_LOOM_ERROR(arange(0, 5, 0), ValueError, {"arange"});
  EXPECT_LOOM_ERROR(randint(3, 3, {2}), ValueError, {"randint"});
  EXPECT_LOOM_ERROR(tensor<float>({1, 2, 3}, {2, 2}), ShapeError, {"tensor", "[2, 2]"});
  EXPECT_LOOM_ERROR(zeros({2}).data_ptr<double>(), DTypeError, {"float32", "float64"});
  EXPECT_LOOM_ERROR(zeros({2}).item(), ValueError, {"item", "[2]"});
}

TEST(Memory, AlignedAndCounted) {
  const int64_t before = memory_stats(kCPU).current_bytes;
  {
    Tensor t = empty({1000}, kFloat64);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
    EXPECT_EQ(memory_stats(kCPU).current_bytes, before + 8000);
    EXPECT_GE(memory_stats(kCPU).peak_bytes, before + 8000);
  }
  EXPECT_EQ(memory_stats(kCPU).current_bytes, before);
}

TEST(Random, SeededAndThreadCountIndependent) {
  manual_seed(42);
  Tensor a = randn({1000});
  Tensor u = rand({1001});
  manual_seed(42);
  const int threads = get_num_threads();
  set_num_threads(1);
  Tensor b = randn({1000});
  Tensor v = rand({1001});
  set_num_threads(threads);
  EXPECT_TRUE(loom::test::tensors_close(a, b, 0, 0));
  EXPECT_TRUE(loom::test::tensors_close(u, v, 0, 0));
  // The generator moved on: the next draw differs.
  Tensor c = randn({1000});
  EXPECT_FALSE(loom::test::tensors_close(a, c, 0, 0));
}

TEST(Random, Distributions) {
  manual_seed(7);
  Tensor n = randn({200000}, kFloat64);
  const std::vector<double> v = n.to_vector<double>();
  double mean = 0, sq = 0;
  for (double x : v) mean += x;
  mean /= v.size();
  for (double x : v) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sq / v.size(), 1.0, 0.01);
  Tensor u = rand({100000}, kFloat64);
  for (double x : u.to_vector<double>()) ASSERT_TRUE(x >= 0 && x < 1);
  Tensor r = randint(-2, 3, {10000});
  int counts[5] = {0};
  for (double x : r.to_vector<double>()) {
    ASSERT_TRUE(x >= -2 && x < 3);
    counts[static_cast<int>(x) + 2]++;
  }
  for (int c : counts) EXPECT_NEAR(c, 2000, 200);
}

TEST(Random, PhiloxKnownAnswer) {
  // Known-answer vectors of Philox4x32-10 (Random123): counter 0, key 0 and all-ones.
  auto zero = philox4x32(0, 0, 0);
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[1], 0xe169c58du);
  EXPECT_EQ(zero[2], 0xbc57ac4cu);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
  auto ones = philox4x32(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(ones[0], 0x408f276du);
  EXPECT_EQ(ones[1], 0x41c83b0eu);
  EXPECT_EQ(ones[2], 0xa20bc7c6u);
  EXPECT_EQ(ones[3], 0x6d5451fdu);
}

TEST(Views, ShareStorage) {
  Tensor t = arange(0, 12, 1, kFloat32).reshape({3, 4});
  Tensor v = t.view({4, 3});
  EXPECT_TRUE(v.is_alias_of(t));
  Tensor tr = t.t();
  EXPECT_EQ(tr.sizes(), (Shape{4, 3}));
  EXPECT_EQ(tr.strides(), (Shape{1, 4}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_TRUE(values_are(tr.contiguous(), {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  Tensor row = t.select(0, 1);
  EXPECT_TRUE(values_are(row, {4, 5, 6, 7}));
  Tensor col = t.select(1, -1);
  EXPECT_TRUE(values_are(col, {3, 7, 11}));
  EXPECT_TRUE(values_are(t.slice(1, 1, 4, 2), {1, 3, 5, 7, 9, 11}));
  EXPECT_TRUE(values_are(t.narrow(0, 1, 2), {4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_TRUE(values_are(t.slice(1, -2, 100), {2, 3, 6, 7, 10, 11}));
  Tensor e = tensor<float>({1, 2}, {2, 1}).expand({2, 3});
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_TRUE(values_are(e, {1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(t.unsqueeze(1).sizes(), (Shape{3, 1, 4}));
  EXPECT_EQ(t.unsqueeze(-1).sizes(), (Shape{3, 4, 1}));
  EXPECT_EQ(t.unsqueeze(1).squeeze().sizes(), (Shape{3, 4}));
  EXPECT_EQ(zeros({2, 1, 3, 1}).squeeze(1).sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(zeros({2, 3, 4, 5}).flatten(1).sizes(), (Shape{2, 60}));
  EXPECT_EQ(zeros({2, 3, 4, 5}).flatten(1, 2).sizes(), (Shape{2, 12, 5}));
  EXPECT_EQ(t.permute({1, 0}).strides(), (Shape{1, 4}));
  // Writing through a view changes the base.
  row.fill_(-1);
  EXPECT_EQ(t.data_ptr<float>()[5], -1.0f);
}

TEST(Views, ViewOfNonContiguousFollowsStrides) {
  Tensor t = arange(0, 24, 1, kFloat32).reshape({2, 3, 4});
  Tensor p = t.permute({1, 0, 2});  // [3, 2, 4], the last dim still contiguous
  Tensor v = p.view({3, 2, 2, 2});  // splitting the contiguous last dim is a view
  EXPECT_TRUE(v.is_alias_of(t));
  EXPECT_TRUE(loom::test::tensors_close(v, p.contiguous().view({3, 2, 2, 2}), 0, 0));
  EXPECT_LOOM_ERROR(p.view({6, 4}), ShapeError, {"view", "reshape"});
  Tensor r = p.reshape({6, 4});  // reshape copies when it must
  EXPECT_FALSE(r.is_alias_of(t));
  EXPECT_TRUE(values_are(r.select(0, 1), {12, 13, 14, 15}));
  EXPECT_EQ(t.view({-1, 4}).sizes(), (Shape{6, 4}));
  EXPECT_EQ(scalar_tensor(3).view({1, 1}).sizes(), (Shape{1, 1}));
}

TEST(Views, Errors) {
  Tensor t = zeros({2, 3});
  EXPECT_LOOM_ERROR(t.view({4, 2}), ShapeError, {"view", "[4, 2]", "6"});
  EXPECT_LOOM_ERROR(t.view({-1, -1}), ShapeError, {"view", "-1"});
  EXPECT_LOOM_ERROR(t.permute({0}), ShapeError, {"permute", "[2, 3]"});
  EXPECT_LOOM_ERROR(t.permute({0, 0}), ShapeError, {"permute", "repeated"});
  EXPECT_LOOM_ERROR(t.transpose(0, 2), IndexError, {"transpose", "dim 2"});
  EXPECT_LOOM_ERROR(t.select(0, 2), IndexError, {"select", "index 2", "[2, 3]"});
  EXPECT_LOOM_ERROR(t.narrow(1, 2, 2), IndexError, {"narrow", "[2, 3]"});
  EXPECT_LOOM_ERROR(t.expand({3, 3}), ShapeError, {"expand", "[2, 3]", "[3, 3]"});
  EXPECT_LOOM_ERROR(t.size(2), IndexError, {"size", "dim 2"});
  EXPECT_LOOM_ERROR(t.flatten(1, 0), ShapeError, {"flatten"});
  EXPECT_LOOM_ERROR(Tensor().dim(), ValueError, {"undefined"});
}

TEST(Copy, ConvertsBroadcastsAndBumpsVersion) {
  Tensor f = tensor<float>({1.5f, -2.7f, 3.2f});
  EXPECT_TRUE(values_are(f.to(kInt64), {1, -2, 3}));
  EXPECT_TRUE(values_are(f.to(kBool), {1, 1, 1}));
  EXPECT_TRUE(values_are(f.to(kFloat16).to(kFloat32), {1.5, -2.69921875, 3.19921875}));
  EXPECT_TRUE(values_are(f.to(kBFloat16).to(kFloat64), {1.5, -2.703125, 3.203125}));
  Tensor dst = zeros({2, 3});
  const uint64_t v0 = dst.version();
  dst.copy_(tensor<double>({1, 2, 3}));
  EXPECT_GT(dst.version(), v0);
  EXPECT_TRUE(values_are(dst, {1, 2, 3, 1, 2, 3}));
  EXPECT_LOOM_ERROR(dst.copy_(zeros({2})), ShapeError, {"copy_", "[2]", "[2, 3]"});
  Tensor c = f.clone();
  EXPECT_FALSE(c.is_alias_of(f));
}

TEST(Print, LooksLikePyTorch) {
  EXPECT_EQ(tensor<float>({1.0f, -2.5f}).str(), "tensor([ 1.0000, -2.5000])");
  EXPECT_EQ(tensor<float>({1, 2, 3, 4}, {2, 2}).str(), "tensor([[1., 2.],\n        [3., 4.]])");
  EXPECT_EQ(arange(3).str(), "tensor([0, 1, 2])");
  EXPECT_EQ(tensor<double>({0.5}).str(), "tensor([0.5000], dtype=float64)");
  EXPECT_EQ(tensor<bool>({true, false}).str(), "tensor([ True, False])");
  EXPECT_EQ(scalar_tensor(2.5).str(), "tensor(2.5000)");
  EXPECT_EQ(zeros({2}).requires_grad_().str(), "tensor([0., 0.], requires_grad=True)");
  const std::string big = arange(2000).str();
  EXPECT_NE(big.find("..."), std::string::npos);
  EXPECT_NE(big.find("1999"), std::string::npos);
}

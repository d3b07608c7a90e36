// tests/cuda/index_cuda_test.cpp — the CUDA index kernels (tensor/cuda/index.h) against the
// CPU ones: cat, index_select/index_add_, gather/scatter_add, one_hot, embedding and its
// backward, dropout's mask (equal bit for bit), the index range errors, and determinism of the
// accumulating ops under many duplicate indices. Every test skips without a GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/copy.h"
#include "tensor/cuda/index.h"
#include "tensor/index.h"
#include "tensor/view.h"

namespace loom::test {
namespace {

namespace k = loom::kernels;

Tensor gpu(const Tensor& t) { return t.to(kCuda0); }

// The CUDA result equals the CPU one bit for bit (same shape and dtype).
::testing::AssertionResult same_bits(const Tensor& on_cuda, const Tensor& on_cpu) {
  if (!on_cuda.is_cuda()) return ::testing::AssertionFailure() << "result is not on CUDA";
  const Tensor a = on_cuda.to(kCPU).contiguous(), b = on_cpu.contiguous();
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure()
           << "cuda " << detail::str(a.sizes()) << " " << a.dtype() << " vs cpu "
           << detail::str(b.sizes()) << " " << b.dtype();
  if (a.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) != 0) {
    const size_t item = a.itemsize();
    for (int64_t i = 0; i < a.numel(); ++i)
      if (std::memcmp(static_cast<const char*>(a.data()) + i * item,
                      static_cast<const char*>(b.data()) + i * item, item) != 0)
        return ::testing::AssertionFailure() << "element " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

Tensor random_index(int64_t high, const Shape& shape, DType dtype = kInt64) {
  return randint(0, high, shape, dtype);
}

// ---------------------------------------------------------------- cat

TEST(CudaIndex, CatAlongEveryDim) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    const Tensor a = randint(-9, 9, {2, 3, 5}, dtype), b = randint(-9, 9, {2, 4, 5}, dtype);
    const Tensor c = randint(-9, 9, {2, 1, 5}, dtype);
    EXPECT_TRUE(same_bits(cuda::cat({gpu(a), gpu(b), gpu(c)}, 1), k::cat({a, b, c}, 1)));
    EXPECT_TRUE(same_bits(cuda::cat({gpu(a), gpu(a)}, 0), k::cat({a, a}, 0)));
    EXPECT_TRUE(same_bits(cuda::cat({gpu(a), gpu(a)}, -1), k::cat({a, a}, -1)));
  }
}

TEST(CudaIndex, CatOddSizesEmptyAndNonContiguous) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor big = randn({1000003}), one = randn({1}), none = empty({0});
  EXPECT_TRUE(same_bits(cuda::cat({gpu(big), gpu(none), gpu(one)}, 0), k::cat({big, none, one})));
  // A transposed input, and a 1-D empty one skipped among 2-D tensors.
  const Tensor x = randn({7, 3}, kFloat64), y = randn({3, 5}, kFloat64);
  const Tensor xt = k::transpose(x, 0, 1);
  EXPECT_TRUE(same_bits(cuda::cat({k::transpose(gpu(x), 0, 1), gpu(none), gpu(y)}, 1),
                        k::cat({xt, none, y}, 1)));
  EXPECT_TRUE(same_bits(cuda::cat({gpu(none), gpu(none)}, 0), k::cat({none, none}, 0)));
  // Rows of 3 and 1 bytes (uint8): single-byte words.
  const Tensor u = randint(0, 200, {5, 3}, kUInt8), v = randint(0, 200, {5, 1}, kUInt8);
  EXPECT_TRUE(same_bits(cuda::cat({gpu(u), gpu(v), gpu(u)}, 1), k::cat({u, v, u}, 1)));
}

TEST(CudaIndex, CatPromotesMixedDtypes) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor a = randint(-9, 9, {2, 3}, kInt32), b = randn({2, 2});
  EXPECT_TRUE(same_bits(cuda::cat({gpu(a), gpu(b)}, 1), k::cat({a, b}, 1)));
}

TEST(CudaIndex, CatShapeMismatchRaises) {
  LOOM_SKIP_WITHOUT_GPU();
  EXPECT_LOOM_ERROR(k::cat({gpu(randn({2, 3})), gpu(randn({3, 3}))}, 1), ShapeError,
                    {"cat", "[2, 3]", "[3, 3]"});
}

// ---------------------------------------------------------------- index_select, index_add_

TEST(CudaIndex, IndexSelect) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor x = randn({4, 5, 6}, kFloat64);
  for (int64_t dim : {0, 1, 2, -1}) {
    const Tensor idx = random_index(x.size(dim), {9}, kInt32);  // duplicates likely
    EXPECT_TRUE(same_bits(cuda::index_select(gpu(x), dim, gpu(idx)), k::index_select(x, dim, idx)));
  }
  // Non-contiguous x and index, float32, a 0-d index and a 0-d x.
  const Tensor xt = k::transpose(x, 0, 2).to(kFloat32);
  const Tensor idx = random_index(6, {10});
  EXPECT_TRUE(same_bits(cuda::index_select(k::transpose(gpu(x.to(kFloat32)), 0, 2), 0,
                                           k::slice(gpu(idx), 0, 0, 10, 2)),
                        k::index_select(xt, 0, k::slice(idx, 0, 0, 10, 2))));
  const Tensor scalar = full({}, 3, kInt64);  // a 0-d index
  EXPECT_TRUE(same_bits(cuda::index_select(gpu(x), 1, gpu(scalar)), k::index_select(x, 1, scalar)));
  const Tensor x0 = full({}, 2.5);
  const Tensor zero = tensor<int64_t>({0}, {1});
  EXPECT_TRUE(same_bits(cuda::index_select(gpu(x0), 0, gpu(zero)), k::index_select(x0, 0, zero)));
}

TEST(CudaIndex, IndexSelectOutOfRangeRaises) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor idx = tensor<int64_t>({0, 2, 5, -1}, {4});
  EXPECT_LOOM_ERROR(cuda::index_select(gpu(randn({3, 4})), 0, gpu(idx)), IndexError,
                    {"index_select", "index 5", "size 3", "[3, 4]", "[4]"});
  EXPECT_LOOM_ERROR(k::index_select(gpu(randn({3, 4})), 0, gpu(randn({2}))), DTypeError,
                    {"index_select", "int64"});
}

TEST(CudaIndex, IndexAddMatchesCpuBitForBit) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    const Tensor self = randint(-50, 50, {6, 7, 3}, dtype);
    for (int64_t dim : {0, 1, 2}) {
      const Tensor idx = random_index(self.size(dim), {40});
      Shape src_shape = self.sizes();
      src_shape[dim] = 40;
      const Tensor src = dtype == kInt64 ? randint(-50, 50, src_shape) : randn(src_shape, dtype);
      const Tensor on_cuda = gpu(self);
      cuda::index_add_(on_cuda, dim, gpu(idx), gpu(src));
      const Tensor on_cpu = self.clone();
      k::index_add_(on_cpu, dim, idx, src);
      EXPECT_TRUE(same_bits(on_cuda, on_cpu)) << "dim " << dim << " " << dtype;
    }
  }
}

TEST(CudaIndex, IndexAddIsDeterministicUnderManyDuplicates) {
  LOOM_SKIP_WITHOUT_GPU();
  // 200000 rows of 33 onto 5 rows: long per-row sums whose float32 result depends on order.
  const Tensor idx = random_index(5, {200000}, kInt32);
  const Tensor src = randn({200000, 33});
  const Tensor cpu_result = zeros({5, 33});
  k::index_add_(cpu_result, 0, idx, src);
  Tensor first;
  for (int run = 0; run < 2; ++run) {
    const Tensor self = gpu(zeros({5, 33}));
    cuda::index_add_(self, 0, gpu(idx),
                     k::transpose(gpu(k::transpose(src, 0, 1).contiguous()), 0, 1));
    EXPECT_TRUE(same_bits(self, cpu_result));
    if (run == 0)
      first = self.to(kCPU);
    else
      EXPECT_TRUE(same_bits(self, first));
  }
}

TEST(CudaIndex, IndexAddOutOfRangeRaises) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor self = gpu(zeros({3, 2}));
  EXPECT_LOOM_ERROR(cuda::index_add_(self, 0, gpu(tensor<int64_t>({1, 3}, {2})), gpu(ones({2, 2}))),
                    IndexError, {"index_add_", "index 3", "size 3", "[3, 2]"});
}

// ---------------------------------------------------------------- gather, scatter_add

TEST(CudaIndex, Gather) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor x = randn({4, 5, 6}, kFloat64);
  for (int64_t dim : {0, 1, 2}) {
    Shape shape = {3, 4, 5};
    shape[dim] = 7;
    const Tensor idx = random_index(x.size(dim), shape);
    EXPECT_TRUE(same_bits(cuda::gather(gpu(x), dim, gpu(idx)), k::gather(x, dim, idx)));
  }
  // Non-contiguous x (int64) and a non-contiguous int32 index.
  const Tensor xi = randint(-100, 100, {6, 5});
  const Tensor idx = random_index(6, {4, 5}, kInt32);
  EXPECT_TRUE(same_bits(cuda::gather(k::transpose(gpu(xi), 0, 1), 1, k::transpose(gpu(idx), 0, 1)),
                        k::gather(k::transpose(xi, 0, 1), 1, k::transpose(idx, 0, 1))));
  EXPECT_LOOM_ERROR(cuda::gather(gpu(x), 1, gpu(tensor<int64_t>({0, 5}, {1, 2, 1}))), IndexError,
                    {"gather", "index 5", "size 5", "[4, 5, 6]", "[1, 2, 1]"});
}

TEST(CudaIndex, ScatterAddMatchesCpuBitForBit) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64, kInt32}) {
    const Tensor self = randint(-9, 9, {5, 6, 4}, dtype);
    for (int64_t dim : {0, 1, 2}) {
      const Tensor idx = random_index(self.size(dim), {4, 5, 3});
      const Tensor src =
          dtype == kInt32 ? randint(-9, 9, {5, 6, 4}, kInt32) : randn({5, 6, 4}, dtype);
      EXPECT_TRUE(same_bits(cuda::scatter_add(gpu(self), dim, gpu(idx), gpu(src)),
                            k::scatter_add(self, dim, idx, src)));
      const Tensor on_cuda = gpu(self);
      cuda::scatter_add_(on_cuda, dim, gpu(idx), gpu(src));
      EXPECT_TRUE(same_bits(on_cuda, k::scatter_add(self, dim, idx, src)));
    }
  }
  // In place into a transposed view of a CUDA tensor, from a transposed src.
  const Tensor base = randn({6, 5}), src = randn({6, 5});
  const Tensor idx = random_index(6, {5, 4});
  const Tensor on_cuda = gpu(base);
  cuda::scatter_add_(k::transpose(on_cuda, 0, 1), 1, gpu(idx), k::transpose(gpu(src), 0, 1));
  const Tensor on_cpu = base.clone();
  k::scatter_add_(k::transpose(on_cpu, 0, 1), 1, idx, k::transpose(src, 0, 1));
  EXPECT_TRUE(same_bits(on_cuda, on_cpu));
}

TEST(CudaIndex, ScatterAddIsDeterministicUnderManyDuplicates) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor idx = random_index(7, {1000003});
  const Tensor src = randn({1000003});
  const Tensor expected = k::scatter_add(zeros({7}), 0, idx, src);
  const Tensor first = cuda::scatter_add(gpu(zeros({7})), 0, gpu(idx), gpu(src));
  EXPECT_TRUE(same_bits(first, expected));
  EXPECT_TRUE(same_bits(cuda::scatter_add(gpu(zeros({7})), 0, gpu(idx), gpu(src)), first.to(kCPU)));
  EXPECT_LOOM_ERROR(
      cuda::scatter_add(gpu(zeros({7})), 0, gpu(tensor<int64_t>({7}, {1})), gpu(ones({1}))),
      IndexError, {"scatter_add", "index 7", "size 7", "[7]", "[1]"});
}

TEST(CudaIndex, OneHot) {
  LOOM_SKIP_WITHOUT_GPU();
  const Tensor idx = random_index(9, {3, 7}, kInt32);
  EXPECT_TRUE(same_bits(cuda::one_hot(gpu(idx), -1), k::one_hot(idx, -1)));
  EXPECT_TRUE(same_bits(cuda::one_hot(gpu(idx), 12), k::one_hot(idx, 12)));
  EXPECT_TRUE(same_bits(cuda::one_hot(gpu(k::transpose(idx, 0, 1)), 9),
                        k::one_hot(k::transpose(idx, 0, 1), 9)));
  EXPECT_LOOM_ERROR(cuda::one_hot(gpu(tensor<int64_t>({1, 4}, {2})), 3), IndexError,
                    {"one_hot", "class 4", "[0, 3)", "[2]"});
  EXPECT_LOOM_ERROR(k::one_hot(gpu(empty({0}, kInt64)), -1), ValueError, {"one_hot"});
}

// ---------------------------------------------------------------- embedding

TEST(CudaIndex, Embedding) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor weight = randn({11, 7}, dtype);
    const Tensor idx = random_index(11, {3, 5});
    EXPECT_TRUE(same_bits(cuda::embedding(gpu(weight), gpu(idx)), k::embedding(weight, idx)));
    const Tensor wt = randn({7, 11}, dtype);  // a transposed weight
    EXPECT_TRUE(same_bits(cuda::embedding(k::transpose(gpu(wt), 0, 1), gpu(idx)),
                          k::embedding(k::transpose(wt, 0, 1), idx)));
  }
  EXPECT_LOOM_ERROR(cuda::embedding(gpu(randn({4, 2})), gpu(tensor<int64_t>({4}, {1}))), IndexError,
                    {"embedding", "index 4", "[4, 2]", "[1]"});
}

TEST(CudaIndex, EmbeddingBackwardMatchesCpuAndIsDeterministic) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64}) {
    for (int64_t padding_idx : {int64_t{-1}, int64_t{2}}) {
      const Tensor idx = random_index(10, {64, 257}, kInt32);  // ~1650 uses of each row
      const Tensor dout = randn({64, 257, 33}, dtype);
      const Tensor expected = k::embedding_backward(dout, idx, 10, padding_idx);
      const Tensor first = cuda::embedding_backward(gpu(dout), gpu(idx), 10, padding_idx);
      EXPECT_TRUE(same_bits(first, expected)) << dtype << " padding " << padding_idx;
      EXPECT_TRUE(same_bits(cuda::embedding_backward(gpu(dout), gpu(idx), 10, padding_idx),
                            first.to(kCPU)));
    }
  }
  // Rows nobody uses come back zero; an empty index gives all zeros.
  const Tensor none = empty({0}, kInt64);
  EXPECT_TRUE(
      same_bits(cuda::embedding_backward(gpu(empty({0, 4})), gpu(none), 3, -1), zeros({3, 4})));
  EXPECT_LOOM_ERROR(
      cuda::embedding_backward(gpu(ones({1, 4})), gpu(tensor<int64_t>({3}, {1})), 3, -1),
      IndexError, {"embedding_backward", "index 3", "3 embeddings", "[1]"});
}

// ---------------------------------------------------------------- dropout

TEST(CudaIndex, DropoutMaskEqualsCpuBitForBit) {
  LOOM_SKIP_WITHOUT_GPU();
  for (DType dtype : {kFloat32, kFloat64})
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000003}})
      for (uint64_t first : {uint64_t{0}, uint64_t{12345}}) {
        const Tensor x = randn({n}, dtype);
        EXPECT_TRUE(same_bits(cuda::dropout_masked(gpu(x), 0.3, 42, first),
                              k::dropout_masked(x, 0.3, 42, first)))
            << dtype << " n=" << n << " first=" << first;
      }
  // Non-contiguous input, and a contiguous one whose data is not 16-byte aligned.
  const Tensor x = randn({37, 29});
  EXPECT_TRUE(same_bits(cuda::dropout_masked(k::transpose(gpu(x), 0, 1), 0.5, 7, 3),
                        k::dropout_masked(k::transpose(x, 0, 1), 0.5, 7, 3)));
  const Tensor flat = randn({1001});
  EXPECT_TRUE(same_bits(cuda::dropout_masked(k::slice(gpu(flat), 0, 1, 1001), 0.1, 7, 0),
                        k::dropout_masked(k::slice(flat, 0, 1, 1001), 0.1, 7, 0)));
  // NaN survives a dropped element (x * 0), as on the CPU (NaN payloads may differ: no bit test).
  const Tensor nan = full({64}, std::nan(""));
  const Tensor dropped = cuda::dropout_masked(gpu(nan), 0.5, 1, 0).to(kCPU);
  for (float v : dropped.to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_LOOM_ERROR(k::dropout_masked(gpu(x), 1.0, 1, 0), ValueError, {"dropout", "[37, 29]"});
}

}  // namespace
}  // namespace loom::test

// tests/tensor/index_test.cpp — cat, stack, split, chunk, index_select, gather, scatter_add and
// one_hot: forward against plain loops, gradients by gradcheck, and every error path.

#include "tensor/index.h"

#include <vector>

#include "test_util.h"

namespace loom {
namespace {

using test::tensors_close;
using test::values_are;

// Row-major flat offset of a coordinate.
int64_t flat(const Shape& shape, const Shape& coord) {
  int64_t at = 0;
  for (size_t d = 0; d < shape.size(); ++d) at = at * shape[d] + coord[d];
  return at;
}

// Calls f(coord) for every coordinate of shape, row-major.
template <typename F>
void for_each_coord(const Shape& shape, F&& f) {
  const int64_t n = shape_numel(shape);
  Shape coord(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(coord);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++coord[d] < shape[d]) break;
      coord[d] = 0;
    }
  }
}

// Naive cat: for each output coordinate, find the input that holds it.
std::vector<double> naive_cat(const std::vector<Tensor>& ts, int64_t dim, Shape* out_shape) {
  Shape shape = ts[0].sizes();
  shape[dim] = 0;
  for (const Tensor& t : ts) shape[dim] += t.size(dim);
  *out_shape = shape;
  std::vector<std::vector<double>> values;
  for (const Tensor& t : ts) values.push_back(t.to_vector<double>());
  std::vector<double> out;
  for_each_coord(shape, [&](const Shape& c) {
    int64_t pos = c[dim];
    for (size_t i = 0; i < ts.size(); ++i) {
      if (pos < ts[i].size(dim)) {
        Shape local = c;
        local[dim] = pos;
        out.push_back(values[i][flat(ts[i].sizes(), local)]);
        return;
      }
      pos -= ts[i].size(dim);
    }
  });
  return out;
}

// ---------------------------------------------------------------- cat / stack

TEST(Cat, MatchesNaiveLoopsInEveryDim) {
  for (int64_t dim = 0; dim < 3; ++dim) {
    Shape a = {2, 3, 4}, b = {2, 3, 4}, c = {2, 3, 4};
    b[dim] = 1;
    c[dim] = 5;
    std::vector<Tensor> ts = {randn(a), randn(b), randn(c)};
    Shape shape;
    const std::vector<double> expected = naive_cat(ts, dim, &shape);
    Tensor out = cat(ts, dim);
    EXPECT_EQ(out.sizes(), shape);
    EXPECT_TRUE(values_are(out, expected, 0.0));
    EXPECT_TRUE(tensors_close(cat(ts, dim - 3), out, 0, 0));  // negative dim
  }
}

TEST(Cat, StridedInputsAndDtypePromotion) {
  Tensor a = randn({4, 3}).t();  // [3, 4], not contiguous
  Tensor b = randn({3, 2}, kFloat64);
  Tensor c = tensor<int64_t>({1, 2, 3}, {3, 1});
  Tensor out = cat({a, b, c}, 1);
  EXPECT_EQ(out.dtype(), kFloat64);
  Shape shape;
  EXPECT_TRUE(values_are(out, naive_cat({a.to(kFloat64), b, c.to(kFloat64)}, 1, &shape), 1e-7));
  EXPECT_EQ(cat({tensor<int64_t>({1}), tensor<int32_t>({2})}).dtype(), kInt64);
  EXPECT_EQ(cat({tensor<int64_t>({1}), tensor<float>({2.f})}).dtype(), kFloat32);
}

TEST(Cat, SkipsEmptyOneDimTensors) {
  Tensor x = randn({2, 3});
  Tensor out = cat({empty({0}), x, empty({0})}, 1);
  EXPECT_TRUE(tensors_close(out, x, 0, 0));
  EXPECT_EQ(cat({empty({0}), empty({0})}).sizes(), Shape({0}));
  // A [0, 3] tensor is not skipped: it takes part (and adds nothing) in dim 0.
  EXPECT_EQ(cat({empty({0, 3}), x}).sizes(), Shape({2, 3}));
}

TEST(Cat, LargeParallelCopyIsExactForAnyThreadCount) {
  std::vector<Tensor> ts = {randn({64, 1000}), randn({64, 777}), randn({64, 3})};
  Shape shape;
  const std::vector<double> expected = naive_cat(ts, 1, &shape);
  const int threads = get_num_threads();
  set_num_threads(1);
  Tensor one = cat(ts, 1);
  set_num_threads(2);
  Tensor two = cat(ts, 1);
  set_num_threads(threads);
  EXPECT_TRUE(values_are(one, expected, 0.0));
  EXPECT_TRUE(values_are(two, expected, 0.0));
}

TEST(Stack, MatchesSelectOfEachInput) {
  std::vector<Tensor> ts = {randn({2, 3}), randn({2, 3}), randn({2, 3})};
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    Tensor out = stack(ts, dim);
    const int64_t d = dim < 0 ? dim + 3 : dim;
    Shape expected = {2, 3};
    expected.insert(expected.begin() + d, 3);
    EXPECT_EQ(out.sizes(), expected);
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_TRUE(tensors_close(out.select(d, i), ts[i], 0, 0)) << "dim " << dim;
  }
  EXPECT_EQ(stack({empty({0}), empty({0})}).sizes(), Shape({2, 0}));
}

TEST(Cat, Gradcheck) {
  Tensor a = test::dparam({2, 3}), b = test::dparam({2, 1}), c = test::dparam({2, 2});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return cat(in, 1); }, {a, b, c});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return cat(in, 0) * cat(in, 0); },
                   {test::dparam({1, 3}), test::dparam({2, 3})});
  // An empty 1-D input that requires grad gets an empty gradient.
  Tensor e = empty({0}, kFloat64).requires_grad_();
  Tensor x = test::dparam({3});
  sum(cat({e, x}) * 2.0).backward();
  EXPECT_EQ(e.grad().sizes(), Shape({0}));
  EXPECT_TRUE(values_are(x.grad(), {2, 2, 2}));
  // A promoted input gets its gradient back in its own dtype.
  Tensor f = ones({2}).requires_grad_();
  sum(cat({f, x}) * 3.0).backward();
  EXPECT_EQ(f.grad().dtype(), kFloat32);
  EXPECT_TRUE(values_are(f.grad(), {3, 3}));
}

TEST(Stack, Gradcheck) {
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return stack(in, 1); },
                   {test::dparam({2, 3}), test::dparam({2, 3})});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return stack(in, -1) * stack(in, -1); },
                   {test::dparam({2}), test::dparam({2}), test::dparam({2})});
}

TEST(Cat, Errors) {
  EXPECT_LOOM_ERROR(cat({}), ValueError, {"cat", "non-empty"});
  EXPECT_LOOM_ERROR(cat({zeros({2, 3}), zeros({2, 4})}, 0), ShapeError,
                    {"cat", "[2, 3]", "[2, 4]"});
  EXPECT_LOOM_ERROR(cat({zeros({2, 3}), zeros({2, 3, 1})}, 0), ShapeError,
                    {"cat", "[2, 3]", "[2, 3, 1]"});
  EXPECT_LOOM_ERROR(cat({zeros({2, 3}), scalar_tensor(1.0)}), ShapeError, {"cat", "0-d", "[]"});
  EXPECT_LOOM_ERROR(cat({zeros({2, 3}), zeros({2, 3})}, 2), IndexError, {"cat", "dim 2"});
  EXPECT_LOOM_ERROR(cat({zeros({2}), Tensor()}), ValueError, {"cat", "undefined"});
  EXPECT_LOOM_ERROR(stack({}), ValueError, {"stack", "non-empty"});
  EXPECT_LOOM_ERROR(stack({zeros({2, 3}), zeros({3, 2})}), ShapeError,
                    {"stack", "[2, 3]", "[3, 2]"});
  EXPECT_LOOM_ERROR(stack({zeros({2, 3}), zeros({2, 3})}, 3), IndexError, {"stack", "dim 3"});
}

// ---------------------------------------------------------------- split / chunk

TEST(Split, PiecesAreViewsWithTheLastOneSmaller) {
  Tensor x = randn({7, 2});
  std::vector<Tensor> pieces = split(x, 3);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].sizes(), Shape({3, 2}));
  EXPECT_EQ(pieces[2].sizes(), Shape({1, 2}));
  for (const Tensor& p : pieces) EXPECT_TRUE(p.is_alias_of(x));
  EXPECT_TRUE(tensors_close(cat(pieces), x, 0, 0));
  EXPECT_TRUE(tensors_close(pieces[1], x.slice(0, 3, 6), 0, 0));

  std::vector<Tensor> listed = split(x, std::vector<int64_t>{1, 0, 6}, 0);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[1].sizes(), Shape({0, 2}));
  EXPECT_TRUE(tensors_close(listed[2], x.slice(0, 1, 7), 0, 0));
  std::vector<Tensor> cols = split(x, std::vector<int64_t>{1, 1}, -1);
  EXPECT_TRUE(tensors_close(cols[1], x.select(1, 1).unsqueeze(1), 0, 0));
  // An empty dim gives one empty piece, as PyTorch.
  EXPECT_EQ(split(empty({0, 2}), 3).size(), 1u);
}

TEST(Chunk, FollowsTorchChunkSizes) {
  auto sizes = [](const std::vector<Tensor>& pieces) {
    Shape s;
    for (const Tensor& p : pieces) s.push_back(p.size(0));
    return s;
  };
  EXPECT_EQ(sizes(chunk(zeros({5}), 3)), Shape({2, 2, 1}));
  EXPECT_EQ(sizes(chunk(zeros({6}), 4)), Shape({2, 2, 2}));  // ceil(6/4) = 2: three pieces
  EXPECT_EQ(sizes(chunk(zeros({2}), 5)), Shape({1, 1}));
  EXPECT_EQ(sizes(chunk(zeros({0}), 3)), Shape({0, 0, 0}));
  Tensor x = randn({2, 6});
  std::vector<Tensor> pieces = chunk(x, 3, 1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_TRUE(tensors_close(pieces[2], x.slice(1, 4, 6), 0, 0));
}

TEST(Split, GradientsGoToTheirSlicesAndUnusedPiecesGetZeros) {
  Tensor x = test::dparam({5, 2});
  std::vector<Tensor> pieces = split(x, 2);
  sum(pieces[0] * 3.0).backward();  // pieces 1 and 2 receive nothing
  EXPECT_TRUE(values_are(x.grad(), {3, 3, 3, 3, 0, 0, 0, 0, 0, 0}));

  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = split(in[0], std::vector<int64_t>{1, 2, 2}, 1);
        return cat({p[0] * p[0], p[2]}, 1);  // p[1] unused
      },
      {test::dparam({2, 5})});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = chunk(in[0], 2, 0);
        return p[1] * p[0];
      },
      {test::dparam({4, 2})});
}

TEST(Split, PiecesAreViewsForInPlaceChecks) {
  Tensor x = test::dparam({4});
  std::vector<Tensor> pieces = split(x, 2);
  EXPECT_THROW(pieces[0].mul_(2.0), AutogradError);
}

TEST(Split, Errors) {
  Tensor x = zeros({4, 3});
  EXPECT_LOOM_ERROR(split(x, 0), ValueError, {"split", "split_size", "[4, 3]"});
  EXPECT_LOOM_ERROR(split(x, -2), ValueError, {"split", "[4, 3]"});
  EXPECT_LOOM_ERROR(split(x, std::vector<int64_t>{1, 2}), ShapeError,
                    {"split", "[1, 2]", "[4, 3]"});
  EXPECT_LOOM_ERROR(split(x, std::vector<int64_t>{5, -1}), ValueError, {"split", "[5, -1]"});
  EXPECT_LOOM_ERROR(split(x, 2, 2), IndexError, {"split", "dim 2"});
  EXPECT_LOOM_ERROR(split(scalar_tensor(1.0), 1), ShapeError, {"split", "[]"});
  EXPECT_LOOM_ERROR(chunk(x, 0), ValueError, {"chunk", "chunks", "[4, 3]"});
  EXPECT_LOOM_ERROR(chunk(x, 2, -3), IndexError, {"chunk", "dim -3"});
  EXPECT_LOOM_ERROR(chunk(scalar_tensor(1.0), 1), ShapeError, {"chunk", "[]"});
}

// ---------------------------------------------------------------- index_select / index_add_

TEST(IndexSelect, MatchesNaiveLoopsInEveryDim) {
  Tensor x = randn({3, 4, 5});
  const std::vector<double> xv = x.to_vector<double>();
  for (int64_t dim = 0; dim < 3; ++dim) {
    Tensor index = tensor<int64_t>({2, 0, 2, 1});  // a duplicate
    Tensor out = index_select(x, dim, index);
    Shape shape = x.sizes();
    shape[dim] = 4;
    EXPECT_EQ(out.sizes(), shape);
    std::vector<double> expected;
    for_each_coord(shape, [&](const Shape& c) {
      Shape src = c;
      src[dim] = index.to_vector<int64_t>()[c[dim]];
      expected.push_back(xv[flat(x.sizes(), src)]);
    });
    EXPECT_TRUE(values_are(out, expected, 0.0)) << "dim " << dim;
    EXPECT_TRUE(tensors_close(index_select(x, dim, index.to(kInt32)), out, 0, 0));
    EXPECT_TRUE(tensors_close(
        index_select(x.permute({2, 0, 1}).contiguous().permute({1, 2, 0}), dim, index), out, 0, 0));
  }
  // A 0-d index keeps the dim with size 1; a 0-d x takes a one-element index.
  EXPECT_EQ(index_select(x, 1, scalar_tensor(3, kInt64)).sizes(), Shape({3, 1, 5}));
  EXPECT_TRUE(values_are(index_select(scalar_tensor(4.0), 0, tensor<int64_t>({0})), {4.0}));
  // Integer and bool tensors are selected too.
  EXPECT_TRUE(
      values_are(index_select(tensor<int64_t>({7, 8, 9}), 0, tensor<int64_t>({2, 2})), {9, 9}));
}

TEST(IndexSelect, GradientAccumulatesDuplicates) {
  Tensor x = test::dparam({4, 2});
  sum(index_select(x, 0, tensor<int64_t>({1, 3, 1, 1}))).backward();
  EXPECT_TRUE(values_are(x.grad(), {0, 0, 3, 3, 0, 0, 1, 1}));
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return index_select(in[0], 1, tensor<int64_t>({2, 0, 2}));
      },
      {test::dparam({2, 3, 2})});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        Tensor y = index_select(in[0], -1, tensor<int32_t>({1, 1, 0}));
        return y * y;
      },
      {test::dparam({3, 2})});
}

TEST(IndexAdd, MatchesNaiveAndIsTheSameForAnyThreadCount) {
  Tensor index = randint(0, 50, {3000});
  Tensor src = randn({4, 3000, 40});
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor dst = zeros({4, 50, 40});
    kernels::index_add_(dst, 1, index, src);
    return dst;
  };
  const int threads = get_num_threads();
  Tensor one = run(1), two = run(2);
  set_num_threads(threads);
  EXPECT_TRUE(tensors_close(one, two, 0, 0));  // bitwise: same summation order
  std::vector<double> expected(4 * 50 * 40, 0.0);
  const std::vector<double> sv = src.to_vector<double>();
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t j = 0; j < 3000; ++j)
      for (int64_t c = 0; c < 40; ++c)
        expected[(o * 50 + iv[j]) * 40 + c] += sv[(o * 3000 + j) * 40 + c];
  EXPECT_TRUE(values_are(one, expected, 1e-3));
}

TEST(IndexSelect, Errors) {
  Tensor x = zeros({5, 3});
  EXPECT_LOOM_ERROR(index_select(x, 0, tensor<float>({1.f})), DTypeError,
                    {"index_select", "float32"});
  EXPECT_LOOM_ERROR(index_select(x, 0, tensor<int64_t>({1, 5})), IndexError,
                    {"index_select", "index 5", "[5, 3]", "[2]"});
  EXPECT_LOOM_ERROR(index_select(x, 1, tensor<int64_t>({-1})), IndexError,
                    {"index_select", "index -1", "[5, 3]"});
  EXPECT_LOOM_ERROR(index_select(x, 2, tensor<int64_t>({0})), IndexError,
                    {"index_select", "dim 2"});
  EXPECT_LOOM_ERROR(index_select(x, 0, zeros({2, 2}, kInt64)), ShapeError,
                    {"index_select", "[5, 3]", "[2, 2]"});
  EXPECT_LOOM_ERROR(index_select(scalar_tensor(1.0), 0, tensor<int64_t>({0, 0})), ShapeError,
                    {"index_select", "[2]"});
  EXPECT_LOOM_ERROR(kernels::index_add_(zeros({3}), 0, tensor<int64_t>({0}), zeros({2})),
                    ShapeError, {"index_add_", "[3]", "[2]"});
  EXPECT_LOOM_ERROR(kernels::index_add_(zeros({3}), 0, tensor<int64_t>({0}), zeros({1}, kFloat64)),
                    DTypeError, {"index_add_", "float64"});
  EXPECT_LOOM_ERROR(kernels::index_add_(zeros({3}), 0, tensor<int64_t>({3}), zeros({1})),
                    IndexError, {"index_add_", "index 3", "[3]"});
}

// ---------------------------------------------------------------- gather / scatter_add

TEST(Gather, MatchesNaiveLoopsInEveryDim) {
  Tensor x = randn({4, 5, 6}).permute({1, 0, 2});  // [5, 4, 6], strided
  const Tensor xc = x.contiguous();
  const std::vector<double> xv = xc.to_vector<double>();
  for (int64_t dim = 0; dim < 3; ++dim) {
    const Shape index_shape = {3, 2, 4};  // smaller than x in every dim but `dim`
    Tensor index = randint(0, x.size(dim), index_shape);
    Tensor out = gather(x, dim, index);
    EXPECT_EQ(out.sizes(), index_shape);
    const std::vector<int64_t> iv = index.to_vector<int64_t>();
    std::vector<double> expected;
    for_each_coord(index_shape, [&](const Shape& c) {
      Shape src = c;
      src[dim] = iv[flat(index_shape, c)];
      expected.push_back(xv[flat(x.sizes(), src)]);
    });
    EXPECT_TRUE(values_are(out, expected, 0.0)) << "dim " << dim;
    EXPECT_TRUE(tensors_close(gather(x, dim - 3, index.to(kInt32)), out, 0, 0));
  }
  EXPECT_TRUE(values_are(gather(tensor<int64_t>({5, 6, 7}), 0, tensor<int64_t>({2, 0, 2, 2})),
                         {7, 5, 7, 7}));
  EXPECT_TRUE(values_are(gather(scalar_tensor(3.0), 0, scalar_tensor(0, kInt64)), {3.0}));
}

TEST(ScatterAdd, MatchesNaiveLoops) {
  for (int64_t dim = 0; dim < 2; ++dim) {
    Tensor x = randn({4, 5});
    Tensor src = randn({5, 6});  // larger than index
    Tensor index = randint(0, x.size(dim), {3, 4});
    Tensor out = scatter_add(x, dim, index, src);
    std::vector<double> expected = x.to_vector<double>();
    const std::vector<double> sv = src.to_vector<double>();
    const std::vector<int64_t> iv = index.to_vector<int64_t>();
    for_each_coord({3, 4}, [&](const Shape& c) {
      Shape dst = c;
      dst[dim] = iv[flat({3, 4}, c)];
      expected[flat({4, 5}, dst)] += sv[flat({5, 6}, c)];
    });
    EXPECT_TRUE(values_are(out, expected, 1e-5)) << "dim " << dim;
    // In place on a strided self.
    Tensor self = x.t().contiguous().t();
    kernels::scatter_add_(self, dim, index, src);
    EXPECT_TRUE(values_are(self, expected, 1e-5));
  }
}

TEST(ScatterAdd, LargeIsTheSameForAnyThreadCount) {
  Tensor index = randint(0, 7, {20000, 8});
  Tensor src = randn({20000, 8});
  const int threads = get_num_threads();
  set_num_threads(1);
  Tensor one = scatter_add(zeros({7, 8}), 0, index, src);
  set_num_threads(2);
  Tensor two = scatter_add(zeros({7, 8}), 0, index, src);
  set_num_threads(threads);
  EXPECT_TRUE(tensors_close(one, two, 0, 0));
}

TEST(Gather, GradientsByGradcheck) {
  Tensor index = tensor<int64_t>({0, 2, 2, 0, 0, 2}, {2, 3});  // duplicates within columns
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return gather(in[0], 0, index); },
                   {test::dparam({3, 4})});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return gather(in[0], 1, index); },
                   {test::dparam({2, 3})});
  Tensor x = test::dparam({3, 4});
  sum(gather(x, 0, index)).backward();
  EXPECT_TRUE(values_are(x.grad(), {2, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0}));
}

TEST(ScatterAdd, GradientsByGradcheck) {
  Tensor index = tensor<int64_t>({0, 2, 2, 1, 0, 0}, {2, 3});
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        Tensor y = scatter_add(in[0], 0, index, in[1]);
        return y * y;
      },
      {test::dparam({3, 4}), test::dparam({2, 3})});
  // src larger than index: its other elements get zero gradient.
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return scatter_add(in[0], 1, index, in[1]) * 2.0; },
      {test::dparam({2, 3}), test::dparam({3, 4})});
}

TEST(Gather, Errors) {
  Tensor x = zeros({3, 4});
  EXPECT_LOOM_ERROR(gather(x, 0, zeros({2, 2})), DTypeError, {"gather", "float32"});
  EXPECT_LOOM_ERROR(gather(x, 0, zeros({2}, kInt64)), ShapeError, {"gather", "[3, 4]", "[2]"});
  EXPECT_LOOM_ERROR(gather(x, 0, zeros({2, 5}, kInt64)), ShapeError,
                    {"gather", "[3, 4]", "[2, 5]"});
  EXPECT_LOOM_ERROR(gather(x, 1, full({2, 2}, 4, kInt64)), IndexError,
                    {"gather", "index 4", "[3, 4]", "[2, 2]"});
  EXPECT_LOOM_ERROR(gather(x, 0, full({2, 2}, -1, kInt64)), IndexError, {"gather", "index -1"});
  EXPECT_LOOM_ERROR(gather(x, 2, zeros({2, 2}, kInt64)), IndexError, {"gather", "dim 2"});
  Tensor index = zeros({2, 2}, kInt64);
  EXPECT_LOOM_ERROR(scatter_add(x, 0, index, zeros({2, 2}, kFloat64)), DTypeError,
                    {"scatter_add", "float64"});
  EXPECT_LOOM_ERROR(scatter_add(x, 0, index, zeros({1, 2})), ShapeError,
                    {"scatter_add", "[3, 4]", "[2, 2]", "[1, 2]"});
  EXPECT_LOOM_ERROR(scatter_add(x, 0, zeros({2, 5}, kInt64), zeros({2, 5})), ShapeError,
                    {"scatter_add", "[2, 5]"});
  EXPECT_LOOM_ERROR(scatter_add(x, 0, full({2, 2}, 3, kInt64), zeros({2, 2})), IndexError,
                    {"scatter_add", "index 3", "[3, 4]"});
  EXPECT_LOOM_ERROR(scatter_add(x, 0, index.to(kFloat32), zeros({2, 2})), DTypeError,
                    {"scatter_add", "float32"});
  EXPECT_LOOM_ERROR(kernels::scatter_add_(zeros({4}).expand({3, 4}), 0, index, zeros({2, 2})),
                    ValueError, {"scatter_add_", "overlapping"});
}

// ---------------------------------------------------------------- one_hot

TEST(OneHot, MatchesNaiveAndInfersClasses) {
  Tensor index = tensor<int64_t>({2, 0, 3, 0, 1, 2}, {2, 3});
  Tensor out = one_hot(index, 5);
  EXPECT_EQ(out.dtype(), kInt64);
  EXPECT_EQ(out.sizes(), Shape({2, 3, 5}));
  std::vector<double> expected(30, 0.0);
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  for (int64_t i = 0; i < 6; ++i) expected[i * 5 + iv[i]] = 1;
  EXPECT_TRUE(values_are(out, expected, 0.0));
  EXPECT_EQ(one_hot(index).sizes(), Shape({2, 3, 4}));  // max + 1
  EXPECT_EQ(one_hot(empty({0}, kInt64), 3).sizes(), Shape({0, 3}));
  EXPECT_TRUE(values_are(one_hot(scalar_tensor(1, kInt64), 3), {0, 1, 0}));
}

TEST(OneHot, Errors) {
  EXPECT_LOOM_ERROR(one_hot(tensor<int64_t>({0, -1}), 3), IndexError, {"one_hot", "-1", "[2]"});
  EXPECT_LOOM_ERROR(one_hot(tensor<int64_t>({0, 3}), 3), IndexError, {"one_hot", "class 3"});
  EXPECT_LOOM_ERROR(one_hot(empty({0}, kInt64)), ValueError, {"one_hot", "empty", "[0]"});
  EXPECT_LOOM_ERROR(one_hot(tensor<float>({1.f})), DTypeError, {"one_hot", "float32"});
  EXPECT_LOOM_ERROR(one_hot(tensor<int64_t>({0}), -2), ValueError, {"one_hot", "-2"});
}

}  // namespace
}  // namespace loom

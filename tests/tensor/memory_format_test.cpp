// tests/tensor/memory_format_test.cpp — channels-last tensors (Note [Memory formats]): the
// format API, which format each op family gives its result, that the elementwise loop runs a
// channels-last map as one flat pass, and that batch norm, convolution and a whole ResNet give
// the same numbers from a channels-last input as from a contiguous one, staying channels-last
// from layer to layer.

#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "nn/nn.h"
#include "tensor/conv.h"
#include "tensor/copy.h"
#include "tensor/cpu/loops.h"
#include "tensor/elementwise.h"
#include "tensor/norm.h"
#include "test_util.h"

using namespace loom;
using loom::test::tensors_close;
namespace k = loom::kernels;

namespace {

constexpr MemoryFormat kCL = MemoryFormat::kChannelsLast;
constexpr MemoryFormat kNCHW = MemoryFormat::kContiguous;

bool channels_last(const Tensor& t) { return suggest_memory_format(t) == kCL; }

// Exactly the same values in the same logical order (layouts may differ).
::testing::AssertionResult same_values(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return ::testing::AssertionFailure() << "shapes differ";
  if (a.to_vector<double>() != b.to_vector<double>())
    return ::testing::AssertionFailure() << "values differ";
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(MemoryFormat, StridesDensityAndSuggestion) {
  EXPECT_EQ(format_strides({2, 3, 4, 5}, kCL), (Shape{60, 1, 15, 3}));
  EXPECT_EQ(format_strides({2, 3, 4, 5}, kNCHW), (Shape{60, 20, 5, 1}));
  EXPECT_LOOM_ERROR(format_strides({2, 3, 4}, kCL), ShapeError, {"channels_last", "[2, 3, 4]"});
  EXPECT_LOOM_ERROR(empty({2, 3}, kFloat32, kCPU, kCL), ShapeError, {"channels_last", "[2, 3]"});

  const Tensor x = randn({2, 3, 4, 5});
  const Tensor cl = x.contiguous(kCL);
  EXPECT_EQ(cl.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_TRUE(cl.is_contiguous(kCL));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_EQ(suggest_memory_format(cl), kCL);
  EXPECT_EQ(suggest_memory_format(x), kNCHW);
  EXPECT_TRUE(same_values(cl, x));
  EXPECT_TRUE(cl.contiguous(kCL).is_same(cl));  // already channels-last: no copy
  EXPECT_TRUE(cl.contiguous().is_contiguous());
  // The same order through a permuted view is channels-last too.
  EXPECT_EQ(suggest_memory_format(randn({2, 4, 5, 3}).permute({0, 3, 1, 2})), kCL);
  // A transposed H and W is neither.
  EXPECT_EQ(suggest_memory_format(x.transpose(2, 3)), kNCHW);
  EXPECT_EQ(suggest_memory_format(randn({3, 4, 5})), kNCHW);

  // Dense in both orders: the strides of the size-1 dims decide.
  const Tensor one_channel = randn({2, 1, 4, 5});
  EXPECT_TRUE(one_channel.is_contiguous(kCL));
  EXPECT_EQ(suggest_memory_format(one_channel), kNCHW);
  const Tensor one_channel_cl = one_channel.contiguous(kCL);
  EXPECT_EQ(one_channel_cl.strides(), (Shape{20, 1, 5, 1}));
  EXPECT_EQ(suggest_memory_format(one_channel_cl), kCL);
  const Tensor pooled = randn({2, 6, 1, 1});
  EXPECT_EQ(suggest_memory_format(pooled), kNCHW);
  EXPECT_EQ(suggest_memory_format(pooled.contiguous(kCL)), kCL);
  EXPECT_EQ(suggest_memory_format(empty({2, 6, 1, 1}, kFloat32, kCPU, kCL)), kCL);
}

TEST(MemoryFormat, ContiguousInAFormatIsDifferentiable) {
  const Tensor x = randn({2, 3, 4, 5}, kFloat64).requires_grad_();
  const Tensor w = randn({2, 3, 4, 5}, kFloat64);
  Tensor y = x.contiguous(kCL);
  ASSERT_TRUE(channels_last(y));
  loom::mul(y, w).sum().backward();
  EXPECT_TRUE(same_values(x.grad(), w));
  EXPECT_TRUE(x.grad().is_contiguous());
  // A channels-last leaf gets a channels-last .grad, whatever layout reaches it.
  const Tensor xcl = randn({2, 3, 4, 5}, kFloat64).contiguous(kCL).requires_grad_();
  loom::mul(xcl.contiguous(), w).sum().backward();
  EXPECT_TRUE(channels_last(xcl.grad()));
  EXPECT_TRUE(same_values(xcl.grad(), w));
}

// A cast into a format is one copy, differentiable; under autocast a convolution casts its
// weight into its input's format (KRSC for a channels-last x) and caches one cast per format.
TEST(MemoryFormat, ConvolutionWeightsAreCastIntoTheInputsFormat) {
  const Tensor w = randn({4, 3, 3, 3}).requires_grad_();
  const Tensor w16 = loom::to(w, kFloat16, kCL);
  EXPECT_EQ(w16.dtype(), kFloat16);
  EXPECT_TRUE(channels_last(w16));
  EXPECT_TRUE(same_values(w16, w.to(kFloat16)));
  EXPECT_TRUE(loom::to(w16, kFloat16, kCL).is_same(w16));  // nothing to do: itself
  loom::mul(w16.to(kFloat32), w.detach()).sum().backward();
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_TRUE(w.grad().is_contiguous());
  EXPECT_TRUE(tensors_close(w.grad(), w.detach().to(kFloat16).to(kFloat32), 0, 0));

  const Tensor x = randn({2, 3, 6, 6});
  Tensor y_nchw, y_cl;
  {
    autocast::Guard amp(kBFloat16);
    y_nchw = conv2d(x, w);
    EXPECT_EQ(autocast::cached_casts(), 1u);
    y_cl = conv2d(x.contiguous(kCL), w);
    EXPECT_EQ(autocast::cached_casts(), 2u);  // the same weight, cast once per format
  }
  EXPECT_TRUE(channels_last(y_cl));
  EXPECT_TRUE(same_values(y_cl, y_nchw));
}

// A channels-last map merges to one flat loop (so it vectorises, and takes the flat CUDA kernel):
// the loop plan visits dims in the output's memory order.
TEST(MemoryFormat, LoopPlanOfChannelsLastOperandsIsFlat) {
  const Shape shape{2, 3, 4, 5};
  const Shape cl = format_strides(shape, kCL);
  const auto flat = cpu::plan_loop<3>(shape, {cl, cl, cl});
  EXPECT_EQ(flat.sizes, (Shape{120}));
  EXPECT_EQ(flat.strides[1], (Shape{1}));
  // A per-channel bias [1, C, 1, 1] broadcast into channels-last: rows of C, bias stride 1.
  const auto bias = cpu::plan_loop<2>(shape, {cl, {0, 1, 0, 0}});
  EXPECT_EQ(bias.sizes, (Shape{40, 3}));
  EXPECT_EQ(bias.strides[1], (Shape{0, 1}));
  // Row-major operands keep the row-major order.
  const Shape rm = contiguous_strides(shape);
  EXPECT_EQ(cpu::plan_loop<2>(shape, {rm, rm}).sizes, (Shape{120}));
  EXPECT_EQ(cpu::plan_loop<2>(shape, {rm, cl}).sizes, (Shape{2, 3, 20}));  // H, W still merge
}

TEST(MemoryFormat, ElementwiseResultsFollowTheirFirstFullShapedOperand) {
  const Tensor a = randn({2, 3, 4, 5}), b = randn({2, 3, 4, 5});
  const Tensor acl = a.contiguous(kCL), bcl = b.contiguous(kCL);
  const Tensor bias = randn({1, 3, 1, 1});
  struct Case {
    const char* name;
    Tensor got, want;
  };
  const std::vector<Case> cl_cases = {
      {"add", k::add(acl, bcl), k::add(a, b)},
      {"add, second contiguous", k::add(acl, b), k::add(a, b)},
      {"broadcast bias first", k::add(bias, acl), k::add(bias, a)},
      {"relu", k::relu(acl), k::relu(a)},
      {"mul_scalar", k::mul_scalar(acl, 3.0), k::mul_scalar(a, 3.0)},
      {"gt", k::gt(acl, bcl), k::gt(a, b)},
      {"relu_backward", k::relu_backward(bcl, acl), k::relu_backward(b, a)},
      {"to_dtype", k::to_dtype(acl, kFloat64), k::to_dtype(a, kFloat64)},
      {"to_dtype bf16", k::to_dtype(acl, kBFloat16), k::to_dtype(a, kBFloat16)},
  };
  for (const Case& c : cl_cases) {
    EXPECT_TRUE(channels_last(c.got)) << c.name;
    EXPECT_TRUE(same_values(c.got, c.want)) << c.name;
  }
  EXPECT_FALSE(channels_last(k::add(a, bcl)));  // the first operand decides
  EXPECT_FALSE(channels_last(k::clone(acl)));   // clone gives row-major, as documented
  // In place keeps self's layout and reads other through its strides.
  Tensor self = acl.contiguous(kCL);
  k::add_(self, b);
  EXPECT_TRUE(channels_last(self));
  EXPECT_TRUE(same_values(self, k::add(a, b)));
}

TEST(MemoryFormat, BatchNormKeepsChannelsLastWithTheSameNumbers) {
  const Tensor x = randn({3, 4, 5, 6}, kFloat64), dy = randn({3, 4, 5, 6}, kFloat64);
  const Tensor w = randn({4}, kFloat64), b = randn({4}, kFloat64);
  const Tensor xcl = x.contiguous(kCL), dycl = dy.contiguous(kCL);
  const double tol = 1e-12;

  const auto [y, stats] = k::batch_norm_forward_train(x, w, b, 1e-5);
  const auto [ycl, stats_cl] = k::batch_norm_forward_train(xcl, w, b, 1e-5);
  EXPECT_TRUE(channels_last(ycl));
  EXPECT_TRUE(tensors_close(ycl, y, tol));
  EXPECT_TRUE(tensors_close(stats_cl.mean, stats.mean, tol));
  EXPECT_TRUE(tensors_close(stats_cl.var, stats.var, tol));

  const Tensor elemt = k::batch_norm_elemt(xcl, stats.mean, stats.invstd, w, b);
  EXPECT_TRUE(channels_last(elemt));
  EXPECT_TRUE(tensors_close(elemt, y, tol));
  const k::BatchNormSums sums = k::batch_norm_sums(xcl), sums_ref = k::batch_norm_sums(x);
  EXPECT_TRUE(tensors_close(sums.sum, sums_ref.sum, tol));
  EXPECT_TRUE(tensors_close(sums.sum_sq, sums_ref.sum_sq, tol));
  EXPECT_TRUE(tensors_close(k::batch_norm_stats(xcl, 1e-5).var, stats.var, tol));

  for (bool training : {true, false}) {
    const k::NormGrads g =
        k::batch_norm_backward(dy, x, stats.mean, stats.invstd, w, training, {true, true, true});
    // dy contiguous while x is channels-last: dx still follows x.
    for (const Tensor& d : {dycl, dy}) {
      const k::NormGrads gcl =
          k::batch_norm_backward(d, xcl, stats.mean, stats.invstd, w, training, {true, true, true});
      EXPECT_TRUE(channels_last(gcl.dx)) << training;
      EXPECT_TRUE(tensors_close(gcl.dx, g.dx, tol)) << training;
      EXPECT_TRUE(tensors_close(gcl.dweight, g.dweight, tol)) << training;
      EXPECT_TRUE(tensors_close(gcl.dbias, g.dbias, tol)) << training;
    }
  }
  // SyncBatchNorm's pieces.
  const auto [sum_dy, sum_dy_xhat] =
      k::batch_norm_backward_reduce(dycl, xcl, stats.mean, stats.invstd);
  const auto [ref_dy, ref_dy_xhat] = k::batch_norm_backward_reduce(dy, x, stats.mean, stats.invstd);
  EXPECT_TRUE(tensors_close(sum_dy, ref_dy, tol));
  EXPECT_TRUE(tensors_close(sum_dy_xhat, ref_dy_xhat, tol));
  const Tensor dx = k::batch_norm_backward_elemt(dycl, xcl, stats.mean, stats.invstd, w, sum_dy,
                                                 sum_dy_xhat, stats.count);
  EXPECT_TRUE(channels_last(dx));
  EXPECT_TRUE(tensors_close(dx,
                            k::batch_norm_backward_elemt(dy, x, stats.mean, stats.invstd, w, ref_dy,
                                                         ref_dy_xhat, stats.count),
                            tol));
}

// Note [Batch norm over interleaved channels]: a channels-last x is summed in fixed blocks of
// rows (here two), so the bits do not depend on the number of threads.
TEST(MemoryFormat, BatchNormOfChannelsLastIsTheSameOnAnyNumberOfThreads) {
  const Tensor x = randn({8, 4, 40, 40}).contiguous(kCL), dy = randn({8, 4, 40, 40});
  const Tensor w = randn({4});
  const int threads = get_num_threads();
  std::vector<std::vector<Tensor>> runs;
  for (int n : {1, 2}) {
    set_num_threads(n);
    const auto [y, stats] = k::batch_norm_forward_train(x, w, Tensor(), 1e-5);
    const k::NormGrads g =
        k::batch_norm_backward(dy, x, stats.mean, stats.invstd, w, true, {true, true, true});
    runs.push_back({y, stats.mean, stats.var, g.dx, g.dweight, g.dbias});
  }
  set_num_threads(threads);
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(same_values(runs[0][i], runs[1][i])) << i;
  const auto [y, stats] = k::batch_norm_forward_train(x.contiguous(), w, Tensor(), 1e-5);
  EXPECT_TRUE(tensors_close(runs[0][0], y, 1e-5, 1e-5));
}

// Channels-last is convolved as it is (Note [conv2d in channels-last]), where the packed kernels
// run: the same values up to float32 rounding, the sums taken in another order.
TEST(MemoryFormat, ConvolutionOnTheCpuAnswersInItsInputsFormat) {
  const Tensor x = randn({2, 3, 7, 6}), w = randn({5, 3, 3, 3}), bias = randn({5});
  const k::Conv2dOptions opt{.stride = {2, 1}, .padding = {1, 1}};
  const Tensor out = k::conv2d(x, w, bias, opt);
  const Tensor out_cl = k::conv2d(x.contiguous(kCL), w, bias, opt);
  EXPECT_TRUE(channels_last(out_cl));
  EXPECT_FALSE(channels_last(out));
  EXPECT_TRUE(tensors_close(out_cl, out, 1e-5, 1e-5));
  const Tensor dout = randn(out.sizes());
  const k::Conv2dGrads g = k::conv2d_backward(dout, x, w, opt, {true, true, true});
  const k::Conv2dGrads gcl =
      k::conv2d_backward(dout.contiguous(kCL), x.contiguous(kCL), w, opt, {true, true, true});
  EXPECT_TRUE(channels_last(gcl.dx));
  EXPECT_TRUE(tensors_close(gcl.dx, g.dx, 1e-5, 1e-5));
  EXPECT_TRUE(tensors_close(gcl.dweight, g.dweight, 1e-5, 1e-5));
  EXPECT_TRUE(gcl.dweight.is_contiguous());
}

// The headline: a ResNet fed a channels-last batch computes what it computes from a contiguous
// one, and every stage's activation stays channels-last (no layer silently converts back).
TEST(MemoryFormat, ResNetStaysChannelsLastAndComputesTheSame) {
  manual_seed(3);
  auto model = nn::resnet18({.width = 4, .in_channels = 3, .num_classes = 5});
  model->to(kFloat64);
  const Tensor x = randn({2, 3, 12, 12}, kFloat64);
  const Tensor target = tensor<int64_t>({1, 4}, {2});

  auto run = [&](const Tensor& input) {
    model->zero_grad();
    const Tensor loss = cross_entropy(model->forward(input), target);
    loss.backward();
    std::vector<Tensor> grads;
    for (const auto& [name, p] : model->named_parameters()) grads.push_back(p.grad().clone());
    return std::pair{loss, grads};
  };
  const auto [loss, grads] = run(x);
  const auto [loss_cl, grads_cl] = run(x.contiguous(kCL));
  EXPECT_TRUE(tensors_close(loss_cl, loss, 1e-12));
  ASSERT_EQ(grads_cl.size(), grads.size());
  for (size_t i = 0; i < grads.size(); ++i)
    EXPECT_TRUE(tensors_close(grads_cl[i], grads[i], 1e-10));

  // Stage by stage, under no_grad.
  NoGradGuard no_grad;
  Tensor y = model->relu->forward(model->bn1->forward(model->conv1->forward(x.contiguous(kCL))));
  EXPECT_TRUE(channels_last(y)) << "stem";
  for (const auto& stage : {model->layer1, model->layer2, model->layer3, model->layer4}) {
    y = stage->forward(y);
    EXPECT_TRUE(channels_last(y)) << "stage of width " << y.size(1);
  }
}

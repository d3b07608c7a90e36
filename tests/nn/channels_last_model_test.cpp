// tests/nn/channels_last_model_test.cpp — a model whose weights are channels-last
// (Module::to(MemoryFormat::kChannelsLast)) trains as the same model stored row-major does: the
// conversion itself, the layout contract of the gradients, the optimizers updating in place
// (Note [Update layouts]), the loss scaler and the gradient norm on channels-last gradients,
// and checkpoints, which hold row-major bytes whatever the layout.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/checkpoint.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "scratch_dir.h"
#include "tensor/conv.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/storage.h"
#include "test_util.h"

using namespace loom;
using loom::test::tensors_close;

namespace {

constexpr MemoryFormat kCL = MemoryFormat::kChannelsLast;
constexpr MemoryFormat kNCHW = MemoryFormat::kContiguous;

bool exactly_channels_last(const Tensor& t) {
  return t.strides() == format_strides(t.sizes(), kCL);
}

std::shared_ptr<nn::ResNet> small_resnet(uint64_t seed) {
  manual_seed(seed);
  auto model = nn::resnet18({.width = 4, .in_channels = 3, .num_classes = 5});
  model->to(kFloat64);
  return model;
}

// One forward and backward of `model` on a fixed batch in `format`.
void forward_backward(nn::Module& model, MemoryFormat format) {
  manual_seed(11);
  const Tensor x = randn({2, 3, 12, 12}, kFloat64).contiguous(format);
  const Tensor target = tensor<int64_t>({1, 4}, {2});
  cross_entropy(model.forward(x), target).backward();
}

void expect_same_parameters(nn::Module& a, nn::Module& b, double tol) {
  const NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(tensors_close(pa[i].second, pb[i].second, tol, tol)) << pa[i].first;
}

}  // namespace

TEST(ChannelsLastModel, ToConvertsEveryFourDimensionalTensorAndNothingElse) {
  auto model = small_resnet(1);
  auto reference = small_resnet(1);
  forward_backward(*model, kNCHW);      // gradients exist before the conversion
  forward_backward(*reference, kNCHW);  // the same running statistics
  const auto conv1 = std::dynamic_pointer_cast<nn::Conv2d>(model->named_children()[0].second);
  ASSERT_NE(conv1, nullptr);
  model->to(kCL);

  int four_d = 0;
  const NamedTensors after = model->state_dict(), before = reference->state_dict();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    const auto& [name, t] = after[i];
    EXPECT_EQ(name, before[i].first);
    EXPECT_TRUE(tensors_close(t, before[i].second, 0, 0)) << name;  // the same values
    if (t.dim() == 4) {
      ++four_d;
      EXPECT_TRUE(exactly_channels_last(t)) << name;
    } else {
      EXPECT_TRUE(t.is_contiguous()) << name;
    }
  }
  EXPECT_EQ(four_d, 20);  // ResNet-18's convolutions: the stem, 16 in the blocks, 3 shortcuts
  for (const auto& [name, p] : model->named_parameters())
    if (p.dim() == 4) {
      EXPECT_TRUE(exactly_channels_last(p.grad())) << name;
    }
  // The layer's own member is the registered tensor: it sees the new layout.
  EXPECT_TRUE(exactly_channels_last(conv1->weight));

  // A later dtype conversion keeps the layout, as PyTorch's to(dtype) preserves the format.
  model->to(kFloat32);
  EXPECT_TRUE(exactly_channels_last(conv1->weight));
  EXPECT_EQ(conv1->weight.dtype(), kFloat32);

  model->to(kNCHW);
  for (const auto& [name, t] : model->state_dict()) EXPECT_TRUE(t.is_contiguous()) << name;
}

// PyTorch's layout contract: a channels-last weight gets a channels-last gradient, on the CPU
// (whose convolutions compute in NCHW) as on cuDNN; and the numbers are those of the row-major
// model.
TEST(ChannelsLastModel, GradientsFollowTheWeightsLayoutAndMatchTheRowMajorModel) {
  auto model = small_resnet(2);
  auto reference = small_resnet(2);
  model->to(kCL);
  for (MemoryFormat input : {kNCHW, kCL}) {
    model->zero_grad();
    reference->zero_grad();
    forward_backward(*model, input);
    forward_backward(*reference, input);
    const NamedTensors p = model->named_parameters(), q = reference->named_parameters();
    for (size_t i = 0; i < p.size(); ++i) {
      const Tensor g = p[i].second.grad();
      EXPECT_TRUE(tensors_close(g, q[i].second.grad(), 1e-12, 1e-12)) << p[i].first;
      if (g.dim() == 4) {
        EXPECT_TRUE(g.is_contiguous(kCL)) << p[i].first;
      }
    }
  }
  const Tensor w = randn({4, 3, 3, 3}, kFloat64).contiguous(kCL);
  const kernels::Conv2dGrads grads =
      kernels::conv2d_backward(randn({1, 4, 5, 5}, kFloat64), randn({1, 3, 5, 5}, kFloat64), w,
                               {.padding = {1, 1}}, {true, true, false});
  EXPECT_TRUE(grads.dx.is_contiguous());
  EXPECT_TRUE(exactly_channels_last(grads.dweight));
}

// The optimizers update a dense parameter where it lies, whatever its order, with the
// arithmetic of the row-major one (element by element: the same bits), and keep their state
// in the parameter's order.
TEST(ChannelsLastModel, OptimizersUpdateInPlaceWithTheSameBits) {
  auto check = [](auto make, const std::vector<std::string>& buffer_names) {
    manual_seed(5);
    const Tensor start = randn({6, 4, 3, 3}, kFloat64);
    Tensor rm = start.clone().requires_grad_();
    Tensor cl = start.contiguous(kCL).requires_grad_();
    ASSERT_TRUE(exactly_channels_last(cl));
    const void* storage = cl.data();
    auto opt_rm = make(std::vector<Tensor>{rm});
    auto opt_cl = make(std::vector<Tensor>{cl});
    for (int step = 0; step < 4; ++step) {
      const Tensor g = randn({6, 4, 3, 3}, kFloat64);
      rm.set_grad(g);
      // Steps 0 and 2 give the channels-last parameter a channels-last gradient, the others a
      // row-major one, which the update brings to the parameter's order.
      cl.set_grad(step % 2 == 0 ? g.contiguous(kCL) : g.clone());
      opt_rm->step();
      // With its state made and a gradient in its order, a step allocates nothing of the
      // parameter's size: no copy of the parameter, its gradient or its buffers.
      reset_peak_memory(kCPU);
      const int64_t held = memory_stats(kCPU).current_bytes;
      opt_cl->step();
      if (step == 2) {
        EXPECT_LT(memory_stats(kCPU).peak_bytes - held, cl.nbytes());
      }
    }
    EXPECT_EQ(cl.data(), storage);  // updated where it lies
    EXPECT_TRUE(exactly_channels_last(cl));
    EXPECT_TRUE(tensors_close(cl, rm, 0, 0));
    NamedTensors state;
    optim::Metadata meta;
    opt_cl->save_state(state, meta, "");
    int buffers = 0;
    for (const auto& [name, t] : state)
      for (const std::string& b : buffer_names)
        if (name == "state.0." + b) {
          ++buffers;
          EXPECT_TRUE(t.is_contiguous(kCL)) << name;
        }
    EXPECT_EQ(buffers, static_cast<int>(buffer_names.size()));
  };
  check(
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::SGD>(
            std::move(p),
            optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true});
      },
      {"momentum_buffer"});
  check(
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::Adam>(
            std::move(p), optim::AdamOptions{.lr = 0.01, .weight_decay = 1e-2, .amsgrad = true});
      },
      {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
  check(
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions{.lr = 0.01});
      },
      {"exp_avg", "exp_avg_sq"});
}

// A model converted after its optimizer took steps: the kept buffers follow the parameter's new
// order (converted once), and the trajectory is unchanged.
TEST(ChannelsLastModel, ConvertingAfterStepsKeepsTheTrajectory) {
  auto model = small_resnet(3);
  auto reference = small_resnet(3);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
  for (int step = 0; step < 4; ++step) {
    if (step == 2) model->to(kCL);
    for (auto [m, o] : {std::pair{model.get(), &opt}, std::pair{reference.get(), &ref_opt}}) {
      o->zero_grad();
      forward_backward(*m, kNCHW);
      o->step();
    }
  }
  expect_same_parameters(*model, *reference, 1e-12);
  NamedTensors state;
  optim::Metadata meta;
  opt.save_state(state, meta, "");
  for (const auto& [name, t] : state)
    if (t.dim() == 4) {
      EXPECT_TRUE(t.is_contiguous(kCL)) << name;
    }
}

// A checkpoint of a channels-last model holds row-major bytes (what PyTorch reads), and it
// loads into a model of either layout, which then goes on as the model that wrote it.
TEST(ChannelsLastModel, CheckpointsAreRowMajorAndLoadIntoEitherLayout) {
  const test::ScratchDir dir;  // Note [Test scratch directories]
  const std::string path = dir.file("checkpoint.safetensors");
  auto model = small_resnet(4);
  model->to(kCL);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    forward_backward(*model, kCL);
    opt.step();
  }
  optim::save_checkpoint(path, *model, opt, nullptr, {.step = 2});
  const SafetensorsFile file = load_safetensors(path);
  for (const auto& [name, t] : model->state_dict()) {
    ASSERT_TRUE(file.contains(name)) << name;
    EXPECT_TRUE(tensors_close(file.at(name), t, 0, 0)) << name;  // logical order on disk
  }

  for (MemoryFormat format : {kNCHW, kCL}) {
    auto loaded = small_resnet(99);
    loaded->to(format);
    optim::SGD loaded_opt(loaded->parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::load_checkpoint(path, *loaded, &loaded_opt);
    for (const auto& [name, p] : loaded->named_parameters())
      if (p.dim() == 4) {
        EXPECT_EQ(suggest_memory_format(p), format) << name;
      }
    auto next = [](nn::Module& m, optim::SGD& o) {
      o.zero_grad();
      forward_backward(m, kCL);
      o.step();
    };
    auto original = small_resnet(99);
    original->to(kCL);
    optim::SGD original_opt(original->parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::load_checkpoint(path, *original, &original_opt);
    next(*loaded, loaded_opt);
    next(*original, original_opt);
    expect_same_parameters(*loaded, *original, 1e-12);
  }
}

// GradScaler unscales a channels-last gradient where it lies, and clip_grad_norm_ reads it as it
// lies: the results of the row-major gradients.
TEST(ChannelsLastModel, ScalerAndGradientNormTakeChannelsLastGradients) {
  manual_seed(6);
  const Tensor g = randn({5, 3, 2, 2}, kFloat32);
  Tensor rm = randn({5, 3, 2, 2}, kFloat32).requires_grad_();
  Tensor cl = rm.detach().contiguous(kCL).requires_grad_();
  rm.set_grad(g.clone());
  cl.set_grad(g.contiguous(kCL));
  const void* grad_storage = cl.grad().data();

  optim::SGD opt_rm({rm}, {.lr = 0.1}), opt_cl({cl}, {.lr = 0.1});
  optim::GradScaler scaler_rm({.init_scale = 8}), scaler_cl({.init_scale = 8});
  scaler_rm.unscale_(opt_rm);
  reset_peak_memory(kCPU);
  const int64_t held = memory_stats(kCPU).current_bytes;
  scaler_cl.unscale_(opt_cl);
  EXPECT_LT(memory_stats(kCPU).peak_bytes - held, cl.grad().nbytes());  // no copy
  EXPECT_EQ(cl.grad().data(), grad_storage);
  EXPECT_TRUE(exactly_channels_last(cl.grad()));
  EXPECT_TRUE(tensors_close(cl.grad(), rm.grad(), 0, 0));
  EXPECT_TRUE(tensors_close(cl.grad(), kernels::mul_scalar(g, 0.125), 0, 0));

  for (double norm_type : {1.0, 2.0, 3.0, double(INFINITY)}) {
    const double a = optim::clip_grad_norm_({rm}, 1e9, norm_type);
    const double b = optim::clip_grad_norm_({cl}, 1e9, norm_type);
    EXPECT_NEAR(a, b, 1e-6 * a) << norm_type;
  }
  for (auto [scaler, opt] : {std::pair{&scaler_rm, &opt_rm}, std::pair{&scaler_cl, &opt_cl}}) {
    scaler->step(*opt);
    scaler->update();
  }
  EXPECT_TRUE(tensors_close(cl, rm, 0, 0));

  // An inf in a channels-last gradient is found, and the step skipped.
  cl.grad().select(0, 2).select(0, 1).select(0, 1).select(0, 0).fill_(INFINITY);
  EXPECT_TRUE(exactly_channels_last(cl.grad()));
  const Tensor before = cl.detach().clone();
  scaler_cl.step(opt_cl);
  scaler_cl.update();
  EXPECT_TRUE(tensors_close(cl, before, 0, 0));
  EXPECT_EQ(scaler_cl.get_scale(), 4.0);
}

TEST(ChannelsLastModel, DenseLikeCopiesOnlyWhenTheOrderDiffers) {
  const Tensor rm = randn({2, 3, 4, 5});
  const Tensor cl = rm.contiguous(kCL);
  EXPECT_TRUE(kernels::is_dense(rm));
  EXPECT_TRUE(kernels::is_dense(cl));
  EXPECT_FALSE(kernels::is_dense(rm.transpose(2, 3)));
  EXPECT_FALSE(kernels::is_dense(rm.narrow(3, 0, 2)));
  EXPECT_TRUE(kernels::dense_like(cl, cl).is_same(cl));
  EXPECT_TRUE(kernels::dense_like(rm, rm).is_same(rm));
  const Tensor to_cl = kernels::dense_like(rm, cl);
  EXPECT_TRUE(exactly_channels_last(to_cl));
  EXPECT_TRUE(tensors_close(to_cl, rm, 0, 0));
  const Tensor to_rm = kernels::dense_like(cl, rm);
  EXPECT_TRUE(to_rm.is_contiguous());
  EXPECT_TRUE(tensors_close(to_rm, rm, 0, 0));
  // A 1x1 kernel's two orders are the same bytes: no copy either way.
  const Tensor one = randn({4, 3, 1, 1});
  EXPECT_TRUE(kernels::dense_like(one, one.contiguous(kCL)).is_same(one));
  EXPECT_LOOM_ERROR(kernels::dense_like(rm, randn({2, 3, 4, 6}).contiguous(kCL)), ShapeError,
                    {"dense_like", "[2, 3, 4, 5]", "[2, 3, 4, 6]"});
}

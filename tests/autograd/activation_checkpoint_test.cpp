// tests/autograd/activation_checkpoint_test.cpp — Note [Activation checkpointing]: a checkpointed segment
// gives the same outputs and gradients, to the bit, as the plain one (dropout masks included,
// under autocast too), a GPT with gradient checkpointing gives the same loss and gradients with a
// lower activation peak, callbacks queued during the recomputation run at the end of the whole
// backward, and the parameters inside a segment get gradients when no input requires grad.
#include "autograd/checkpoint.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom.h"
#include "nn/gpt.h"
#include "test_util.h"

using namespace loom;

namespace {

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const Tensor x = a.to(kFloat64), y = b.to(kFloat64);
  EXPECT_EQ(x.to_vector<double>(), y.to_vector<double>()) << what;
}

// Two linear layers with a GELU and a dropout between them, and a residual: the input's gradient
// is the sum of two parts, as in a Transformer block.
struct Segment {
  std::shared_ptr<nn::Linear> fc1 = nn::make<nn::Linear>(6, 12);
  std::shared_ptr<nn::Linear> fc2 = nn::make<nn::Linear>(12, 6);
  std::shared_ptr<nn::Dropout> drop = nn::make<nn::Dropout>(0.5);
  Tensor operator()(const Tensor& x) const {
    return x + fc2->forward(drop->forward(gelu(fc1->forward(x))));
  }
  std::vector<Tensor> params() const { return {fc1->weight, fc1->bias, fc2->weight, fc2->bias}; }
};

struct Result {
  Tensor out, dx;
  std::vector<Tensor> dparams;
};

Result run(const Segment& segment, bool checkpointed, bool x_requires_grad) {
  for (Tensor p : segment.params()) p.set_grad(Tensor());
  manual_seed(11);
  Tensor x = randn({4, 6});
  if (x_requires_grad) x.requires_grad_();
  manual_seed(12);  // the dropout masks come from here
  Tensor y = checkpointed ? checkpoint([&segment](const Tensor& in) { return segment(in); }, x)
                          : segment(x);
  Tensor loss = sum(y * y);
  loss.backward();
  Result r{y.detach(), x_requires_grad ? x.grad() : Tensor(), {}};
  for (const Tensor& p : segment.params()) r.dparams.push_back(p.grad().clone());
  return r;
}

TEST(Checkpoint, SameOutputsAndGradientsToTheBitWithDropout) {
  manual_seed(1);
  Segment segment;
  const Result plain = run(segment, false, true);
  const Result recomputed = run(segment, true, true);
  expect_bitwise_equal(plain.out, recomputed.out, "output");
  expect_bitwise_equal(plain.dx, recomputed.dx, "dx");
  for (size_t i = 0; i < plain.dparams.size(); ++i)
    expect_bitwise_equal(plain.dparams[i], recomputed.dparams[i], "param " + std::to_string(i));
  // The dropout really dropped something (else equal masks would prove nothing).
  segment.drop->eval();
  manual_seed(11);
  const Tensor x = randn({4, 6});
  EXPECT_NE(segment(x).to_vector<float>(), plain.out.to_vector<float>());
}

TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  manual_seed(1);
  Segment segment;
  const Result plain = run(segment, false, false);
  const Result recomputed = run(segment, true, false);
  for (size_t i = 0; i < plain.dparams.size(); ++i)
    expect_bitwise_equal(plain.dparams[i], recomputed.dparams[i], "param " + std::to_string(i));
}

TEST(Checkpoint, UnderAutocastTheRecomputationCastsAlike) {
  manual_seed(1);
  Segment segment;
  Result results[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    for (Tensor p : segment.params()) p.set_grad(Tensor());
    manual_seed(11);
    Tensor x = randn({4, 6}).requires_grad_();
    Tensor loss;
    {
      autocast::Guard bf16(kBFloat16);
      manual_seed(12);
      Tensor y = checkpointed ? checkpoint([&segment](const Tensor& in) { return segment(in); }, x)
                              : segment(x);
      loss = sum(y.to(kFloat32) * y.to(kFloat32));
    }
    loss.backward();
    results[checkpointed].dx = x.grad();
    for (const Tensor& p : segment.params())
      results[checkpointed].dparams.push_back(p.grad().clone());
  }
  expect_bitwise_equal(results[0].dx, results[1].dx, "dx");
  for (size_t i = 0; i < results[0].dparams.size(); ++i)
    expect_bitwise_equal(results[0].dparams[i], results[1].dparams[i],
                         "param " + std::to_string(i));
}

TEST(Checkpoint, OutsideGradModeItIsJustTheSegment) {
  manual_seed(1);
  Segment segment;
  segment.drop->eval();
  Tensor x = randn({4, 6}).requires_grad_();
  NoGradGuard no_grad;
  Tensor y = checkpoint([&segment](const Tensor& in) { return segment(in); }, x);
  EXPECT_FALSE(y.requires_grad());
  expect_bitwise_equal(y, segment(x), "output");
}

// A hook inside the segment that queues an end-of-backward callback (what DDP's reducer does)
// must see it run after the layer before the segment got its gradient, not when the nested
// backward of the recomputation ends.
TEST(Checkpoint, CallbacksQueuedDuringTheRecomputationRunAtTheEndOfTheWholeBackward) {
  manual_seed(1);
  Segment segment;
  segment.drop->eval();
  auto first = nn::make<nn::Linear>(6, 6);
  std::vector<std::string> events;
  segment.fc1->weight.register_post_accumulate_grad_hook([&](const Tensor&) {
    events.push_back("fc1 hook");
    autograd::queue_callback([&] { events.push_back("callback"); });
  });
  first->weight.register_post_accumulate_grad_hook(
      [&](const Tensor&) { events.push_back("first hook"); });
  Tensor x = randn({4, 6});
  Tensor y = checkpoint([&segment](const Tensor& in) { return segment(in); }, first->forward(x));
  sum(y).backward();
  EXPECT_EQ(events, (std::vector<std::string>{"fc1 hook", "first hook", "callback"}));
}

nn::GPTConfig small_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 50;
  c.block_size = 32;
  c.n_embd = 48;
  c.n_layer = 4;
  c.n_head = 4;
  c.dropout = 0.1;
  return c;
}

struct GPTRun {
  float loss = 0;
  std::vector<Tensor> grads;
  int64_t peak_above_start = 0;
};

GPTRun gpt_step(nn::GPT& model, bool checkpointing, const Tensor& idx, const Tensor& targets) {
  model.set_gradient_checkpointing(checkpointing);
  model.zero_grad();
  manual_seed(21);  // dropout
  const int64_t start = memory_stats(kCPU).current_bytes;
  reset_peak_memory(kCPU);
  Tensor loss = model.loss(idx, targets);
  loss.backward();
  GPTRun r;
  r.peak_above_start = memory_stats(kCPU).peak_bytes - start;
  r.loss = loss.item<float>();
  for (const Tensor& p : model.parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

TEST(Checkpoint, AGPTWithGradientCheckpointingHasTheSameGradientsAndALowerActivationPeak) {
  manual_seed(3);
  nn::GPT model(small_gpt());
  manual_seed(4);
  Tensor idx = randint(0, 50, {4, 32});
  Tensor targets = randint(0, 50, {4, 32});
  const GPTRun plain = gpt_step(model, false, idx, targets);
  const GPTRun recomputed = gpt_step(model, true, idx, targets);
  EXPECT_EQ(plain.loss, recomputed.loss);
  ASSERT_EQ(plain.grads.size(), recomputed.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i)
    expect_bitwise_equal(plain.grads[i], recomputed.grads[i], "gradient " + std::to_string(i));
  // Four blocks' activations against one block's and the block inputs: well under 3/4.
  EXPECT_LT(recomputed.peak_above_start, plain.peak_above_start * 3 / 4)
      << "plain " << plain.peak_above_start << " B, checkpointed " << recomputed.peak_above_start
      << " B";
}

}  // namespace

// autograd/checkpoint.cpp — Note [Activation checkpointing] (checkpoint.h): the forward under
// no-grad, and the backward that recomputes the segment and runs a nested backward through it.
#include "autograd/checkpoint.h"

#include <optional>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "tensor/random.h"

namespace loom::autograd {

namespace {

// While it lives, the default generator is at `state`; then back where it was.
class GeneratorStateScope {
 public:
  explicit GeneratorStateScope(Generator::State state) : saved_(default_generator().state()) {
    default_generator().set_state(state);
  }
  ~GeneratorStateScope() { default_generator().set_state(saved_); }
  GeneratorStateScope(const GeneratorStateScope&) = delete;
  GeneratorStateScope& operator=(const GeneratorStateScope&) = delete;

 private:
  Generator::State saved_;
};

}  // namespace

std::vector<Tensor> checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs) {
  LOOM_CHECK(static_cast<bool>(fn), ValueError, "checkpoint: the segment function is empty");
  for (size_t i = 0; i < inputs.size(); ++i)
    LOOM_CHECK(inputs[i].defined(), ValueError, "checkpoint: input ", i, " is undefined");
  if (!grad_enabled()) return fn(inputs);

  const Generator::State rng_state = default_generator().state();
  const bool autocast_on = autocast::is_enabled();
  const DType autocast_dtype = autocast::dtype();
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;  // step 1: nothing inside the segment is kept
    outs = fn(inputs);
  }
  for (size_t k = 0; k < outs.size(); ++k)
    LOOM_CHECK(outs[k].defined(), ValueError, "checkpoint: output ", k,
               " of the segment is undefined");

  std::vector<Tensor> node_inputs = inputs;
  if (!any_requires_grad(inputs)) node_inputs.push_back(zeros({0}).requires_grad_(true));
  const size_t n_inputs = inputs.size();
  return record_multi(
      "checkpoint", std::move(outs), node_inputs, /*save=*/inputs,
      [fn, rng_state, autocast_on, autocast_dtype, n_inputs](const Grads& dout, Saved& saved,
                                                             Grads& dinputs) {
        // Step 2: the same segment again, on fresh leaves holding the saved inputs.
        std::vector<Tensor> leaves;
        for (size_t i = 0; i < n_inputs; ++i) {
          Tensor leaf = saved[i].detach();
          if (saved.needs_grad(i)) leaf.requires_grad_(true);
          leaves.push_back(leaf);
        }
        std::vector<Tensor> recomputed;
        {
          EnableGradGuard grad_on;
          GeneratorStateScope same_masks(rng_state);
          autocast::Guard same_region(autocast_dtype, autocast_on);
          recomputed = fn(leaves);
        }
        LOOM_CHECK(recomputed.size() == dout.size(), AutogradError, "checkpoint: the segment gave ",
                   dout.size(), " outputs in forward but ", recomputed.size(),
                   " when recomputed; it must be deterministic");
        std::vector<Tensor> roots, seeds;
        for (size_t k = 0; k < recomputed.size(); ++k) {
          if (!recomputed[k].requires_grad() || !dout[k].defined()) continue;
          LOOM_CHECK(recomputed[k].sizes() == dout[k].sizes(), AutogradError, "checkpoint: output ",
                     k, " was ", dout[k].sizes(), " in forward but ", recomputed[k].sizes(),
                     " when recomputed; the segment must be deterministic");
          roots.push_back(recomputed[k]);
          seeds.push_back(dout[k]);
        }
        if (!roots.empty()) backward(roots, seeds, /*retain_graph=*/false);
        for (size_t i = 0; i < n_inputs; ++i)
          if (saved.needs_grad(i)) dinputs[i] = leaves[i].grad();
      });
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  LOOM_CHECK(static_cast<bool>(fn), ValueError, "checkpoint: the segment function is empty");
  // fn by value: the node keeps the segment for the recomputation, after this call returned.
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    std::vector<Tensor>{input})[0];
}

}  // namespace loom::autograd

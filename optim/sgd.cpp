// optim/sgd.cpp — SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD:
// the state and the checkpoint here, the fused update in tensor/optim.h.

#include "optim/sgd.h"

#include <cmath>

#include "autograd/graph.h"
#include "tensor/optim.h"

namespace loom::optim {

namespace k = loom::kernels;

namespace {

void validate(const SGDOptions& o) {
  LOOM_CHECK(std::isfinite(o.lr) && o.lr >= 0, ValueError,
             "SGD: invalid learning rate (expected a finite lr >= 0); got lr=", o.lr);
  LOOM_CHECK(std::isfinite(o.momentum) && o.momentum >= 0, ValueError,
             "SGD: invalid momentum (expected >= 0); got momentum=", o.momentum);
  LOOM_CHECK(std::isfinite(o.dampening), ValueError,
             "SGD: invalid dampening (expected a finite value); got dampening=", o.dampening);
  LOOM_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, ValueError,
             "SGD: invalid weight_decay (expected >= 0); got weight_decay=", o.weight_decay);
  LOOM_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), ValueError,
             "SGD: Nesterov momentum requires momentum > 0 and dampening == 0; got momentum=",
             o.momentum, " dampening=", o.dampening);
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer("SGD", std::move(params), options.lr), options_(options) {
  validate(options_);
}

void SGD::set_momentum(double momentum) {
  LOOM_CHECK(momentum >= 0 && momentum <= 1, ValueError,
             "SGD: set_momentum expects a momentum in [0, 1]; got ", momentum);
  options_.momentum = momentum;
}

SGDOptions SGD::options() const {
  SGDOptions o = options_;
  o.lr = lr();
  return o;
}

std::vector<std::string> SGD::buffer_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

Metadata SGD::hyper_parameters() const {
  return {{"momentum", format_double(options_.momentum)},
          {"dampening", format_double(options_.dampening)},
          {"weight_decay", format_double(options_.weight_decay)},
          {"nesterov", options_.nesterov ? "true" : "false"}};
}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  // The parameters are updated together after the loop: one list per device and dtype (on CUDA
  // a few launches for all of them).
  std::vector<k::SgdTensors> updates;
  std::vector<std::pair<size_t, Tensor>> to_finish;
  const std::vector<Tensor> grads = update_grads();
  for (size_t i = 0; i < params().size(); ++i) {
    const Tensor& grad = grads[i];
    if (!grad.defined()) continue;  // no gradient this step: skipped, as PyTorch does
    const bool first = !state_[i].initialized;
    ParamState& state = state_for(i);
    ++state.steps;
    const Tensor target = update_target(i);
    const Tensor buffer = state.buffers.empty() ? Tensor() : state.buffers[0];
    updates.push_back({target, grad, buffer, first});
    to_finish.emplace_back(i, target);
  }
  const k::SgdStep s{lr(), options_.weight_decay, options_.momentum, options_.dampening,
                     options_.nesterov};
  for_each_group(
      updates, [](const k::SgdTensors& e) { return device_and_dtype(e.param); },
      [&](std::span<const k::SgdTensors> list) { k::sgd_update(list, s); });
  for (const auto& [i, target] : to_finish) finish_update(i, target);
}

void SGD::load_state(const SafetensorsFile& file, const std::string& prefix) {
  check_kind(file, prefix);
  SGDOptions o;
  o.lr = read_double(file, prefix, "lr");
  o.momentum = read_double(file, prefix, "momentum");
  o.dampening = read_double(file, prefix, "dampening");
  o.weight_decay = read_double(file, prefix, "weight_decay");
  o.nesterov = read_bool(file, prefix, "nesterov");
  validate(o);
  std::vector<ParamState> state = read_state(
      file, prefix,
      o.momentum == 0 ? std::vector<std::string>{} : std::vector<std::string>{"momentum_buffer"});
  options_ = o;
  commit_state(std::move(state), o.lr);
}

}  // namespace loom::optim

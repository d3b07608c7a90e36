// optim/sgd.cpp — SGD's fused update: one pass over each parameter, its gradient and its
// momentum buffer; threads split the elements of a parameter into contiguous chunks.

#include "optim/sgd.h"

#include <cmath>

#include "autograd/graph.h"
#include "tensor/cuda/optim.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"

namespace loom::optim {

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

// One parameter's update; `first`: its momentum buffer takes the first direction as it is.
template <typename T>
void sgd_update(T* param, const T* grad, T* buffer, int64_t n, const SGDOptions& o, double lr,
                bool first) {
  const T weight_decay = static_cast<T>(o.weight_decay), momentum = static_cast<T>(o.momentum);
  const T keep = static_cast<T>(1.0 - o.dampening), neg_lr = static_cast<T>(-lr);
  const bool decay = o.weight_decay != 0, nesterov = o.nesterov;
  parallel_for(0, n, kUpdateGrain, [&](int64_t lo, int64_t hi) {
    if (!buffer) {  // plain SGD
      for (int64_t j = lo; j < hi; ++j) {
        const T d = decay ? grad[j] + weight_decay * param[j] : grad[j];
        param[j] = param[j] + neg_lr * d;
      }
      return;
    }
    for (int64_t j = lo; j < hi; ++j) {
      T d = decay ? grad[j] + weight_decay * param[j] : grad[j];
      const T buf = first ? d : buffer[j] * momentum + keep * d;
      buffer[j] = buf;
      d = nesterov ? d + momentum * buf : buf;
      param[j] = param[j] + neg_lr * d;
    }
  });
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
  // CUDA parameters are updated together after the loop, a few launches for all of them.
  std::vector<cuda::SgdTensors> on_gpu;
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
    if (target.is_cuda()) {
      on_gpu.push_back({target, grad, buffer, first});
      to_finish.emplace_back(i, target);
      continue;
    }
    dispatch_floating(target.dtype(), "SGD", [&]<typename T>() {
      sgd_update<T>(target.data_ptr<T>(), grad.data_ptr<T>(),
                    buffer.defined() ? buffer.data_ptr<T>() : nullptr, target.numel(), options_,
                    lr(), first);
    });
    finish_update(i, target);
  }
  const cuda::SgdStep s{lr(), options_.weight_decay, options_.momentum, options_.dampening,
                        options_.nesterov};
  for_each_group(
      on_gpu, [](const cuda::SgdTensors& e) { return device_and_dtype(e.param); },
      [&](std::span<const cuda::SgdTensors> list) { cuda::sgd_update(list, s); });
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

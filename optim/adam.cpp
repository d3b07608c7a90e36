// optim/adam.cpp — Adam and AdamW (amsgrad, L2 or decoupled weight decay), as torch.optim's: the
// state, the checkpoint and the scalar factors of each step (bias corrections, step size, in
// double, as PyTorch computes them in Python); the fused update is tensor/optim.h's.

#include "optim/adam.h"

#include <cmath>
#include <tuple>

#include "autograd/graph.h"
#include "tensor/optim.h"

namespace loom::optim {

namespace k = loom::kernels;

namespace {

void validate(const std::string& name, const AdamOptions& o) {
  LOOM_CHECK(std::isfinite(o.lr) && o.lr >= 0, ValueError, name,
             ": invalid learning rate (expected a finite lr >= 0); got lr=", o.lr);
  LOOM_CHECK(o.beta1 >= 0 && o.beta1 < 1, ValueError, name,
             ": invalid beta1 (expected 0 <= beta1 < 1); got beta1=", o.beta1);
  LOOM_CHECK(o.beta2 >= 0 && o.beta2 < 1, ValueError, name,
             ": invalid beta2 (expected 0 <= beta2 < 1); got beta2=", o.beta2);
  LOOM_CHECK(std::isfinite(o.eps) && o.eps >= 0, ValueError, name,
             ": invalid eps (expected >= 0); got eps=", o.eps);
  LOOM_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, ValueError, name,
             ": invalid weight_decay (expected >= 0); got weight_decay=", o.weight_decay);
}

std::vector<std::string> adam_buffers(bool amsgrad) {
  if (amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

struct AdamScalars {
  double decay_factor;  // AdamW: 1 - lr * wd
  double l2;            // Adam: wd (0 for AdamW)
  double step_size;     // lr / (1 - beta1^t)
  double bias_correction2_sqrt;
};

// The factors of step t (1 for the first), for parameters with weight decay or without.
AdamScalars scalars_at(const AdamOptions& o, double lr, bool decoupled, int64_t t, bool decays) {
  const double step = static_cast<double>(t);
  const double weight_decay = decays ? o.weight_decay : 0.0;
  AdamScalars s;
  s.decay_factor = 1.0 - lr * weight_decay;
  s.l2 = decoupled ? 0.0 : weight_decay;
  s.step_size = lr / (1.0 - std::pow(o.beta1, step));
  s.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, step));
  return s;
}

}  // namespace

AdamBase::AdamBase(std::string name, std::vector<Tensor> params, AdamOptions options,
                   bool decoupled)
    : Optimizer(std::move(name), std::move(params), options.lr),
      options_(options),
      decoupled_(decoupled) {
  validate(this->name(), options_);
  LOOM_CHECK(options_.decay.empty() || options_.decay.size() == this->params().size(), ValueError,
             this->name(), ": decay names ", options_.decay.size(), " parameters; there are ",
             this->params().size());
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : AdamBase("Adam", std::move(params), options, /*decoupled=*/false) {}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : AdamBase("AdamW", std::move(params),
               AdamOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad, o.decay},
               /*decoupled=*/true) {}

void AdamBase::set_momentum(double beta1) {
  LOOM_CHECK(beta1 >= 0 && beta1 < 1, ValueError, name(),
             ": set_momentum expects beta1 in [0, 1); got ", beta1);
  options_.beta1 = beta1;
}

AdamOptions AdamBase::options() const {
  AdamOptions o = options_;
  o.lr = lr();
  return o;
}

std::vector<std::string> AdamBase::buffer_names() const { return adam_buffers(options_.amsgrad); }

Metadata AdamBase::hyper_parameters() const {
  Metadata m{{"beta1", format_double(options_.beta1)},
             {"beta2", format_double(options_.beta2)},
             {"eps", format_double(options_.eps)},
             {"weight_decay", format_double(options_.weight_decay)},
             {"amsgrad", options_.amsgrad ? "true" : "false"}};
  // One character a parameter, 1 where weight decay applies.
  if (!options_.decay.empty()) {
    std::string decay;
    for (bool d : options_.decay) decay.push_back(d ? '1' : '0');
    m["decay"] = decay;
  }
  return m;
}

void AdamBase::step() {
  autograd::NoGradGuard no_grad;
  // The parameters are updated together after the loop: one list per device, dtype and step
  // count (the bias corrections depend on the step; on CUDA a few launches for all of them).
  using Entry = std::tuple<int64_t, bool, k::AdamTensors>;  // (step, decays, tensors)
  std::vector<Entry> updates;
  std::vector<std::pair<size_t, Tensor>> to_finish;
  const std::vector<Tensor> grads = update_grads();
  for (size_t i = 0; i < params().size(); ++i) {
    const Tensor& grad = grads[i];
    if (!grad.defined()) continue;  // no gradient this step: skipped, as PyTorch does
    ParamState& state = state_for(i);
    const int64_t t = ++state.steps;
    const Tensor target = update_target(i);
    const bool decays = options_.decay.empty() || options_.decay[i];
    updates.push_back({t,
                       decays,
                       {target, grad, state.buffers[0], state.buffers[1],
                        options_.amsgrad ? state.buffers[2] : Tensor()}});
    to_finish.emplace_back(i, target);
  }
  for_each_group(
      updates,
      [](const Entry& e) {
        return std::tuple_cat(device_and_dtype(std::get<2>(e).param),
                              std::make_tuple(std::get<0>(e), std::get<1>(e)));
      },
      [&](std::span<const Entry> group) {
        std::vector<k::AdamTensors> list;
        for (const Entry& e : group) list.push_back(std::get<2>(e));
        const AdamScalars s = scalars_at(options_, lr(), decoupled_, std::get<0>(group.front()),
                                         std::get<1>(group.front()));
        k::adam_update(list, {options_.beta1, options_.beta2, options_.eps, s.l2, s.decay_factor,
                              s.step_size, s.bias_correction2_sqrt, decoupled_});
      });
  for (const auto& [i, target] : to_finish) finish_update(i, target);
}

void AdamBase::load_state(const SafetensorsFile& file, const std::string& prefix) {
  check_kind(file, prefix);
  AdamOptions o;
  o.lr = read_double(file, prefix, "lr");
  o.beta1 = read_double(file, prefix, "beta1");
  o.beta2 = read_double(file, prefix, "beta2");
  o.eps = read_double(file, prefix, "eps");
  o.weight_decay = read_double(file, prefix, "weight_decay");
  o.amsgrad = read_bool(file, prefix, "amsgrad");
  o.decay = options_.decay;  // the caller's grouping; a checkpoint's must agree with it
  const auto decay = file.metadata.find(prefix + "decay");
  std::string expected;
  for (bool d : options_.decay) expected.push_back(d ? '1' : '0');
  const std::string found = decay == file.metadata.end() ? std::string() : decay->second;
  LOOM_CHECK(found == expected, ValueError, name(), ": the checkpoint's weight-decay grouping (",
             found.empty() ? "every parameter" : found, ") differs from this optimizer's (",
             expected.empty() ? "every parameter" : expected, ")");
  validate(name(), o);
  std::vector<ParamState> state = read_state(file, prefix, adam_buffers(o.amsgrad));
  options_ = o;
  commit_state(std::move(state), o.lr);
}

}  // namespace loom::optim

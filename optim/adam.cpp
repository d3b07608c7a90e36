// optim/adam.cpp — Adam's and AdamW's fused update: one pass through memory over each parameter,
// its gradient and its moment buffers (in L1-sized blocks: Note [sqrt in vectorized loops]);
// threads split the elements of a parameter into contiguous chunks.
// The scalar factors (bias corrections, step size) are computed in double, as PyTorch computes
// them in Python, and cast to the parameter's type once.

#include "optim/adam.h"

#include <algorithm>
#include <cmath>
#if __has_include(<experimental/simd>)
#include <experimental/simd>
#define LOOM_HAVE_STD_SIMD 1
#endif

#include "autograd/graph.h"
#include "tensor/cuda/optim.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"

namespace loom::optim {

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

// The factors of step t (1 for the first).
AdamScalars scalars_at(const AdamOptions& o, double lr, bool decoupled, int64_t t) {
  const double step = static_cast<double>(t);
  AdamScalars s;
  s.decay_factor = 1.0 - lr * o.weight_decay;
  s.l2 = decoupled ? 0.0 : o.weight_decay;
  s.step_size = lr / (1.0 - std::pow(o.beta1, step));
  s.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, step));
  return s;
}

// The arrays of one parameter's update.
template <typename T>
struct AdamArrays {
  T* param;
  const T* grad;
  T* exp_avg;
  T* exp_avg_sq;
  T* max_exp_avg_sq;  // amsgrad only
};

// Note [sqrt in vectorized loops]
// Under GCC's default -fmath-errno, std::sqrt is a branch to the C library for negative input
// (to set errno), and the branch keeps a loop scalar: a one-loop Adam step took twice the time of
// the memory traffic. So the update goes in blocks that stay in L1: a loop for the moments, a
// vector sqrt over the block (std::experimental::simd: vsqrtps, correctly rounded, no errno), a
// loop for the parameters. Both loops vectorize.
constexpr int64_t kSqrtBlock = 512;

template <typename T>
void sqrt_block(T* values, int64_t len) {
  int64_t j = 0;
#ifdef LOOM_HAVE_STD_SIMD
  namespace stdx = std::experimental;
  using Vec = stdx::native_simd<T>;
  constexpr auto width = static_cast<int64_t>(Vec::size());
  for (; j + width <= len; j += width) {
    Vec x(values + j, stdx::element_aligned);
    stdx::sqrt(x).copy_to(values + j, stdx::element_aligned);
  }
#endif
  for (; j < len; ++j) values[j] = std::sqrt(values[j]);
}

// Elements [lo, hi) of one parameter. The flags are template parameters so that each variant is
// a branch-free loop.
template <typename T, bool kDecoupled, bool kL2, bool kAmsgrad>
void adam_chunk(const AdamArrays<T>& a, const AdamOptions& o, const AdamScalars& s, int64_t lo,
                int64_t hi) {
  const T beta1 = static_cast<T>(o.beta1), beta2 = static_cast<T>(o.beta2);
  const T keep1 = static_cast<T>(1.0 - o.beta1), keep2 = static_cast<T>(1.0 - o.beta2);
  const T eps = static_cast<T>(o.eps), l2 = static_cast<T>(s.l2);
  const T decay_factor = static_cast<T>(s.decay_factor);
  const T neg_step_size = static_cast<T>(-s.step_size);
  const T bc2_sqrt = static_cast<T>(s.bias_correction2_sqrt);
  alignas(64) T root[kSqrtBlock];
  for (int64_t begin = lo; begin < hi; begin += kSqrtBlock) {
    const int64_t len = std::min(kSqrtBlock, hi - begin);
    T* __restrict param = a.param + begin;
    const T* __restrict grad = a.grad + begin;
    T* __restrict exp_avg = a.exp_avg + begin;
    T* __restrict exp_avg_sq = a.exp_avg_sq + begin;
    T* __restrict max_exp_avg_sq = kAmsgrad ? a.max_exp_avg_sq + begin : nullptr;
    for (int64_t j = 0; j < len; ++j) {
      T g = grad[j];
      if constexpr (kL2) g = g + l2 * param[j];
      exp_avg[j] = exp_avg[j] * beta1 + keep1 * g;
      T v = exp_avg_sq[j] * beta2 + keep2 * g * g;
      exp_avg_sq[j] = v;
      if constexpr (kAmsgrad) {
        const T previous = max_exp_avg_sq[j];
        v = (previous > v || previous != previous) ? previous : v;  // keeps NaN (torch.maximum)
        max_exp_avg_sq[j] = v;
      }
      root[j] = v;
    }
    sqrt_block(root, len);
    for (int64_t j = 0; j < len; ++j) {
      T p = param[j];
      if constexpr (kDecoupled) p = p * decay_factor;
      const T denom = root[j] / bc2_sqrt + eps;
      param[j] = p + neg_step_size * exp_avg[j] / denom;
    }
  }
}

template <typename T, bool kDecoupled, bool kL2>
void adam_update(const AdamArrays<T>& a, int64_t n, const AdamOptions& o, const AdamScalars& s) {
  parallel_for(0, n, kUpdateGrain, [&](int64_t lo, int64_t hi) {
    if (a.max_exp_avg_sq)
      adam_chunk<T, kDecoupled, kL2, true>(a, o, s, lo, hi);
    else
      adam_chunk<T, kDecoupled, kL2, false>(a, o, s, lo, hi);
  });
}

}  // namespace

AdamBase::AdamBase(std::string name, std::vector<Tensor> params, AdamOptions options,
                   bool decoupled)
    : Optimizer(std::move(name), std::move(params), options.lr),
      options_(options),
      decoupled_(decoupled) {
  validate(this->name(), options_);
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : AdamBase("Adam", std::move(params), options, /*decoupled=*/false) {}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : AdamBase("AdamW", std::move(params),
               AdamOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad},
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
  return {{"beta1", format_double(options_.beta1)},
          {"beta2", format_double(options_.beta2)},
          {"eps", format_double(options_.eps)},
          {"weight_decay", format_double(options_.weight_decay)},
          {"amsgrad", options_.amsgrad ? "true" : "false"}};
}

void AdamBase::step() {
  autograd::NoGradGuard no_grad;
  // CUDA parameters are updated together after the loop: one tensor list per device, dtype and
  // step count (the bias corrections depend on the step).
  std::vector<std::pair<int64_t, cuda::AdamTensors>> on_gpu;
  std::vector<std::pair<size_t, Tensor>> to_finish;
  const std::vector<Tensor> grads = update_grads();
  for (size_t i = 0; i < params().size(); ++i) {
    const Tensor& grad = grads[i];
    if (!grad.defined()) continue;  // no gradient this step: skipped, as PyTorch does
    ParamState& state = state_for(i);
    const int64_t t = ++state.steps;
    const Tensor target = update_target(i);
    if (target.is_cuda()) {
      on_gpu.push_back({t,
                        {target, grad, state.buffers[0], state.buffers[1],
                         options_.amsgrad ? state.buffers[2] : Tensor()}});
      to_finish.emplace_back(i, target);
      continue;
    }
    const AdamScalars s = scalars_at(options_, lr(), decoupled_, t);
    dispatch_floating(target.dtype(), name().c_str(), [&]<typename T>() {
      const AdamArrays<T> arrays{target.data_ptr<T>(), grad.data_ptr<T>(),
                                 state.buffers[0].data_ptr<T>(), state.buffers[1].data_ptr<T>(),
                                 options_.amsgrad ? state.buffers[2].data_ptr<T>() : nullptr};
      const int64_t n = target.numel();
      if (decoupled_)
        adam_update<T, true, false>(arrays, n, options_, s);
      else if (s.l2 != 0)
        adam_update<T, false, true>(arrays, n, options_, s);
      else
        adam_update<T, false, false>(arrays, n, options_, s);
    });
    finish_update(i, target);
  }
  using Entry = std::pair<int64_t, cuda::AdamTensors>;
  for_each_group(
      on_gpu,
      [](const Entry& e) {
        return std::tuple_cat(device_and_dtype(e.second.param), std::make_tuple(e.first));
      },
      [&](std::span<const Entry> group) {
        std::vector<cuda::AdamTensors> list;
        for (const Entry& e : group) list.push_back(e.second);
        const AdamScalars s = scalars_at(options_, lr(), decoupled_, group.front().first);
        cuda::adam_update(list, {options_.beta1, options_.beta2, options_.eps, s.l2, s.decay_factor,
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
  validate(name(), o);
  std::vector<ParamState> state = read_state(file, prefix, adam_buffers(o.amsgrad));
  options_ = o;
  commit_state(std::move(state), o.lr);
}

}  // namespace loom::optim

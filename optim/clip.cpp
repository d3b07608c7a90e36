// optim/clip.cpp — clip_grad_norm_: per-gradient norms reduced in fixed-size blocks (threads take
// blocks; the partial results combine in block order, so the norm does not depend on the thread
// count), then one scale of each gradient when the total is above max_norm.

#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/graph.h"
#include "optim/optimizer.h"  // for_each_group
#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/parallel.h"
#include "tensor/reduce.h"

namespace loom::optim {

namespace {

namespace k = loom::kernels;

constexpr int64_t kBlock = 1 << 14;

enum class NormKind { L1, L2, Inf, Power };

double nan_max(double a, double b) { return (a > b || a != a) ? a : b; }

template <NormKind Kind>
double accumulate(double acc, double value, double p) {
  const double a = std::fabs(value);
  if constexpr (Kind == NormKind::L1) return acc + a;
  if constexpr (Kind == NormKind::L2) return acc + a * a;
  if constexpr (Kind == NormKind::Inf) return nan_max(acc, a);
  if constexpr (Kind == NormKind::Power) return acc + std::pow(a, p);
}

template <NormKind Kind>
double combine(double a, double b) {
  return Kind == NormKind::Inf ? nan_max(a, b) : a + b;
}

// sum |g|^p over one gradient (max |g| for the infinity norm). Each block keeps 8 running sums
// (one per vector lane) so that the loop vectorizes without reordering a single sum.
template <typename T, NormKind Kind>
double gradient_power_sum(const T* g, int64_t n, double p) {
  constexpr int64_t kLanes = 8;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallel_for(0, blocks, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t end = std::min(n, (b + 1) * kBlock);
      double lanes[kLanes] = {};
      int64_t j = b * kBlock;
      for (; j + kLanes <= end; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l)
          lanes[l] = accumulate<Kind>(lanes[l], static_cast<double>(g[j + l]), p);
      for (; j < end; ++j) lanes[0] = accumulate<Kind>(lanes[0], static_cast<double>(g[j]), p);
      double acc = lanes[0];
      for (int64_t l = 1; l < kLanes; ++l) acc = combine<Kind>(acc, lanes[l]);
      partial[static_cast<size_t>(b)] = acc;
    }
  });
  double total = 0;
  for (double value : partial) total = combine<Kind>(total, value);
  return total;
}

// A CUDA gradient's share of the total, by the device's reductions, as a float64 [] tensor on
// its device (no wait for the device): sum |g| (L1), sum g^2 (L2), sum |g|^p, or max |g|.
Tensor device_share(const Tensor& grad, NormKind kind, double p) {
  // A 16-bit gradient is widened first: g^2 overflows float16 from |g| = 256 on. (The CPU
  // refuses 16-bit gradients; its sums run in double.)
  const Tensor g = is_16bit_float(grad.dtype()) ? k::to_dtype(grad, kFloat32) : grad;
  const Tensor a = kind == NormKind::L2 ? Tensor() : k::abs(g);
  Tensor share;
  switch (kind) {
    case NormKind::L1:
      share = k::sum(a);
      break;
    case NormKind::L2:
      share = k::sum(k::mul(g, g));  // g^2 needs no |g|
      break;
    case NormKind::Inf:
      share = k::amax(a);
      break;
    case NormKind::Power:
      share = k::sum(k::pow_scalar(a, p));
      break;
  }
  return k::to_dtype(share, kFloat64);
}

// A CPU gradient's share of the total, as device_share's: its power sum (or max |g|).
double cpu_share(const Tensor& grad, NormKind kind, double p) {
  const Tensor g = k::is_dense(grad) ? grad : k::contiguous(grad);  // the order does not matter
  return dispatch_floating(g.dtype(), "clip_grad_norm_", [&]<typename T>() {
    const T* data = g.data_ptr<T>();
    const int64_t n = g.numel();
    switch (kind) {
      case NormKind::L1:
        return gradient_power_sum<T, NormKind::L1>(data, n, p);
      case NormKind::L2:
        return gradient_power_sum<T, NormKind::L2>(data, n, p);
      case NormKind::Inf:
        return gradient_power_sum<T, NormKind::Inf>(data, n, p);
      case NormKind::Power:
        return gradient_power_sum<T, NormKind::Power>(data, n, p);
    }
    return 0.0;
  });
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  LOOM_CHECK(max_norm >= 0, ValueError,
             "clip_grad_norm_: expected max_norm >= 0; got max_norm=", max_norm);
  LOOM_CHECK(norm_type > 0, ValueError,
             "clip_grad_norm_: expected norm_type > 0 (or infinity); got norm_type=", norm_type);
  const NormKind kind = std::isinf(norm_type) ? NormKind::Inf
                        : norm_type == 1.0    ? NormKind::L1
                        : norm_type == 2.0    ? NormKind::L2
                                              : NormKind::Power;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    LOOM_CHECK(params[i].defined(), ValueError, "clip_grad_norm_: parameter ", i,
               " is an undefined tensor");
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    grads.push_back(g);
  }
  if (grads.empty()) return 0.0;

  // As PyTorch: the norm of the per-gradient norms, accumulated as power sums (the max for
  // infinity). A CUDA gradient's share is added on its device, so a call waits for each device
  // once, not once per gradient.
  const auto add_share = [&](double total, double share) {
    return kind == NormKind::Inf ? nan_max(total, share) : total + share;
  };
  double total = 0;
  std::vector<Tensor> on_gpu;
  for (const Tensor& g : grads) {
    if (g.is_cuda()) {
      on_gpu.push_back(g);
      continue;
    }
    total = add_share(total, cpu_share(g, kind, norm_type));
  }
  for_each_group(
      on_gpu, [](const Tensor& g) { return g.device().index; },
      [&](std::span<const Tensor> on_device) {
        autograd::NoGradGuard no_grad;
        Tensor device_total;  // float64 [] on the device
        for (const Tensor& g : on_device) {
          const Tensor share = device_share(g, kind, norm_type);
          device_total = !device_total.defined() ? share
                         : kind == NormKind::Inf ? k::maximum(device_total, share)
                                                 : k::add(device_total, share);
        }
        total = add_share(total, device_total.item());
      });
  if (kind == NormKind::L2) total = std::sqrt(total);
  if (kind == NormKind::Power) total = std::pow(total, 1.0 / norm_type);

  const double coef = max_norm / (total + 1e-6);
  if (!(coef >= 1.0)) {  // also a NaN total: PyTorch's clamp keeps NaN and scales by it
    autograd::NoGradGuard no_grad;
    for (const Tensor& g : grads) k::mul_scalar_(g, coef);  // bumps the version
  }
  return total;
}

}  // namespace loom::optim

// tensor/cpu/optim.cpp — the fused optimizer updates on the CPU: one pass over each parameter,
// its gradient and its state buffers; threads split the elements of a parameter into contiguous
// chunks. Adam goes in L1-sized blocks (Note [sqrt in vectorized loops]).

#include "tensor/cpu/optim.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#if __has_include(<experimental/simd>)
#include <experimental/simd>
#define LOOM_HAVE_STD_SIMD 1
#endif

#include "tensor/copy.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"

namespace loom::cpu {

namespace {

using kernels::AdamStep;
using kernels::AdamTensors;
using kernels::SgdStep;
using kernels::SgdTensors;

// Elements per thread below which an update stays on one thread (waking the others costs more
// than the work).
constexpr int64_t kUpdateGrain = 1 << 15;

// One parameter's update; `first`: its momentum buffer takes the first direction as it is.
template <typename T>
void sgd_one(T* param, const T* grad, T* buffer, int64_t n, const SgdStep& s, bool first) {
  const T weight_decay = static_cast<T>(s.weight_decay), momentum = static_cast<T>(s.momentum);
  const T keep = static_cast<T>(1.0 - s.dampening), neg_lr = static_cast<T>(-s.lr);
  const bool decay = s.weight_decay != 0, nesterov = s.nesterov;
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

// The arrays of one parameter's Adam update.
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
void adam_chunk(const AdamArrays<T>& a, const AdamStep& s, int64_t lo, int64_t hi) {
  const T beta1 = static_cast<T>(s.beta1), beta2 = static_cast<T>(s.beta2);
  const T keep1 = static_cast<T>(1.0 - s.beta1), keep2 = static_cast<T>(1.0 - s.beta2);
  const T eps = static_cast<T>(s.eps), l2 = static_cast<T>(s.l2);
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
void adam_one(const AdamArrays<T>& a, int64_t n, const AdamStep& s) {
  parallel_for(0, n, kUpdateGrain, [&](int64_t lo, int64_t hi) {
    if (a.max_exp_avg_sq)
      adam_chunk<T, kDecoupled, kL2, true>(a, s, lo, hi);
    else
      adam_chunk<T, kDecoupled, kL2, false>(a, s, lo, hi);
  });
}

// g <- g * inv_scale over one dense gradient; true when a result is not finite (an inf or NaN
// in g, or a finite value that overflows when unscaled by a scale below 1).
template <typename T>
bool unscale_one(T* g, int64_t n, T inv_scale) {
  std::atomic<bool> found{false};
  parallel_for(0, n, kUpdateGrain, [&](int64_t lo, int64_t hi) {
    constexpr T kMax = std::numeric_limits<T>::max();
    bool bad = false;
    for (int64_t j = lo; j < hi; ++j) {
      const T v = g[j] * inv_scale;
      g[j] = v;
      bad |= !(std::abs(v) <= kMax);  // false for inf and NaN
    }
    if (bad) found = true;
  });
  return found;
}

}  // namespace

void sgd_update(std::span<const SgdTensors> list, const SgdStep& s) {
  for (const SgdTensors& e : list) {
    dispatch_floating(e.param.dtype(), "SGD", [&]<typename T>() {
      sgd_one<T>(e.param.data_ptr<T>(), e.grad.data_ptr<T>(),
                 e.buffer.defined() ? e.buffer.data_ptr<T>() : nullptr, e.param.numel(), s,
                 e.first);
    });
  }
}

void adam_update(std::span<const AdamTensors> list, const AdamStep& s) {
  for (const AdamTensors& e : list) {
    dispatch_floating(e.param.dtype(), "Adam", [&]<typename T>() {
      const AdamArrays<T> arrays{
          e.param.data_ptr<T>(), e.grad.data_ptr<T>(), e.exp_avg.data_ptr<T>(),
          e.exp_avg_sq.data_ptr<T>(),
          e.max_exp_avg_sq.defined() ? e.max_exp_avg_sq.data_ptr<T>() : nullptr};
      const int64_t n = e.param.numel();
      if (s.decoupled)
        adam_one<T, true, false>(arrays, n, s);
      else if (s.l2 != 0)
        adam_one<T, false, true>(arrays, n, s);
      else
        adam_one<T, false, false>(arrays, n, s);
    });
  }
}

void unscale_and_check_(std::span<const Tensor> grads, double inv_scale, const Tensor& found_inf) {
  bool found = false;
  for (const Tensor& g : grads) {
    dispatch_floating(g.dtype(), "GradScaler: unscale_", [&]<typename T>() {
      if (unscale_one(g.data_ptr<T>(), g.numel(), static_cast<T>(inv_scale))) found = true;
    });
  }
  if (found) kernels::fill_(found_inf, 1.0);
}

}  // namespace loom::cpu

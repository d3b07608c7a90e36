// tensor/cuda/optim.cu — fused SGD and Adam updates and GradScaler's unscale (tensor/cuda/optim.h).
// One thread per element in a grid-stride loop; each element's arithmetic is the CPU loop's
// operations in the same order, in the parameter's type (nvcc may fuse a multiply and an add into
// one FMA, so a result can differ from the CPU's in the last bit).

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/optim.h"
#include "tensor/dispatch.h"

namespace loom::cuda {

namespace {

template <typename T>
__global__ void sgd_kernel(T* param, const T* grad, T* buffer, int64_t n, T weight_decay,
                           T momentum, T keep, T neg_lr, bool decay, bool nesterov, bool first) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    T d = decay ? grad[j] + weight_decay * param[j] : grad[j];
    if (buffer != nullptr) {
      const T buf = first ? d : buffer[j] * momentum + keep * d;
      buffer[j] = buf;
      d = nesterov ? d + momentum * buf : buf;
    }
    param[j] = param[j] + neg_lr * d;
  }
}

template <typename T>
__global__ void adam_kernel(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* max_exp_avg_sq,
                            int64_t n, T beta1, T beta2, T keep1, T keep2, T eps, T l2,
                            T decay_factor, T neg_step_size, T bc2_sqrt, bool decoupled) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    T g = grad[j];
    if (l2 != T(0)) g = g + l2 * param[j];
    const T m = exp_avg[j] * beta1 + keep1 * g;
    exp_avg[j] = m;
    T v = exp_avg_sq[j] * beta2 + keep2 * g * g;
    exp_avg_sq[j] = v;
    if (max_exp_avg_sq != nullptr) {
      const T previous = max_exp_avg_sq[j];
      v = (previous > v || previous != previous) ? previous : v;  // keeps NaN (torch.maximum)
      max_exp_avg_sq[j] = v;
    }
    T p = param[j];
    if (decoupled) p = p * decay_factor;
    const T denom = sqrt(v) / bc2_sqrt + eps;
    param[j] = p + neg_step_size * m / denom;
  }
}

// Every thread that meets a non-finite result stores the same 1: the flag does not depend on
// which one wins.
template <typename T>
__global__ void unscale_check_kernel(T* grad, int64_t n, T inv_scale, int* found_inf) {
  bool bad = false;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    const T v = grad[j] * inv_scale;
    grad[j] = v;
    bad = bad || !isfinite(v);
  }
  if (bad) *found_inf = 1;
}

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data()) : nullptr;
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buffer, const SgdStep& s) {
  const int device = param.device().index;
  DeviceGuard guard(device);
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_floating(param.dtype(), "SGD", [&]<typename T>() {
    sgd_kernel<T><<<blocks_for(n), kThreads, 0, stream_of(param)>>>(
        static_cast<T*>(param.data()), static_cast<const T*>(grad.data()), data_or_null<T>(buffer),
        n, static_cast<T>(s.weight_decay), static_cast<T>(s.momentum),
        static_cast<T>(1.0 - s.dampening), static_cast<T>(-s.lr), s.weight_decay != 0, s.nesterov,
        s.first);
  });
  check_launch("sgd_kernel", device);
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamStep& s) {
  const int device = param.device().index;
  DeviceGuard guard(device);
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_floating(param.dtype(), "Adam", [&]<typename T>() {
    adam_kernel<T><<<blocks_for(n), kThreads, 0, stream_of(param)>>>(
        static_cast<T*>(param.data()), static_cast<const T*>(grad.data()),
        static_cast<T*>(exp_avg.data()), static_cast<T*>(exp_avg_sq.data()),
        data_or_null<T>(max_exp_avg_sq), n, static_cast<T>(s.beta1), static_cast<T>(s.beta2),
        static_cast<T>(1.0 - s.beta1), static_cast<T>(1.0 - s.beta2), static_cast<T>(s.eps),
        static_cast<T>(s.l2), static_cast<T>(s.decay_factor), static_cast<T>(-s.step_size),
        static_cast<T>(s.bias_correction2_sqrt), s.decoupled);
  });
  check_launch("adam_kernel", device);
}

void unscale_and_check_(const Tensor& grad, double inv_scale, const Tensor& found_inf) {
  const int device = grad.device().index;
  DeviceGuard guard(device);
  const int64_t n = grad.numel();
  if (n == 0) return;
  dispatch_floating(grad.dtype(), "GradScaler: unscale_", [&]<typename T>() {
    unscale_check_kernel<T><<<blocks_for(n), kThreads, 0, stream_of(grad)>>>(
        static_cast<T*>(grad.data()), n, static_cast<T>(inv_scale),
        static_cast<int*>(found_inf.data()));
  });
  check_launch("unscale_check_kernel", device);
}

}  // namespace loom::cuda

// tensor/cuda/optim.cu — fused SGD and Adam updates and GradScaler's unscale over lists of
// tensors (tensor/cuda/optim.h). Each launch covers up to a tensor list's worth of parameters
// (Note [Tensor lists]); each block walks one chunk of one tensor. Each element's arithmetic is
// the CPU loop's operations in the same order, in the parameter's type (nvcc may fuse a
// multiply and an add into one FMA, so a result can differ from the CPU's in the last bit).

#include <vector>

#include "tensor/copy.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/optim.h"
#include "tensor/cuda/tensor_list.h"
#include "tensor/dispatch.h"

namespace loom::cuda {

namespace {

constexpr int64_t kChunk = int64_t{1} << 16;  // elements per block: 128 per thread
constexpr int kListThreads = 512;

// __grid_constant__: the list stays in the kernel's parameter space, indexed per block, instead
// of a per-thread copy of its 3 KiB.
template <typename T>
__global__ void sgd_kernel(const __grid_constant__ TensorListLaunch<3> l, T weight_decay,
                           T momentum, T keep, T neg_lr, bool decay, bool nesterov) {
  int64_t begin, end;
  block_span(l, blockIdx.x, kChunk, begin, end);
  const int t = l.block_tensor[blockIdx.x];
  T* param = static_cast<T*>(l.data[0][t]);
  const T* grad = static_cast<const T*>(l.data[1][t]);
  T* buffer = static_cast<T*>(l.data[2][t]);
  const bool first = l.flag[t] != 0;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
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
__global__ void adam_kernel(const __grid_constant__ TensorListLaunch<5> l, T beta1, T beta2,
                            T keep1, T keep2, T eps, T l2, T decay_factor, T neg_step_size,
                            T bc2_sqrt, bool decoupled) {
  int64_t begin, end;
  block_span(l, blockIdx.x, kChunk, begin, end);
  const int t = l.block_tensor[blockIdx.x];
  T* param = static_cast<T*>(l.data[0][t]);
  const T* grad = static_cast<const T*>(l.data[1][t]);
  T* exp_avg = static_cast<T*>(l.data[2][t]);
  T* exp_avg_sq = static_cast<T*>(l.data[3][t]);
  T* max_exp_avg_sq = static_cast<T*>(l.data[4][t]);
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
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
__global__ void unscale_check_kernel(const __grid_constant__ TensorListLaunch<1> l, T inv_scale,
                                     int* found_inf) {
  int64_t begin, end;
  block_span(l, blockIdx.x, kChunk, begin, end);
  T* grad = static_cast<T*>(l.data[0][l.block_tensor[blockIdx.x]]);
  bool bad = false;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const T v = grad[j] * inv_scale;
    grad[j] = v;
    bad = bad || !isfinite(v);
  }
  if (bad) *found_inf = 1;
}

void* data_or_null(const Tensor& t) { return t.defined() ? t.data() : nullptr; }

// Every tensor of a list: on `first`'s device, in its dtype, and dense (Note [Update layouts]
// in optim/optimizer.h); an entry's tensors are read at the same flat index, so they share one
// layout (`like`, the entry's parameter).
void check_member(const char* op, const Tensor& first, const Tensor& t, const Tensor& like) {
  LOOM_CHECK(t.device() == first.device(), DeviceError, op,
             ": a tensor list is on one device; got ", t.device(), " beside ", first.device(),
             " (shape=", t.sizes(), ")");
  LOOM_CHECK(t.dtype() == first.dtype(), DTypeError, op, ": a tensor list has one dtype; got ",
             t.dtype(), " beside ", first.dtype(), " (shape=", t.sizes(), ")");
  LOOM_CHECK(kernels::is_dense(t) && kernels::same_dense_layout(t, like), ValueError, op,
             ": a tensor list takes dense tensors stored in their entry's one order; got shape=",
             t.sizes(), " strides=", t.strides(), " beside strides=", like.strides());
}

}  // namespace

void sgd_update(std::span<const SgdTensors> list, const SgdStep& s) {
  if (list.empty()) return;
  const Tensor& first = list.front().param;
  const int device = first.device().index;
  DeviceGuard guard(device);
  std::vector<TensorListEntry<3>> entries;
  entries.reserve(list.size());
  for (const SgdTensors& e : list) {
    for (const Tensor& t : {e.param, e.grad}) check_member("SGD", first, t, e.param);
    if (e.buffer.defined()) check_member("SGD", first, e.buffer, e.param);
    entries.push_back(
        {{e.param.data(), e.grad.data(), data_or_null(e.buffer)}, e.param.numel(), e.first});
  }
  const cudaStream_t stream = current_stream(device);
  dispatch_floating(first.dtype(), "SGD", [&]<typename T>() {
    pack<3>(entries, kChunk, [&](const TensorListLaunch<3>& l) {
      sgd_kernel<T><<<l.blocks, kListThreads, 0, stream>>>(
          l, static_cast<T>(s.weight_decay), static_cast<T>(s.momentum),
          static_cast<T>(1.0 - s.dampening), static_cast<T>(-s.lr), s.weight_decay != 0,
          s.nesterov);
      check_launch("sgd_kernel", device);
    });
  });
}

void adam_update(std::span<const AdamTensors> list, const AdamStep& s) {
  if (list.empty()) return;
  const Tensor& first = list.front().param;
  const int device = first.device().index;
  DeviceGuard guard(device);
  std::vector<TensorListEntry<5>> entries;
  entries.reserve(list.size());
  for (const AdamTensors& e : list) {
    for (const Tensor& t : {e.param, e.grad, e.exp_avg, e.exp_avg_sq})
      check_member("Adam", first, t, e.param);
    if (e.max_exp_avg_sq.defined()) check_member("Adam", first, e.max_exp_avg_sq, e.param);
    entries.push_back({{e.param.data(), e.grad.data(), e.exp_avg.data(), e.exp_avg_sq.data(),
                        data_or_null(e.max_exp_avg_sq)},
                       e.param.numel()});
  }
  const cudaStream_t stream = current_stream(device);
  dispatch_floating(first.dtype(), "Adam", [&]<typename T>() {
    pack<5>(entries, kChunk, [&](const TensorListLaunch<5>& l) {
      adam_kernel<T><<<l.blocks, kListThreads, 0, stream>>>(
          l, static_cast<T>(s.beta1), static_cast<T>(s.beta2), static_cast<T>(1.0 - s.beta1),
          static_cast<T>(1.0 - s.beta2), static_cast<T>(s.eps), static_cast<T>(s.l2),
          static_cast<T>(s.decay_factor), static_cast<T>(-s.step_size),
          static_cast<T>(s.bias_correction2_sqrt), s.decoupled);
      check_launch("adam_kernel", device);
    });
  });
}

void unscale_and_check_(std::span<const Tensor> grads, double inv_scale, const Tensor& found_inf) {
  if (grads.empty()) return;
  const Tensor& first = grads.front();
  LOOM_CHECK(
      found_inf.dtype() == kInt32 && found_inf.numel() >= 1 && found_inf.device() == first.device(),
      ValueError, "GradScaler: unscale_: found_inf must be an int32 tensor on ", first.device(),
      "; got ", found_inf.dtype(), " ", found_inf.sizes(), " on ", found_inf.device());
  const int device = first.device().index;
  DeviceGuard guard(device);
  std::vector<TensorListEntry<1>> entries;
  entries.reserve(grads.size());
  for (const Tensor& g : grads) {
    check_member("GradScaler: unscale_", first, g, g);
    entries.push_back({{g.data()}, g.numel()});
  }
  const cudaStream_t stream = current_stream(device);
  dispatch_floating(first.dtype(), "GradScaler: unscale_", [&]<typename T>() {
    pack<1>(entries, kChunk, [&](const TensorListLaunch<1>& l) {
      unscale_check_kernel<T><<<l.blocks, kListThreads, 0, stream>>>(
          l, static_cast<T>(inv_scale), static_cast<int*>(found_inf.data()));
      check_launch("unscale_check_kernel", device);
    });
  });
}

}  // namespace loom::cuda

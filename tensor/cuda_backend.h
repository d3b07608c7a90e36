// tensor/cuda_backend.h — what the device-neutral code of tensor/ calls on a GPU: one table of
// entry points that the CUDA backend library fills in when it loads.
//
// Note [The CUDA backend library]
// loom's CUDA kernels, its cuBLAS/cuDNN calls and its device allocator live in their own shared
// library, libloom_cuda (tensor/cuda/), which alone links libcudart, libcublas and libcudnn.
// libloom_tensor never links it: the first call that needs a GPU (cuda_device_count(), a CUDA
// tensor, set_cuda_device) loads it with dlopen, from the directory libloom_tensor itself was
// loaded from, else from the loader's search path, and asks it for this table. So:
//   - a CPU-only machine runs a CUDA-enabled install without any CUDA library: nothing loads
//     until a GPU is asked for, and then DeviceError says what is missing (the library, or the
//     CUDA library it needs, in the loader's words);
//   - a build without CUDA has no backend library at all, and the same call says "loom was built
//     without CUDA";
//   - an entry point is declared once for its callers, here; the kernels' own headers
//     (tensor/cuda/<family>.h) are the backend's business.
// PyTorch splits torch_cpu and torch_cuda the same way; ggml loads its backends likewise. The
// nccl process group is a second such library (dist/nccl_process_group.h).
//
// Each entry has the name and the meaning of the tensor/cuda/ function that fills it: the
// kernel front (tensor/<family>.h) checks the arguments, then calls the entry for CUDA tensors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tensor/attention.h"
#include "tensor/conv.h"
#include "tensor/loss.h"
#include "tensor/norm.h"
#include "tensor/optim.h"
#include "tensor/tensor.h"

namespace loom {

struct CudaBackend {
  using Unary = Tensor (*)(const Tensor&);
  using Binary = Tensor (*)(const Tensor&, const Tensor&);
  using WithScalar = Tensor (*)(const Tensor&, double);
  using Backward = Tensor (*)(const Tensor& dout, const Tensor& saved);
  using InPlace = void (*)(const Tensor& self, const Tensor& other);
  using InPlaceScalar = void (*)(const Tensor& self, double value);
  using Reduce = Tensor (*)(const Tensor& x, const Shape& dims, bool keepdim);
  using Extremum = std::pair<Tensor, Tensor> (*)(const Tensor& x, int64_t dim, bool keepdim);
  using ArgExtremum = Tensor (*)(const Tensor& x, std::optional<int64_t> dim, bool keepdim);
  using Moment = Tensor (*)(const Tensor& x, const Shape& dims, bool unbiased, bool keepdim);
  using AlongDim = Tensor (*)(const Tensor& x, int64_t dim);
  using AlongDimBackward = Tensor (*)(const Tensor& dy, const Tensor& y, int64_t dim);

  // sizeof(CudaBackend) of the library that filled the table: a libloom_cuda from another build
  // of loom is refused rather than called through the wrong slots.
  size_t size = sizeof(CudaBackend);

  // --- the runtime: devices, memory, copies (tensor/cuda/runtime.h)
  int (*device_count)();  // 0 without a driver or a GPU
  int (*current_device)();
  void (*set_device)(int device);
  void (*synchronize)(int device);
  void* (*allocate)(size_t nbytes, int device);  // through the caching allocator
  void (*deallocate)(void* ptr, int device);     // never throws
  size_t (*cached_bytes)(int device);            // held by the caching allocator
  void (*reset_peak_allocator_stats)(int device);
  void (*copy_to_device)(void* dst, const void* src, size_t nbytes, int device);
  void (*copy_to_host)(void* dst, const void* src, size_t nbytes, int device);
  // Note [Deferred device checks]: +1 on a hold's construction, -1 on its destruction.
  void (*hold_deferred_checks)(int delta);
  void (*set_cudnn_deterministic)(bool deterministic);

  // --- copy and random fills (tensor/copy.h, tensor/random.h)
  void (*copy_)(const Tensor& dst, const Tensor& src);
  void (*fill_)(const Tensor& dst, double value);
  void (*fill_uniform_)(const Tensor& t, uint64_t seed, uint64_t first_counter, double low,
                        double high);
  void (*fill_normal_)(const Tensor& t, uint64_t seed, uint64_t first_counter, double mean,
                       double std);
  void (*fill_randint_)(const Tensor& t, uint64_t seed, uint64_t first_counter, int64_t low,
                        int64_t high);

  // --- elementwise (tensor/elementwise.h)
  Tensor (*add)(const Tensor& a, const Tensor& b, double alpha);
  Tensor (*sub)(const Tensor& a, const Tensor& b, double alpha);
  Binary mul, div, pow, maximum, minimum;
  WithScalar add_scalar, mul_scalar, pow_scalar, rsub_scalar, div_scalar;
  Binary eq, ne, lt, le, gt, ge;
  WithScalar eq_scalar, gt_scalar, lt_scalar;
  Unary neg, exp, log, sqrt, rsqrt, abs, sign, tanh, sigmoid, relu;
  Tensor (*gelu)(const Tensor& x, bool tanh_approximation);
  Tensor (*clamp)(const Tensor& x, double min, double max);
  Tensor (*where)(const Tensor& condition, const Tensor& a, const Tensor& b);
  Backward relu_backward, sigmoid_backward, tanh_backward;
  Tensor (*gelu_backward)(const Tensor& dout, const Tensor& x, bool tanh_approximation);
  Tensor (*clamp_backward)(const Tensor& dout, const Tensor& x, double min, double max);
  void (*add_)(const Tensor& self, const Tensor& other, double alpha);
  void (*sub_)(const Tensor& self, const Tensor& other, double alpha);
  InPlace mul_, div_;
  InPlaceScalar mul_scalar_, add_scalar_;
  void (*addcmul_)(const Tensor& self, const Tensor& a, const Tensor& b, double alpha);
  void (*addcdiv_)(const Tensor& self, const Tensor& a, const Tensor& b, double alpha);

  // --- reductions (tensor/reduce.h)
  Reduce sum, mean, amax, amin, logsumexp;
  Tensor (*sum_to)(const Tensor& x, const Shape& shape);
  Extremum max_dim, min_dim;
  ArgExtremum argmax, argmin;
  Moment var, std;

  // --- matrix products (tensor/linalg.h)
  void (*mm_out)(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta);
  Binary bmm;

  // --- indexing (tensor/index.h)
  Tensor (*cat)(const std::vector<Tensor>& tensors, int64_t dim);
  Tensor (*index_select)(const Tensor& x, int64_t dim, const Tensor& index);
  void (*index_add_)(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
  Tensor (*gather)(const Tensor& x, int64_t dim, const Tensor& index);
  void (*scatter_add_into)(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                           const char* op);
  Tensor (*one_hot)(const Tensor& index, int64_t num_classes);
  Tensor (*embedding)(const Tensor& weight, const Tensor& index);
  Tensor (*embedding_backward)(const Tensor& dout, const Tensor& index, int64_t num_weights,
                               int64_t padding_idx);
  Tensor (*dropout_masked)(const Tensor& x, double p, uint64_t seed, uint64_t first);

  // --- softmax and losses (tensor/loss.h)
  AlongDim softmax, log_softmax;
  AlongDimBackward softmax_backward, log_softmax_backward;
  int64_t (*check_class_target)(const char* op, const Tensor& input, const Tensor& target,
                                int64_t ignore_index);
  kernels::CrossEntropyForward (*cross_entropy_forward)(const Tensor& logits, const Tensor& target,
                                                        Reduction reduction, int64_t ignore_index,
                                                        double label_smoothing);
  Tensor (*cross_entropy_backward)(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                                   const Tensor& lse, Reduction reduction, int64_t ignore_index,
                                   double label_smoothing, const Tensor& count);
  kernels::NllLossForward (*nll_loss_forward)(const Tensor& log_probs, const Tensor& target,
                                              const Tensor& weight, Reduction reduction,
                                              int64_t ignore_index);
  Tensor (*nll_loss_backward)(const Tensor& dloss, const Shape& input_shape, const Tensor& target,
                              const Tensor& weight, Reduction reduction, int64_t ignore_index,
                              double total_weight);
  Tensor (*mse_loss)(const Tensor& input, const Tensor& target, Reduction reduction);
  Tensor (*mse_loss_backward)(const Tensor& dloss, const Tensor& input, const Tensor& target,
                              Reduction reduction);

  // --- normalization (tensor/norm.h)
  kernels::BatchNormSums (*batch_norm_sums)(const Tensor& x);
  kernels::BatchNormStats (*batch_norm_stats_from_sums)(const Tensor& sum, const Tensor& sum_sq,
                                                        int64_t count, double eps, DType dtype);
  kernels::BatchNormStats (*batch_norm_stats)(const Tensor& x, double eps);
  Tensor (*batch_norm_invstd)(const Tensor& var, double eps);
  void (*batch_norm_update_running_stats_)(const Tensor& running_mean, const Tensor& running_var,
                                           const kernels::BatchNormStats& stats, double momentum);
  Tensor (*batch_norm_elemt)(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                             const Tensor& weight, const Tensor& bias,
                             const kernels::BatchNormEpilogue& epilogue);
  std::pair<Tensor, kernels::BatchNormStats> (*batch_norm_forward_train)(
      const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
      const kernels::BatchNormEpilogue& epilogue);
  std::pair<Tensor, Tensor> (*batch_norm_backward_reduce)(const Tensor& dy, const Tensor& x,
                                                          const Tensor& mean, const Tensor& invstd);
  Tensor (*batch_norm_backward_elemt)(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                      const Tensor& invstd, const Tensor& weight,
                                      const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                                      int64_t count);
  kernels::NormGrads (*batch_norm_backward)(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                            const Tensor& invstd, const Tensor& weight,
                                            bool training, std::array<bool, 3> need,
                                            const Tensor& relu_y, bool need_dresidual);
  kernels::LayerNormForward (*layer_norm_forward)(const Tensor& x, int64_t normalized_numel,
                                                  const Tensor& weight, const Tensor& bias,
                                                  double eps);
  kernels::NormGrads (*layer_norm_backward)(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                            const Tensor& rstd, const Tensor& weight,
                                            int64_t normalized_numel, std::array<bool, 3> need);

  // --- fused attention (tensor/attention.h): the kernels' contract of Note [Fused attention]
  kernels::AttentionForward (*attention_forward)(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const kernels::AttentionOptions& options);
  kernels::AttentionGrads (*attention_backward)(const Tensor& dout, const Tensor& q,
                                                const Tensor& k, const Tensor& v, const Tensor& out,
                                                const Tensor& lse,
                                                const kernels::AttentionOptions& options);

  // --- convolution and pooling (tensor/conv.h)
  Tensor (*conv2d)(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const kernels::Conv2dOptions& options);
  kernels::Conv2dGrads (*conv2d_backward)(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                          const kernels::Conv2dOptions& options,
                                          std::array<bool, 3> needs);
  std::pair<Tensor, Tensor> (*max_pool2d)(const Tensor& x, const kernels::Pool2dOptions& options);
  Tensor (*max_pool2d_backward)(const Tensor& dout, const Tensor& indices, const Shape& x_shape,
                                MemoryFormat format);
  Tensor (*avg_pool2d)(const Tensor& x, const kernels::Pool2dOptions& options);
  Tensor (*avg_pool2d_backward)(const Tensor& dout, const Shape& x_shape,
                                const kernels::Pool2dOptions& options, MemoryFormat format);
  Tensor (*adaptive_avg_pool2d)(const Tensor& x, kernels::Pair output_size);
  Tensor (*adaptive_avg_pool2d_backward)(const Tensor& dout, const Shape& x_shape,
                                         MemoryFormat format);

  // --- the optimizers' fused updates (tensor/optim.h)
  void (*sgd_update)(std::span<const kernels::SgdTensors> list, const kernels::SgdStep& s);
  void (*adam_update)(std::span<const kernels::AdamTensors> list, const kernels::AdamStep& s);
  void (*unscale_and_check_)(std::span<const Tensor> grads, double inv_scale,
                             const Tensor& found_inf);

  // --- uploading batches through pinned memory (Note [Uploading batches])
  void* (*make_uploader)(int ring_size);
  Tensor (*upload)(void* uploader, const Tensor& t, Device device, MemoryFormat format);
  void (*free_uploader)(void* uploader);  // waits for the copies still reading its buffers
};

// The loaded backend, loading it on the first call; DeviceError("<op>: ...") saying why there is
// none (built without CUDA, or the library or one it needs could not be loaded).
const CudaBackend& cuda_backend(const char* op = "cuda");

// The loaded backend, or nullptr where there is none; never throws.
const CudaBackend* cuda_backend_if_available();

// The backend if something has loaded it already, else nullptr; never loads it. For the CPU's
// paths that only need to know whether any GPU work can exist (none before the backend loads).
const CudaBackend* cuda_backend_if_loaded();

// Why there is no backend ("" where it is loaded): what cuda_backend() would raise.
const std::string& cuda_backend_unavailable_reason();

// The name of the symbol libloom_cuda exports: `extern "C" const CudaBackend* <it>()`.
inline constexpr const char* kCudaBackendEntry = "loom_cuda_backend";

}  // namespace loom

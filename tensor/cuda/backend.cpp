// tensor/cuda/backend.cpp — libloom_cuda's one export: the table of tensor/cuda_backend.h,
// filled with this library's functions (Note [The CUDA backend library]).

#include "tensor/cuda/attention.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/conv.h"
#include "tensor/cuda/copy.h"
#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/index.h"
#include "tensor/cuda/linalg.h"
#include "tensor/cuda/loss.h"
#include "tensor/cuda/norm.h"
#include "tensor/cuda/optim.h"
#include "tensor/cuda/pool.h"
#include "tensor/cuda/random.h"
#include "tensor/cuda/reduce.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/upload.h"
#include "tensor/cuda_backend.h"

namespace loom::cuda {
namespace {

size_t cached_bytes(int device) { return allocator_stats(device).cached_bytes; }

void copy_to_device(void* dst, const void* src, size_t nbytes, int device) {
  copy_bytes(dst, src, nbytes, CopyKind::HostToDevice, device);
}

void copy_to_host(void* dst, const void* src, size_t nbytes, int device) {
  copy_bytes(dst, src, nbytes, CopyKind::DeviceToHost, device);
}

void* make_uploader(int ring_size) { return new Uploader(ring_size); }

Tensor upload(void* uploader, const Tensor& t, Device device, MemoryFormat format) {
  return (*static_cast<Uploader*>(uploader))(t, device, format);
}

void free_uploader(void* uploader) { delete static_cast<Uploader*>(uploader); }

CudaBackend make_table() {
  CudaBackend t{};  // a slot left out stays null, and the loader refuses the table
  t.device_count = device_count;
  t.dense_peak_flops = dense_peak_flops;
  t.current_device = current_device;
  t.set_device = set_device;
  t.synchronize = synchronize;
  t.allocate = allocate;
  t.deallocate = deallocate;
  t.cached_bytes = cached_bytes;
  t.reset_peak_allocator_stats = reset_peak_allocator_stats;
  t.copy_to_device = copy_to_device;
  t.copy_to_host = copy_to_host;
  t.hold_deferred_checks = hold_deferred_checks;
  t.set_cudnn_deterministic = set_cudnn_deterministic;

  t.copy_ = copy_;
  t.fill_ = fill_;
  t.fill_uniform_ = fill_uniform_;
  t.fill_normal_ = fill_normal_;
  t.fill_randint_ = fill_randint_;

  t.add = add;
  t.sub = sub;
  t.mul = mul;
  t.div = div;
  t.pow = pow;
  t.maximum = maximum;
  t.minimum = minimum;
  t.add_scalar = add_scalar;
  t.mul_scalar = mul_scalar;
  t.pow_scalar = pow_scalar;
  t.rsub_scalar = rsub_scalar;
  t.div_scalar = div_scalar;
  t.eq = eq;
  t.ne = ne;
  t.lt = lt;
  t.le = le;
  t.gt = gt;
  t.ge = ge;
  t.eq_scalar = eq_scalar;
  t.gt_scalar = gt_scalar;
  t.lt_scalar = lt_scalar;
  t.neg = neg;
  t.exp = exp;
  t.log = log;
  t.sqrt = sqrt;
  t.rsqrt = rsqrt;
  t.abs = abs;
  t.sign = sign;
  t.tanh = tanh;
  t.sigmoid = sigmoid;
  t.relu = relu;
  t.gelu = gelu;
  t.clamp = clamp;
  t.where = where;
  t.relu_backward = relu_backward;
  t.sigmoid_backward = sigmoid_backward;
  t.tanh_backward = tanh_backward;
  t.gelu_backward = gelu_backward;
  t.clamp_backward = clamp_backward;
  t.add_ = add_;
  t.sub_ = sub_;
  t.mul_ = mul_;
  t.div_ = div_;
  t.mul_scalar_ = mul_scalar_;
  t.add_scalar_ = add_scalar_;
  t.addcmul_ = addcmul_;
  t.addcdiv_ = addcdiv_;

  t.sum = sum;
  t.mean = mean;
  t.amax = amax;
  t.amin = amin;
  t.logsumexp = logsumexp;
  t.sum_to = sum_to;
  t.max_dim = max_dim;
  t.min_dim = min_dim;
  t.argmax = argmax;
  t.argmin = argmin;
  t.var = var;
  t.std = cuda::std;

  t.mm_out = mm_out;
  t.bmm = bmm;

  t.cat = cat;
  t.index_select = index_select;
  t.index_add_ = index_add_;
  t.gather = gather;
  t.scatter_add_into = scatter_add_into;
  t.one_hot = one_hot;
  t.embedding = embedding;
  t.embedding_backward = embedding_backward;
  t.dropout_masked = dropout_masked;

  t.softmax = softmax;
  t.log_softmax = log_softmax;
  t.softmax_backward = softmax_backward;
  t.log_softmax_backward = log_softmax_backward;
  t.check_class_target = check_class_target;
  t.cross_entropy_forward = cross_entropy_forward;
  t.cross_entropy_backward = cross_entropy_backward;
  t.nll_loss_forward = nll_loss_forward;
  t.nll_loss_backward = nll_loss_backward;
  t.mse_loss = mse_loss;
  t.mse_loss_backward = mse_loss_backward;

  t.batch_norm_sums = batch_norm_sums;
  t.batch_norm_stats_from_sums = batch_norm_stats_from_sums;
  t.batch_norm_stats = batch_norm_stats;
  t.batch_norm_invstd = batch_norm_invstd;
  t.batch_norm_update_running_stats_ = batch_norm_update_running_stats_;
  t.batch_norm_elemt = batch_norm_elemt;
  t.batch_norm_forward_train = batch_norm_forward_train;
  t.batch_norm_backward_reduce = batch_norm_backward_reduce;
  t.batch_norm_backward_elemt = batch_norm_backward_elemt;
  t.batch_norm_backward = batch_norm_backward;
  t.layer_norm_forward = layer_norm_forward;
  t.layer_norm_backward = layer_norm_backward;

  t.attention_forward = attention_forward;
  t.attention_backward = attention_backward;

  t.conv2d = conv2d;
  t.conv2d_backward = conv2d_backward;
  t.max_pool2d = max_pool2d;
  t.max_pool2d_backward = max_pool2d_backward;
  t.avg_pool2d = avg_pool2d;
  t.avg_pool2d_backward = avg_pool2d_backward;
  t.adaptive_avg_pool2d = adaptive_avg_pool2d;
  t.adaptive_avg_pool2d_backward = adaptive_avg_pool2d_backward;

  t.sgd_update = sgd_update;
  t.adam_update = adam_update;
  t.unscale_and_check_ = unscale_and_check_;

  t.make_uploader = make_uploader;
  t.upload = upload;
  t.free_uploader = free_uploader;
  return t;
}

}  // namespace
}  // namespace loom::cuda

extern "C" __attribute__((visibility("default"))) const loom::CudaBackend* loom_cuda_backend() {
  static const loom::CudaBackend table = loom::cuda::make_table();
  return &table;
}

// tensor/norm.h — batch norm and layer norm kernels, forward and backward (no autograd:
// autograd/ops/norm.cpp wraps them). Batch norm comes both fused (one channel per thread, its
// data read while hot in cache) and in the pieces SyncBatchNorm reuses; see Note [Batch norm
// pieces]. Layout legend: x [N, C, *] seen as [N, C, S] (S = product of the spatial dims).
// Every output shaped like x (y, dx) takes x's memory format: a channels-last x gives
// channels-last results (Note [Memory formats], tensor/tensor.cpp). tensor/norm.cpp checks the
// arguments and switches on the device; tensor/cpu/norm.cpp and tensor/cuda/norm.cu hold the
// loops and the kernels.
#pragma once

#include <array>
#include <utility>

#include "tensor/tensor.h"

namespace loom::kernels {

// Note [Batch norm pieces]
// Training-mode batch norm needs two reductions per channel that a distributed version must
// allreduce between ranks, so each is its own kernel:
//   forward:  batch_norm_sums (local sum, sum of squares)  --allreduce-->
//             batch_norm_stats_from_sums (mean, invstd)     -> batch_norm_elemt (normalise)
//   backward: batch_norm_backward_reduce (local sum(dy), sum(dy x_hat))  --allreduce-->
//             batch_norm_backward_elemt (dx from the global sums and the global count)
// where x_hat = (x - mean) invstd and, per channel over the M values normalised together,
//   dx = weight invstd (dy - sum(dy) / M - x_hat sum(dy x_hat) / M).
// The local sums of backward_reduce are also dbias and dweight. On one device
// batch_norm_forward_train and batch_norm_backward do the same in one pass over the channels.

// Note [Batch norm with ReLU]
// A ResNet block ends its batch norms in relu(bn(x)) and relu(bn(x) + identity). Run as separate
// ops, the ReLU reads and writes the whole activation again in forward and reads two in
// backward, and the add reads two and writes one. The fused forward applies both as it writes y
// (BatchNormEpilogue), so y is written once. The fused backward takes the ReLU's gradient from
// the saved output: dy counts where y > 0 and is 0 elsewhere, as relu_backward. This mask is
// applied as dy is read by the sums and by dx, and the masked dy is written out as the
// residual's gradient in the same pass (NormGrads::dresidual). It is exact: the same y, the same
// test, the same results as the unfused ops up to the order of the sums (and, for a 16-bit x,
// one rounding of y where the ops round after the batch norm and again after the add).
// Per activation of a ResNet block (bn-relu, then bn-add-relu), forward reads or writes the
// whole tensor 6 fewer times and backward once fewer. The backward could save 2 more passes
// in bn-relu by recomputing the mask from x, but the recomputed y is only bit-equal to the
// forward's if both kernels round alike, so the mask is read from the saved y.
// SyncBatchNorm (the pieces above) stays unfused.

// The dtype of a batch norm's statistics, weight, bias and their gradients for an x of dtype x:
// float32 for a 16-bit x (computed in float, Note [16-bit arithmetic] in tensor/cuda/float16.h,
// as PyTorch's CUDA batch norm takes a half x with float32 parameters), x's own
// otherwise. Outputs shaped
// like x (y, dx) take x's dtype.
DType batch_norm_param_dtype(DType x);

// A channel's statistics: mean and invstd = 1 / sqrt(var + eps) normalise; the biased var and
// the count of values behind it give the unbiased variance of the running statistics.
struct BatchNormStats {
  Tensor mean;    // [C], batch_norm_param_dtype(x's dtype) unless asked for another
  Tensor invstd;  // [C]
  Tensor var;     // [C], biased
  int64_t count = 0;
};

struct BatchNormSums {
  Tensor sum;         // [C] float64, whatever x's dtype: E[x^2] - mean^2 keeps its precision
  Tensor sum_sq;      // [C] float64
  int64_t count = 0;  // N * S
};

// x [N, C, *] as [N, C, S], the layout of both devices' batch norm kernels: channel ch of batch
// b holds the S values from (b C + ch) S on. ShapeError names `op` when x has fewer than 2 dims.
struct ChannelLayout {
  int64_t n = 0, c = 0, s = 1;
  int64_t count() const { return n * s; }  // values per channel
  int64_t row(int64_t batch, int64_t channel) const { return (batch * c + channel) * s; }
  // The same values as stored in `format`. Channels-last keeps the C values of each (n, h, w)
  // side by side, which in this layout's terms is [N S, C, 1]: the kernels walk a channels-last
  // x in its own memory order, with no transposing copy, and write outputs in that format.
  ChannelLayout stored(MemoryFormat format) const {
    return format == MemoryFormat::kChannelsLast ? ChannelLayout{n * s, c, 1} : *this;
  }
};
ChannelLayout channel_layout(const char* op, const Tensor& x);

// Gradients of a normalisation (batch or layer norm); undefined where not asked for.
struct NormGrads {
  Tensor dx, dweight, dbias;
  Tensor dresidual;  // batch_norm_backward with a ReLU: dy where y > 0, else 0
};

// What the batch norm forward applies to y as it writes it (Note [Batch norm with ReLU]):
// y = relu(bn(x) + residual), each part optional. A residual has x's shape and dtype.
struct BatchNormEpilogue {
  Tensor residual;
  bool relu = false;
};

// Per-channel sum and sum of squares of x [N, C, *] (to allreduce across ranks).
BatchNormSums batch_norm_sums(const Tensor& x);
// Statistics from (possibly allreduced) sums over `count` values per channel, in `dtype`.
BatchNormStats batch_norm_stats_from_sums(const Tensor& sum, const Tensor& sum_sq, int64_t count,
                                          double eps, DType dtype);
// Statistics of x [N, C, *] itself (on the CPU two passes per channel, the mean then the
// centred squares; on CUDA one, Note [One-pass moments] in tensor/cuda/norm.cu), in
// batch_norm_param_dtype(x's dtype), or in `dtype`: SyncBatchNorm asks for float64, so that the
// ranks' moments are combined before any rounding (Note [SyncBatchNorm and world-size
// invariance], dist/sync_batchnorm.h). On the CPU they are computed in double and rounded once
// to `dtype`; CUDA computes them in batch_norm_param_dtype and converts.
BatchNormStats batch_norm_stats(const Tensor& x, double eps);
BatchNormStats batch_norm_stats(const Tensor& x, double eps, DType dtype);
// invstd = 1 / sqrt(var + eps) of given (running) variances.
Tensor batch_norm_invstd(const Tensor& var, double eps);
// running = (1 - momentum) running + momentum stat, with the unbiased variance
// var count / (count - 1) for running_var. Either may be undefined. Bumps their versions.
void batch_norm_update_running_stats_(const Tensor& running_mean, const Tensor& running_var,
                                      const BatchNormStats& stats, double momentum);
// y = (x - mean) invstd weight + bias per channel; weight and bias may be undefined. The
// epilogue (a residual, a ReLU) is applied to y as it is written. mean and invstd may be float64
// for any x: the CPU computes each channel's scale and shift in double from them as given (so
// the float64 batch_norm_stats of x give batch_norm_forward_train's y), CUDA in the parameter
// dtype.
Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias,
                        const BatchNormEpilogue& epilogue = {});
// Fused training forward: the batch's statistics, then y, one channel per thread.
std::pair<Tensor, BatchNormStats> batch_norm_forward_train(const Tensor& x, const Tensor& weight,
                                                           const Tensor& bias, double eps,
                                                           const BatchNormEpilogue& epilogue = {});

// Per-channel sum(dy) and sum(dy x_hat) (= dbias and dweight on one device), float64 whatever
// x's dtype, like BatchNormSums: the sums over ranks are taken before any rounding. The CPU
// keeps the double accumulators; CUDA rounds to batch_norm_param_dtype first.
std::pair<Tensor, Tensor> batch_norm_backward_reduce(const Tensor& dy, const Tensor& x,
                                                     const Tensor& mean, const Tensor& invstd);
// dx from the sums over `count` values per channel (Note [Batch norm pieces]). With sum_dy and
// sum_dy_xhat undefined the statistics are constants (eval mode): dx = dy weight invstd.
Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                 const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xhat, int64_t count);
// Fused single-device backward. training: through the batch statistics; otherwise mean and
// invstd are constants. need = {dx, dweight, dbias}. With relu_y (the output of a forward with
// a ReLU) dy is masked where relu_y is not positive, and need_dresidual writes that masked dy
// as dresidual (Note [Batch norm with ReLU]).
NormGrads batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& invstd, const Tensor& weight, bool training,
                              std::array<bool, 3> need, const Tensor& relu_y = Tensor(),
                              bool need_dresidual = false);

// Layer norm over the trailing dims whose product is `normalized_numel`: x seen as [M, D].
// layer_norm_rows gives M, or ShapeError naming `op` when D does not divide x.
int64_t layer_norm_rows(const char* op, const Tensor& x, int64_t normalized_numel);
struct LayerNormForward {
  Tensor out;
  Tensor mean;  // [M]
  Tensor rstd;  // [M], 1 / sqrt(var + eps)
};
LayerNormForward layer_norm_forward(const Tensor& x, int64_t normalized_numel, const Tensor& weight,
                                    const Tensor& bias, double eps);
// d layer_norm: dx = rstd (dx_hat - mean(dx_hat) - x_hat mean(dx_hat x_hat)), dx_hat = dy weight;
// dweight = sum_rows(dy x_hat); dbias = sum_rows(dy). need = {dx, dweight, dbias}.
NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& rstd, const Tensor& weight, int64_t normalized_numel,
                              std::array<bool, 3> need);

}  // namespace loom::kernels

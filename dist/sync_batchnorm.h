// dist/sync_batchnorm.h — SyncBatchNorm: batch normalisation whose training statistics are
// those of the global batch (every rank's share together), for models whose per-rank batches
// are too small for good statistics.
//
// Note [SyncBatchNorm]
// Forward: each rank computes its count, mean and biased variance per channel; one allgather
// brings every rank's triple to every rank, which combines them (counts weigh the means; the
// variance adds the spread of the means: var = sum n_r (var_r + (mean_r - mean)^2) / N), so
// ranks may hold different batch sizes, even zero. The running statistics take the global mean
// and unbiased variance, identically on every rank. The rows are combined where they are, by
// tensor ops, and N stays there too: with nccl the host does not wait for the device anywhere
// in a SyncBatchNorm (its wait() only orders streams; gloo stages CUDA tensors through the
// host). Only a rank holding at most one value per channel reads N, to check that the global
// batch holds more than one: where it does not, every rank is such a rank and raises
// ValueError at the same layer.
// Backward: dx needs the global sum(dy) and sum(dy x_hat) per channel (Note [Batch norm
// pieces]): one allreduce of the two, concatenated, divided by N on the device. dweight and
// dbias stay local: DDP's reducer averages them with the other gradients.
// Dtypes: a 16-bit CUDA x keeps its dtype with float32 statistics and parameters, in an
// autocast region too, as under batch_norm; on the CPU a region widens x to float32. The
// parameters must be in batch norm's dtype for x (DTypeError otherwise).
//
// Note [SyncBatchNorm and world-size invariance]
// One step at a global batch B gives the same gradients whether one process holds B (plain
// BatchNorm, the fused kernels) or W ranks hold B / W each (SyncBatchNorm), up to the float32
// sums that really are taken in another order (DDP's average, a convolution's weight gradient
// over each rank's samples): about 1e-6 relative in resnet18_cifar. Float32 statistics would
// give 1e-2, and the ReLU after each batch norm is why: it passes or drops an element's gradient
// by the sign of its input, so an input within a rounding error of 0 that has another sign on
// another world size moves its channel's dbias by that element's whole dy, and dx carries the
// change to every earlier layer. An ulp in a channel's mean or invstd moves y by about 1e-7,
// and the convolutions carry that on, growing, to the next batch norms; among the millions of
// ReLU inputs of a ResNet step a few lie that close to 0, and one sign changed suffices. So
// nothing is rounded to x's dtype before the ranks' values are combined, and each statistic is
// rounded once, where and as the fused kernels round theirs:
//   forward:  the local mean and variance are float64 (batch_norm_stats in kFloat64), combined
//             in float64; invstd is computed from the float64 variance; y is normalised with the
//             float64 mean and invstd (batch_norm_forward_train normalises with its double
//             moments), and backward gets them rounded to x's dtype (as the fused backward
//             does). The combined values depend on W only at 1e-16, so they round to the same
//             float32 values for every W (unless one lies that close to a rounding boundary),
//             and y, and each ReLU's mask, are those of one process.
//   backward: the local sum(dy) and sum(dy x_hat) are float64 (batch_norm_backward_reduce), and
//             stay float64 through the allreduce and into batch_norm_backward_elemt, as the
//             fused backward keeps its double sums for dx.
// On CUDA the kernels round the local moments and sums to float32 before they are widened, so
// there the statistics still differ by about an ulp between world sizes.
#pragma once

#include <memory>

#include "dist/process_group.h"
#include "nn/layers.h"

namespace loom::dist {

// The BatchNormSync of nn/layers.h over `group`.
std::shared_ptr<nn::BatchNormSync> make_batchnorm_sync(std::shared_ptr<ProcessGroup> group);

// Installs it into every BatchNorm2d of `model` (recursively), in place: the same parameters,
// buffers and key names; they print as SyncBatchNorm. Returns how many were converted.
int convert_sync_batchnorm(nn::Module& model, std::shared_ptr<ProcessGroup> group);

}  // namespace loom::dist

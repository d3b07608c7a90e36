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

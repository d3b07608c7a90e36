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
// tensor ops, and N stays there too: on GPUs the host does not wait for the device anywhere in
// a SyncBatchNorm (nccl's wait() only orders streams). So a global batch of one value per
// channel raises its ValueError at once on the CPU, and at the next wait on a GPU (Note
// [Deferred device checks]).
// Backward: dx needs the global sum(dy) and sum(dy x_hat) per channel (Note [Batch norm
// pieces]): one allreduce of the two, concatenated, divided by N on the device. dweight and
// dbias stay local: DDP's reducer averages them with the other gradients.
// Dtypes are batch_norm's: a 16-bit CUDA x keeps its dtype with float32 statistics and
// parameters, in an autocast region too; on the CPU a region widens x to float32.
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

// dist/job.cpp — join_job and rank_device.

#include "dist/job.h"

#include "dist/nccl_process_group.h"
#include "tensor/accelerator.h"
#include "tensor/error.h"

namespace loom::dist {

Device rank_device(const JobOptions& o, int local_rank) {
  if (o.gpus == 0) return kCPU;
  const int visible = cuda_device_count();
  LOOM_CHECK(visible > 0, DeviceError, "--gpus ", o.gpus, ": no CUDA device is visible (",
             why_no_cuda_device(), ")");
  LOOM_CHECK(o.backend != "nccl" || o.gpus <= visible, ValueError, "--gpus ", o.gpus, ": only ",
             visible,
             " CUDA devices are visible, and nccl needs one per rank (--backend gloo "
             "lets ranks share a GPU)");
  const Device device{DeviceType::CUDA, local_rank % visible};
  set_cuda_device(device);
  return device;
}

Job join_job(const JobOptions& o) {
  Job job;
  LOOM_CHECK(o.backend == "gloo" || o.gpus > 0, ValueError, "--backend ", o.backend,
             " needs GPUs (--gpus N); CPU workers use gloo");
  if (!launched_by_launcher()) {
    job.device = rank_device(o, 0);
    return job;
  }
  const Environment env = environment_from_env();
  job.rank = env.rank;
  job.world = env.world_size;
  job.local_rank = env.local_rank;
  job.device = rank_device(o, env.local_rank);
  job.store = rendezvous(env, o.timeout);
  job.group = o.backend == "nccl" ? make_nccl_process_group(job.store, env.rank, env.world_size)
                                  : make_gloo_process_group(job.store, env.rank, env.world_size);
  return job;
}

}  // namespace loom::dist

// dist/job.cpp — join_job and rank_device.

#include "dist/job.h"

#include <cstdlib>

#include "dist/nccl_process_group.h"
#include "tensor/accelerator.h"
#include "tensor/error.h"

namespace loom::dist {

std::vector<int> local_rank_devices(int local_world_size, int visible, const std::string& backend) {
  LOOM_CHECK(local_world_size >= 1 && visible >= 1, ValueError,
             "local_rank_devices: ", local_world_size, " local ranks and ", visible,
             " visible GPUs");
  std::vector<int> devices(local_world_size);
  std::string map;
  for (int r = 0; r < local_world_size; ++r) {
    devices[r] = r % visible;
    map += detail::str(r ? ", " : "", "LOCAL_RANK ", r, " -> cuda:", devices[r]);
  }
  LOOM_CHECK(backend != "nccl" || local_world_size <= visible, ValueError,
             "nccl needs a GPU per "
             "local rank, and ",
             local_world_size, " local ranks would share ", visible, " visible GPU(s): ", map,
             " (CUDA_VISIBLE_DEVICES=",
             std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "unset",
             "); start at most ", visible,
             " ranks on this machine (--nproc-per-node, --gpus), "
             "make more GPUs visible, or use --backend gloo, which lets ranks share a GPU");
  return devices;
}

void check_same_on_every_rank(const Job& job, const std::string& what, const std::string& value) {
  if (!job.parallel() || job.store == nullptr) return;
  const std::string key = "same/" + what + "/";
  job.store->set(key + std::to_string(job.rank), value);
  if (job.rank == 0) return;
  const Bytes theirs = job.store->get(key + "0");
  const std::string zero(theirs.begin(), theirs.end());
  LOOM_CHECK(zero == value, DistError, "rank ", job.rank, " (local rank ", job.local_rank,
             ") loaded other ", what, " than rank 0: ", value, " here, ", zero,
             " on rank 0; the hosts' copies differ (run loomrun --doctor with the same flags to "
             "compare them file by file)");
}

Device rank_device(const JobOptions& o, int local_rank) {
  if (o.gpus == 0) return kCPU;
  const int visible = cuda_device_count();
  LOOM_CHECK(visible > 0, DeviceError, "--gpus ", o.gpus, ": no CUDA device is visible (",
             why_no_cuda_device(), ")");
  if (launched_by_launcher())
    local_rank_devices(environment_from_env().local_world_size, visible, o.backend);
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
  // Its own connection, so that a rank blocked on the store still learns of a failure.
  if (std::getenv("LOOM_AGENT_STORE") != nullptr)
    job.watch = std::make_shared<JobWatch>(rendezvous(env, std::chrono::seconds(5)));
  job.group = o.backend == "nccl" ? make_nccl_process_group(job.store, env.rank, env.world_size)
                                  : make_gloo_process_group(job.store, env.rank, env.world_size);
  return job;
}

}  // namespace loom::dist

// dist/job.h — joining a training job from the environment: the rank, the world, the device
// this rank trains on, the store and the process group, in one call. A process started without
// a launcher is rank 0 of a world of one, with no store and no group.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "dist/process_group.h"
#include "dist/store.h"
#include "tensor/device.h"

namespace loom::dist {

struct JobOptions {
  int gpus = 0;                  // 0: train on the CPU; N: local rank r on cuda:(r % visible)
  std::string backend = "gloo";  // gloo | nccl (nccl needs gpus > 0)
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  // the rendezvous's
};

// The job this process belongs to (one rank of one when not launched).
struct Job {
  int rank = 0, world = 1, local_rank = 0;
  Device device = kCPU;  // where this rank trains
  std::shared_ptr<Store> store;
  std::shared_ptr<ProcessGroup> group;
  bool parallel() const { return group != nullptr; }
  bool leader() const { return rank == 0; }
};

// Reads the launcher's environment (RANK, WORLD_SIZE, ..., Note [Launcher]) when there is one,
// picks the rank's device (and makes it current), meets the other ranks at the store and makes
// the process group. ValueError for nccl without GPUs; DeviceError when --gpus finds none.
Job join_job(const JobOptions& options);

// With gpus > 0, local rank r trains on cuda:(r % visible GPUs): one GPU each under nccl, or
// several ranks sharing a GPU under gloo (which stages CUDA tensors through host memory). The
// device is made current. kCPU for gpus == 0.
Device rank_device(const JobOptions& options, int local_rank);

}  // namespace loom::dist

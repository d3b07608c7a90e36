// dist/job.h — joining a training job from the environment: the rank, the world, the device
// this rank trains on, the store and the process group, in one call. A process started without
// a launcher is rank 0 of a world of one, with no store and no group.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist/health.h"
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
  std::shared_ptr<JobWatch> watch;  // under loomrun: the launchers' failure reports
  bool parallel() const { return group != nullptr; }
  bool leader() const { return rank == 0; }
};

// Reads the launcher's environment (RANK, WORLD_SIZE, ..., Note [Launcher]) when there is one,
// picks the rank's device (and makes it current), meets the other ranks at the store and makes
// the process group. ValueError for nccl without GPUs; DeviceError when --gpus finds none.
Job join_job(const JobOptions& options);

// Start-up agreement: every rank publishes `value` (a fingerprint of what it loaded) under
// `what`, and each compares it with rank 0's; DistError on a rank whose value differs, naming
// both. Cheap (one set and one get), so that data that differs between hosts is caught before
// the first step instead of as a silently wrong model (`loomrun --doctor` looks closer).
void check_same_on_every_rank(const Job& job, const std::string& what, const std::string& value);

// The devices of a machine's local ranks: local rank r trains on cuda:(r % visible). Under nccl
// each local rank needs a GPU of its own: ValueError with the LOCAL_RANK -> device map when two
// would share one (the classic "every rank runs out of memory on cuda:0").
std::vector<int> local_rank_devices(int local_world_size, int visible, const std::string& backend);

// With gpus > 0, local rank r trains on cuda:(r % visible GPUs): one GPU each under nccl, or
// several ranks sharing a GPU under gloo (which stages CUDA tensors through host memory). The
// device is made current. kCPU for gpus == 0.
Device rank_device(const JobOptions& options, int local_rank);

}  // namespace loom::dist

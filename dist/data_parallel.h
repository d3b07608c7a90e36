// dist/data_parallel.h — DataParallel, PyTorch's single-process form of data parallelism: one
// process, one replica of the module per device, the batch scattered across them and everything
// gathered back on the first. Where there is no GPU each "device" is a replica on a thread of
// its own; with GPUs, a replica per GPU (each run from a thread). It is here to be compared with
// DDP (bench/strategies_bench, docs/inside.md): the first device does all of the traffic and holds
// more than the others.
//
// Note [DataParallel]
// Each forward, with D devices (replica 0 is the module itself, as in PyTorch, so that its
// in-place updates, batch norm's running statistics, are kept; the others' are lost):
//   1. broadcast: the module's parameters and buffers are copied into replicas 1 .. D-1, and
//      each submodule's training mode with them;
//   2. scatter: the batch is cut along dim 0 into D nearly equal chunks (fewer replicas run when
//      the batch has fewer samples than devices);
//   3. parallel apply: each replica runs its chunk on its own thread, in the caller's grad mode
//      and autocast region, with the caller's threads shared among them;
//   4. gather: the outputs are concatenated along dim 0 on device 0 (differentiably: backward
//      sends each replica the rows of the gradient that are its own).
// At the end of backward the replicas' gradients are summed into the module's (PyTorch's
// Broadcast backward, a reduce onto device 0) and the replicas' released. The module's
// gradients are then those of one process on the whole batch, so any optimizer of the module's
// parameters trains it as one process would. All of steps 1, 2, 4 and the reduction go through
// device 0: per step it sends (D-1) copies of the weights and receives (D-1) copies of the
// gradients, where DDP's allreduce moves 2 (D-1)/D of them per rank; and device 0 alone holds
// the whole batch, the whole output and the optimizer. DataParallelReport counts both.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace loom::dist {

// What the last forward and backward moved and held (bytes), for reports.
struct DataParallelReport {
  int devices = 0;              // replicas that ran
  int64_t broadcast_bytes = 0;  // weights and buffers copied to replicas 1 .. D-1
  int64_t scatter_bytes = 0;    // the chunks of replicas 1 .. D-1
  int64_t gather_bytes = 0;     // the outputs of replicas 1 .. D-1
  int64_t reduce_bytes = 0;     // the gradients of replicas 1 .. D-1, summed onto device 0
  int64_t through_device0() const {
    return broadcast_bytes + scatter_bytes + gather_bytes + reduce_bytes;
  }
  // Held: device 0 the whole input and output besides its replica; another device its chunk.
  int64_t device0_activation_bytes = 0;  // the batch and the gathered output
  int64_t other_activation_bytes = 0;    // the largest chunk and its output
  // One line for a run's end: "DataParallel's last step through device 0 (...): weights out
  // 0.68 MiB, inputs out ..., outputs in ..., gradients in ...; device 0 held ...".
  std::string describe() const;
};

// The devices of `count` replicas around a model on `device`: cuda:0 .. cuda:count-1 when it is
// a GPU (PyTorch's default device_ids: every visible GPU it is given), else `device` each time.
std::vector<Device> data_parallel_devices(Device device, int count);

class DataParallel : public nn::Module {
 public:
  // `module` is replica 0; make_replica() builds each of the other devices - 1 (the same
  // architecture: their state's names, shapes and dtypes are checked against the module's).
  // ValueError for fewer than 1 device, a null module or factory, or a replica that differs.
  DataParallel(nn::ModulePtr module, int devices, std::function<nn::ModulePtr()> make_replica);
  // PyTorch's device_ids: replica i on device_ids[i] (GPUs), the module on device_ids[0]
  // (ValueError where it is not); the chunks are copied to their replicas' devices and the
  // outputs and gradients back to device_ids[0], differentiably.
  DataParallel(nn::ModulePtr module, std::vector<Device> device_ids,
               std::function<nn::ModulePtr()> make_replica);
  ~DataParallel() override;

  Tensor forward(const Tensor& input) override;

  nn::Module& module() { return *module_; }
  int devices() const { return static_cast<int>(replicas_.size()); }
  const DataParallelReport& last_report() const { return report_; }

 private:
  void reduce_gradients();  // at the end of backward

  nn::ModulePtr module_;
  std::vector<nn::ModulePtr> replicas_;        // [0] is module_
  std::vector<Device> devices_;                // replica i's
  std::vector<std::vector<Tensor>> params_;    // per replica, those that require grad
  std::vector<std::pair<Tensor, int>> hooks_;  // replica parameter, hook handle
  bool reduction_queued_ = false;
  int active_ = 0;  // replicas that ran in the last forward
  DataParallelReport report_;
};

}  // namespace loom::dist

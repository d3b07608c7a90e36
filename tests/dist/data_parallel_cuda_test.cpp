// tests/dist/data_parallel_cuda_test.cpp — DataParallel with a replica per GPU (Note
// [DataParallel]): the chunks travel to cuda:1, the outputs and gradients back to cuda:0, and
// the steps are those of one process on the whole batch. Skips without a GPU; with one GPU both
// replicas share cuda:0 (the copies are then between replicas on one device).

#include "ddp_fixtures.h"
#include "dist/data_parallel.h"
#include "multiprocess.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace loom {
namespace {

using dist::DataParallel;
using test::expect_same_parameters;
using test::global_batch;
using test::small_net;

TEST(DataParallelOnGpus, AReplicaPerGpuMatchesOneProcess) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  const Device first{DeviceType::CUDA, 0};
  const Device second{DeviceType::CUDA, cuda_device_count() > 1 ? 1 : 0};
  auto on_gpu = [&](uint64_t seed) {
    auto net = small_net(seed, {.batch_norm = true});
    net->to(first);
    return net;
  };
  auto net = on_gpu(1);
  DataParallel dp(net, std::vector<Device>{first, second}, [&] { return on_gpu(5); });
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  auto reference = on_gpu(1);
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  // Batch norm in eval mode in both (batch statistics per chunk are another computation).
  (*net)[1]->eval();
  (*reference)[1]->eval();
  for (int step = 0; step < 3; ++step) {
    const auto [x, y] = global_batch(step);
    opt.zero_grad();
    cross_entropy(dp.forward(x.to(first)), y.to(first)).backward();
    opt.step();
    ref_opt.zero_grad();
    cross_entropy(reference->forward(x.to(first)), y.to(first)).backward();
    ref_opt.step();
    expect_same_parameters(*net, *reference, 1e-9);
  }
  EXPECT_EQ(dp.last_report().devices, 2);
  for (const Tensor& p : net->parameters()) EXPECT_EQ(p.device(), first);
}

TEST(DataParallelOnGpus, TheModuleMustBeOnTheFirstDevice) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  auto net = small_net(1);  // on the CPU
  EXPECT_LOOM_ERROR(DataParallel(net, std::vector<Device>{Device(DeviceType::CUDA, 0)}, nullptr),
                    ValueError, {"DataParallel", "cpu", "cuda:0"});
}

}  // namespace
}  // namespace loom

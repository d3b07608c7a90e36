// tests/dist/ddp_cuda_test.cpp — the data-parallel parity of tests/dist/ddp_test.cpp with the
// model and batches on GPUs: two ranks on half batches take the same steps as one process on the
// whole batch (on the CPU, in float64), through gloo (the ranks share cuda:0; host staging) and,
// where there are two GPUs, nccl; with and without SyncBatchNorm; and SyncBatchNorm alone in
// float16 and with a global batch too small. Skips without a GPU.

#include <functional>
#include <memory>
#include <numeric>

#include "autograd/autocast.h"
#include "ddp_fixtures.h"
#include "dist/ddp.h"
#include "dist/nccl_process_group.h"
#include "dist/sync_batchnorm.h"
#include "multiprocess.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace loom::dist {
namespace {

using test::Rank;
using test::tensors_close;

// World 2: rank r trains on samples [4r, 4r + 4) of each step's batch on `device`, the reference
// on all 8 on the CPU; the parameters agree after every step.
void check_parity(const std::string& backend, bool sync_bn) {
  test::run_ranks(
      2,
      [&](Rank& r) {
        const int gpus = cuda_device_count();
        const Device device{DeviceType::CUDA, backend == "nccl" ? r.rank % gpus : 0};
        set_cuda_device(device);
        const ProcessGroupOptions options{.timeout = std::chrono::seconds(60)};
        auto group = backend == "nccl"
                         ? make_nccl_process_group(r.store, r.rank, r.world_size, options)
                         : make_gloo_process_group(r.store, r.rank, r.world_size, options);
        auto net = test::small_net(1, {.batch_norm = sync_bn});
        net->to(device);
        if (sync_bn) {
          EXPECT_EQ(convert_sync_batchnorm(*net, group), 1);
        }
        DistributedDataParallel ddp(net, group, {.first_bucket_bytes = 256, .bucket_bytes = 512});
        optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
        auto reference = test::small_net(1, {.batch_norm = sync_bn});
        optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
        for (int step = 0; step < 4; ++step) {
          const auto batch = test::global_batch(step);
          const auto [x, y] = test::share(batch, r.rank, r.world_size);
          opt.zero_grad();
          cross_entropy(ddp.forward(x.to(device)), y.to(device)).backward();
          opt.step();
          ref_opt.zero_grad();
          cross_entropy(reference->forward(batch.first), batch.second).backward();
          ref_opt.step();
          const NamedTensors mine = net->named_parameters(), ref = reference->named_parameters();
          for (size_t i = 0; i < mine.size(); ++i)
            EXPECT_TRUE(tensors_close(mine[i].second.to(kCPU), ref[i].second, 1e-8, 1e-10))
                << backend << " step " << step << " " << mine[i].first;
        }
      },
      std::chrono::seconds(120), std::chrono::seconds(60));
}

TEST(DDPOnGpus, GlooRanksSharingAGpuMatchOneProcess) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  check_parity("gloo", /*sync_bn=*/false);
}

TEST(DDPOnGpus, GlooWithSyncBatchNormMatchesOneProcess) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  check_parity("gloo", /*sync_bn=*/true);
}

TEST(DDPOnGpus, NcclRanksOnTwoGpusMatchOneProcess) {
  LOOM_SKIP_WITHOUT_GPUS(2);
  check_parity("nccl", /*sync_bn=*/false);
  check_parity("nccl", /*sync_bn=*/true);
}

// Two ranks that share cuda:0 through gloo (host staging), each running body with its group.
void two_gloo_ranks_on_one_gpu(
    const std::function<void(Rank&, const std::shared_ptr<ProcessGroup>&)>& body) {
  test::run_ranks(
      2,
      [&](Rank& r) {
        body(r, make_gloo_process_group(r.store, r.rank, r.world_size,
                                        {.timeout = std::chrono::seconds(60)}));
      },
      std::chrono::seconds(120), std::chrono::seconds(60));
}

// SyncBatchNorm on a GPU in an autocast region: a float16 x stays float16, as under the plain
// batch norm, and y and dx match one batch norm over the whole batch. Two ranks (gloo) share
// cuda:0.
TEST(SyncBatchNormOnGpus, Float16InAnAutocastRegionMatchesOneBatchNorm) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  two_gloo_ranks_on_one_gpu([](Rank& r, const std::shared_ptr<ProcessGroup>& group) {
    const Device device{DeviceType::CUDA, 0};
    manual_seed(10);
    const Tensor whole = randn({6, 3, 4, 4}).to(device).to(kFloat16);
    const Tensor dy = randn({6, 3, 4, 4}).to(device).to(kFloat16);
    nn::BatchNorm2d sync_bn(3), plain(3);
    sync_bn.to(device);
    plain.to(device);
    convert_sync_batchnorm(sync_bn, group);
    const int64_t begin = r.rank == 0 ? 0 : 2, count = r.rank == 0 ? 2 : 4;
    Tensor x = whole.narrow(0, begin, count).contiguous().requires_grad_();
    Tensor x_all = whole.clone().requires_grad_();
    Tensor y, y_all;
    {
      autocast::Guard region(kFloat16);
      y = sync_bn.forward(x);
      y_all = plain.forward(x_all);
    }
    EXPECT_EQ(y.dtype(), kFloat16);
    EXPECT_EQ(y_all.dtype(), kFloat16);
    (y.to(kFloat32) * dy.narrow(0, begin, count).to(kFloat32)).sum().backward();
    (y_all.to(kFloat32) * dy.to(kFloat32)).sum().backward();
    EXPECT_TRUE(tensors_close(y.to(kCPU), y_all.narrow(0, begin, count).to(kCPU), 1e-2, 1e-2));
    EXPECT_TRUE(tensors_close(x.grad().to(kCPU), x_all.grad().narrow(0, begin, count).to(kCPU),
                              1e-2, 1e-2));
    EXPECT_TRUE(
        tensors_close(sync_bn.running_var.to(kCPU), plain.running_var.to(kCPU), 1e-4, 1e-4));
  });
}

// A global batch of one value per channel: the ranks holding at most one value read the global
// count, so every rank raises in the same forward, and a second SyncBatchNorm layer (the next
// collective) is never reached by one rank alone.
TEST(SyncBatchNormOnGpus, OneValuePerChannelRaisesOnEveryRank) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  two_gloo_ranks_on_one_gpu([](Rank& r, const std::shared_ptr<ProcessGroup>& group) {
    const Device device{DeviceType::CUDA, 0};
    nn::BatchNorm2d bn(2);
    bn.to(device);
    convert_sync_batchnorm(bn, group);
    const Tensor before = bn.running_var.to(kCPU);
    const Tensor x = randn({r.rank == 0 ? 1 : 0, 2, 1, 1}).to(device);
    EXPECT_LOOM_ERROR(bn.forward(x), ValueError,
                      {"SyncBatchNorm", "more than 1 value per channel", "got 1"});
    EXPECT_TRUE(tensors_close(bn.running_var.to(kCPU), before, 0, 0));
  });
}

}  // namespace
}  // namespace loom::dist

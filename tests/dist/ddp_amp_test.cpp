// tests/dist/ddp_amp_test.cpp — data parallelism with mixed precision, in real processes: two
// ranks on half batches under autocast (float16 with a GradScaler, or bfloat16) follow one
// process on the whole batch; a rank that alone finds an inf makes every rank skip the step;
// DDPOptions::comm_dtype sends the gradients in 16 bits.

#include <gtest/gtest.h>

#include "autograd/autocast.h"
#include "ddp_fixtures.h"
#include "dist/ddp.h"
#include "dist/sync_batchnorm.h"
#include "multiprocess.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "test_util.h"

namespace loom::dist {
namespace {

using test::expect_same_parameters;
using test::global_batch;
using test::gloo_group;
using test::Rank;
using test::run_ranks;
using test::share;
using test::tensors_close;

// Convolution, batch norm and linear layers in float32: the layers autocast treats differently.
std::shared_ptr<nn::Sequential> small_net(uint64_t seed, bool batch_norm = false) {
  return test::small_net(
      seed, {.channels = 8, .hidden = 16, .dtype = kFloat32, .batch_norm = batch_norm});
}

// One training step as the app takes it (Note [resnet18_cifar in mixed precision]).
void train_step(nn::Module& net, optim::SGD& opt, optim::GradScaler& scaler, DType dtype,
                const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss;
  {
    autocast::Guard amp(dtype);
    loss = cross_entropy(net.forward(x), y);
  }
  scaler.scale(loss).backward();
  scaler.step(opt);
  scaler.update();
}

// Two ranks against one process on the whole batch, 6 steps of SGD with momentum. The ranks'
// products see half the samples, so their 16-bit roundings differ from the reference's: the
// parameters agree to the 16-bit precision, not bit for bit.
void check_parity(DType dtype, DType comm_dtype, bool sync_bn = false) {
  run_ranks(
      2,
      [dtype, comm_dtype, sync_bn](Rank& r) {
        set_num_threads(1);
        auto net = small_net(r.rank == 0 ? 1 : 99, sync_bn);  // DDP starts every rank from rank 0's
        auto group = gloo_group(r);
        if (sync_bn) {
          EXPECT_EQ(convert_sync_batchnorm(*net, group), 1);
        }
        DistributedDataParallel ddp(net, group, {.comm_dtype = comm_dtype});
        optim::SGD opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
        optim::GradScaler scaler({.enabled = dtype == kFloat16});
        scaler.set_found_inf_agreement(found_inf_agreement(group));
        auto reference = small_net(1, sync_bn);
        optim::SGD ref_opt(reference->parameters(), {.lr = 0.05, .momentum = 0.9});
        optim::GradScaler ref_scaler({.enabled = dtype == kFloat16});
        for (int step = 0; step < 6; ++step) {
          const auto batch = global_batch(step, kFloat32);
          const auto [x, y] = share(batch, r.rank, r.world_size);
          train_step(ddp, opt, scaler, dtype, x, y);
          train_step(*reference, ref_opt, ref_scaler, dtype, batch.first, batch.second);
        }
        EXPECT_EQ(scaler.get_scale(), ref_scaler.get_scale());
        const double tol = dtype == kBFloat16 || comm_dtype == kBFloat16 ? 2e-2 : 3e-3;
        expect_same_parameters(*net, *reference, tol);
        // Looser than the ranks' agreement with each other, which is exact:
        Tensor w = net->named_parameters()[0].second.clone();
        Tensor w0 = w.clone();
        group->broadcast(w0, 0)->wait();
        EXPECT_TRUE(tensors_close(w, w0, 0, 0));
      },
      std::chrono::seconds(60));
}

TEST(DDPAmp, Float16WithLossScalingTwoRanksMatchOneProcess) { check_parity(kFloat16, kFloat32); }
TEST(DDPAmp, BFloat16TwoRanksMatchOneProcess) { check_parity(kBFloat16, kFloat32); }
TEST(DDPAmp, Float16GradientsOnTheWireMatchOneProcess) { check_parity(kFloat16, kFloat16); }
TEST(DDPAmp, WithSyncBatchNormTwoRanksMatchOneProcess) {
  check_parity(kBFloat16, kFloat32, /*sync_bn=*/true);
}

TEST(DDPAmp, AnInfOnOneRankMakesEveryRankSkipTheStep) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto net = small_net(1);
    auto group = gloo_group(r);
    DistributedDataParallel ddp(net, group);
    optim::SGD opt(net->parameters(), {.lr = 0.05});
    optim::GradScaler scaler;
    scaler.set_found_inf_agreement(found_inf_agreement(group));
    const Tensor before = net->named_parameters()[0].second.clone();
    const auto [x, y] = share(global_batch(0, kFloat32), r.rank, r.world_size);
    Tensor loss;
    {
      autocast::Guard amp(kFloat16);
      loss = cross_entropy(ddp.forward(x), y);
    }
    scaler.scale(loss).backward();
    // After the allreduce, an overflow local to rank 1 (as in a gradient DDP does not reduce).
    if (r.rank == 1) kernels::fill_(net->named_parameters()[0].second.grad(), INFINITY);
    EXPECT_FALSE(scaler.step(opt));  // on rank 0 too, whose gradients are finite
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_TRUE(tensors_close(net->named_parameters()[0].second, before, 0, 0));
  });
}

TEST(DDPAmp, CommDtypeChoosesTheCompressionHook) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto group = gloo_group(r);
    EXPECT_EQ(DistributedDataParallel(small_net(1), group).reducer().comm_hook().name(),
              "allreduce");
    EXPECT_EQ(DistributedDataParallel(small_net(1), group, {.comm_dtype = kFloat16})
                  .reducer()
                  .comm_hook()
                  .name(),
              "fp16_compress");
    DistributedDataParallel bf16(small_net(1), group, {.comm_dtype = kBFloat16});
    EXPECT_EQ(bf16.reducer().comm_hook().name(), "bf16_compress");
    EXPECT_NE(bf16.bucket_plan().find("comm hook bf16_compress"), std::string::npos);
    EXPECT_LOOM_ERROR(DistributedDataParallel(small_net(1), group, {.comm_dtype = kInt64}),
                      ValueError, {"comm_dtype", "int64"});
  });
}

}  // namespace
}  // namespace loom::dist

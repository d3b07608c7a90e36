// tests/dist/horovod_test.cpp — the Horovod-style DistributedOptimizer (Note [Horovod-style
// averaging]): ranks on shards of the batch match one process on the whole batch, the fusion
// buffers follow the threshold, and the start-up broadcasts.

#include "dist/horovod.h"

#include <numeric>

#include "ddp_fixtures.h"
#include "multiprocess.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace loom {
namespace {

using dist::DistributedOptimizer;
using test::expect_same_parameters;
using test::global_batch;
using test::gloo_group;
using test::Rank;
using test::run_ranks;
using test::share;
using test::small_net;

// W ranks on 8 / W samples each against one process on all 8: 5 steps of SGD with momentum,
// every rank's model and momentum first made rank 0's by the broadcasts.
void check_parity(int world) {
  run_ranks(
      world,
      [](Rank& r) {
        set_num_threads(1);
        auto group = gloo_group(r);
        auto net = small_net(r.rank == 0 ? 1 : 77 + static_cast<uint64_t>(r.rank));
        dist::broadcast_parameters(*group, net->state_dict());
        DistributedOptimizer opt(
            std::make_unique<optim::SGD>(net->parameters(),
                                         optim::SGDOptions{.lr = 0.1, .momentum = 0.9}),
            group, {.fusion_bytes = 256});  // several fusion buffers for this small net
        dist::broadcast_optimizer_state(*group, opt);
        auto reference = small_net(1);
        optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
        expect_same_parameters(*net, *reference, 0);
        for (int step = 0; step < 5; ++step) {
          const auto batch = global_batch(step);
          const auto [x, y] = share(batch, r.rank, r.world_size);
          opt.zero_grad();
          cross_entropy(net->forward(x), y).backward();
          opt.step();
          ref_opt.zero_grad();
          cross_entropy(reference->forward(batch.first), batch.second).backward();
          ref_opt.step();
          expect_same_parameters(*net, *reference, 1e-10);
        }
        // 256-byte buffers over the float64 parameters in order: the conv weight (576 B) alone,
        // its bias (32) alone (the next would overflow it), the linear weight (1728) alone, then
        // its bias (48), the last weight (144) and bias (24) together.
        EXPECT_EQ(opt.last_report().buffers, 4);
        int64_t bytes = 0;
        for (const Tensor& p : net->parameters()) bytes += p.nbytes();
        EXPECT_EQ(opt.last_report().bytes, bytes);
      },
      std::chrono::seconds(60));
}

TEST(DistributedOptimizer, TwoRanksOnShardsMatchOneProcessOnTheWholeBatch) { check_parity(2); }
TEST(DistributedOptimizer, FourRanksOnShardsMatchOneProcessOnTheWholeBatch) { check_parity(4); }

TEST(DistributedOptimizer, FusionThresholdSetsTheBuffersAndMissingGradientsAreZeros) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto group = gloo_group(r);
    auto net = small_net(1);
    const size_t count = net->parameters().size();
    for (const int64_t fusion : {int64_t{0}, int64_t{128} << 20}) {
      DistributedOptimizer opt(
          std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions{.lr = 0.0}), group,
          {.fusion_bytes = fusion});
      opt.zero_grad();
      // Only rank 1 computes a gradient: rank 0's parameters get zeros, and the average is half
      // of rank 1's.
      Tensor expected;
      if (r.rank == 1) {
        const auto batch = global_batch(0);
        cross_entropy(net->forward(batch.first), batch.second).backward();
        expected = net->parameters().back().grad().clone() / 2.0;
      }
      opt.step();
      for (const Tensor& p : net->parameters()) EXPECT_TRUE(p.grad().defined());
      EXPECT_EQ(opt.last_report().buffers, fusion == 0 ? static_cast<int64_t>(count) : 1);
      Tensor last = net->parameters().back().grad().clone();
      Tensor other = last.clone();
      group->broadcast(other, 1)->wait();
      EXPECT_TRUE(test::tensors_close(last, other, 0, 0));  // both ranks hold the average
      if (r.rank == 1) {
        EXPECT_TRUE(test::tensors_close(last, expected, 1e-12, 1e-12));
      }
    }
    // synchronize() before step() (to clip the averages): the step does not average again.
    DistributedOptimizer opt(
        std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions{.lr = 0.0}), group);
    group->reset_counters();
    opt.synchronize();
    opt.step();
    EXPECT_EQ(group->counters().at("allreduce").calls, 1);
    opt.step();  // a step of its own averages
    EXPECT_EQ(group->counters().at("allreduce").calls, 2);
    EXPECT_LOOM_ERROR(DistributedOptimizer(nullptr, group), ValueError,
                      {"DistributedOptimizer", "null"});
    EXPECT_LOOM_ERROR(DistributedOptimizer(std::make_unique<optim::SGD>(
                                               net->parameters(), optim::SGDOptions{.lr = 0.1}),
                                           group, {.fusion_bytes = -1}),
                      ValueError, {"DistributedOptimizer", "fusion_bytes", "-1"});
  });
}

TEST(DistributedOptimizer, BroadcastOptimizerStateGivesEveryRankRankZerosMomentum) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto group = gloo_group(r);
    auto net = small_net(1);
    optim::SGD opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
    if (r.rank == 0) {  // rank 0 alone has trained: momentum buffers and a different lr
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        const auto batch = global_batch(step);
        cross_entropy(net->forward(batch.first), batch.second).backward();
        opt.step();
      }
      opt.set_lr(0.01);
    }
    dist::broadcast_optimizer_state(*group, opt);
    EXPECT_DOUBLE_EQ(opt.lr(), 0.01);
    NamedTensors state;
    optim::Metadata meta;
    opt.save_state(state, meta, "");
    ASSERT_FALSE(state.empty());
    for (const auto& [name, t] : state) {
      Tensor theirs = t.contiguous().clone();
      group->broadcast(theirs, 0)->wait();
      EXPECT_TRUE(test::tensors_close(t, theirs, 0, 0)) << name;
    }
    EXPECT_EQ(opt.param_steps(0), 2);
  });
}

}  // namespace
}  // namespace loom

// tests/dist/data_parallel_test.cpp — DataParallel (Note [DataParallel]): replicas on threads
// match one process on the whole batch, and the report counts what went through device 0.

#include "dist/data_parallel.h"

#include "ddp_fixtures.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace loom {
namespace {

using dist::DataParallel;
using test::expect_same_parameters;
using test::global_batch;
using test::small_net;

int64_t bytes_of(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (const Tensor& t : ts) n += static_cast<int64_t>(t.nbytes());
  return n;
}

// D replicas against one process on all 8 samples: 5 steps of SGD with momentum on the
// module's parameters. With 3 devices the chunks are 3, 3 and 2.
void check_parity(int devices) {
  set_num_threads(2);
  auto net = small_net(1);
  // The replicas start from other weights: the broadcast makes them the module's.
  uint64_t seed = 50;
  DataParallel dp(net, devices, [&seed] { return small_net(seed++); });
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  auto reference = small_net(1);
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 5; ++step) {
    const auto [x, y] = global_batch(step);
    opt.zero_grad();
    cross_entropy(dp.forward(x), y).backward();
    opt.step();
    ref_opt.zero_grad();
    cross_entropy(reference->forward(x), y).backward();
    ref_opt.step();
    expect_same_parameters(*net, *reference, 1e-10);
  }
  const dist::DataParallelReport& report = dp.last_report();
  const int64_t weights = bytes_of(net->parameters());
  EXPECT_EQ(report.devices, devices);
  EXPECT_EQ(report.broadcast_bytes, (devices - 1) * weights);  // no buffers in this net
  EXPECT_EQ(report.reduce_bytes, (devices - 1) * weights);
  const int64_t chunk = (8 + devices - 1) / devices;  // the first replica's rows
  EXPECT_EQ(report.scatter_bytes, (8 - chunk) * 2 * 5 * 5 * 8);
  EXPECT_EQ(report.gather_bytes, (8 - chunk) * 3 * 8);
  EXPECT_EQ(report.device0_activation_bytes, 8 * (2 * 5 * 5 + 3) * 8);
  EXPECT_EQ(report.other_activation_bytes, chunk * (2 * 5 * 5 + 3) * 8);
}

TEST(DataParallel, TwoReplicasMatchOneProcessOnTheWholeBatch) { check_parity(2); }
TEST(DataParallel, ThreeReplicasOnUnevenChunksMatchOneProcess) { check_parity(3); }
TEST(DataParallel, FourReplicasMatchOneProcessOnTheWholeBatch) { check_parity(4); }

// A model that trains with its batch norm in eval mode (--freeze-bn): the replicas follow each
// submodule's mode, so the steps are again those of one process.
TEST(DataParallel, ReplicasFollowTheModulesModes) {
  set_num_threads(2);
  auto net = small_net(1, {.batch_norm = true});
  net->train();
  (*net)[1]->eval();  // the batch norm
  DataParallel dp(net, 2, [] { return small_net(9, {.batch_norm = true}); });
  auto reference = small_net(1, {.batch_norm = true});
  reference->train();
  (*reference)[1]->eval();
  const auto [x, y] = global_batch(0);
  cross_entropy(dp.forward(x), y).backward();
  cross_entropy(reference->forward(x), y).backward();
  const NamedTensors mine = net->named_parameters(), theirs = reference->named_parameters();
  for (size_t i = 0; i < mine.size(); ++i)
    EXPECT_TRUE(test::tensors_close(mine[i].second.grad(), theirs[i].second.grad(), 1e-10, 1e-12))
        << mine[i].first;
}

TEST(DataParallel, FewerSamplesThanDevicesRunFewerReplicas) {
  auto net = small_net(1);
  DataParallel dp(net, 4, [] { return small_net(2); });
  const auto [x, y] = global_batch(0);
  Tensor out = dp.forward(x.narrow(0, 0, 2));
  EXPECT_EQ(out.sizes(), (Shape{2, 3}));
  EXPECT_EQ(dp.last_report().devices, 2);
  // Outside autograd no reduction is queued, and the output is still the module's.
  NoGradGuard no_grad;
  EXPECT_TRUE(test::tensors_close(dp.forward(x), net->forward(x), 1e-12, 1e-12));
}

TEST(DataParallel, ErrorsAreTypedAndComeBackFromTheReplicaThreads) {
  auto net = small_net(1);
  EXPECT_LOOM_ERROR(DataParallel(net, 0, [] { return small_net(2); }), ValueError,
                    {"DataParallel", "at least 1 device", "0"});
  EXPECT_LOOM_ERROR(DataParallel(net, 2, nullptr), ValueError, {"DataParallel", "factory"});
  EXPECT_LOOM_ERROR(DataParallel(net, 2, [] { return small_net(2, {.channels = 5}); }), ValueError,
                    {"DataParallel", "replica 1", "differs"});
  DataParallel dp(net, 2, [] { return small_net(2); });
  // A batch of the wrong shape fails inside every replica's convolution; the error comes back.
  EXPECT_THROW(dp.forward(ones({4, 3, 5, 5}, kFloat64)), ShapeError);
}

}  // namespace
}  // namespace loom

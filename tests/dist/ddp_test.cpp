// tests/dist/ddp_test.cpp — DistributedDataParallel, SyncBatchNorm and DistributedSampler with
// real processes (tests/dist/multiprocess.h): two ranks on half batches take the same steps as
// one process on the whole batch; the bucket plan, its rebuild in the order gradients arrived,
// buckets launched while backward still runs, gradient views, no_sync, find_unused_parameters,
// the compression hooks, the broadcasts, and SyncBatchNorm with uneven (and empty) shares.
// Everything is float64 so that parities are tight, and the references are computed inside the
// ranks (the parent process never starts threads: it forks).

#include "dist/ddp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <thread>

#include "autograd/function.h"
#include "ddp_fixtures.h"
#include "dist/sampler.h"
#include "dist/sync_batchnorm.h"
#include "multiprocess.h"
#include "optim/checkpoint.h"
#include "optim/sgd.h"
#include "scratch_dir.h"
#include "tensor/copy.h"
#include "test_util.h"

namespace loom::dist {
namespace {

using test::expect_same_parameters;
using test::global_batch;
using test::gloo_group;
using test::Rank;
using test::run_ranks;
using test::share;
using test::small_net;
using test::tensors_close;

// W ranks on 8 / W samples each against one process on all 8: 5 steps of SGD with momentum on
// shuffled batches, with the model and optimizer saved and loaded back between steps 2 and 3.
// With channels_last the ranks' replicas store their convolution weight channels-last (the
// reference stays row-major): the bucket views take that order; converted after DDP was built
// (convert_late), the views stay row-major and the gradients still reach them.
void check_parity(int world, bool sync_bn = false, bool channels_last = false,
                  bool convert_late = false) {
  const test::ScratchDir dir;  // the ranks' checkpoints (Note [Test scratch directories])
  run_ranks(
      world,
      [&dir, sync_bn, channels_last, convert_late](Rank& r) {
        set_num_threads(1);
        auto group = gloo_group(r);
        // Different seeds per rank: DDP must start every replica from rank 0's weights.
        auto net = small_net(r.rank == 0 ? 1 : 77 + static_cast<uint64_t>(r.rank),
                             {.batch_norm = sync_bn});
        if (sync_bn) {
          EXPECT_EQ(convert_sync_batchnorm(*net, group), 1);
        }
        if (channels_last && !convert_late) net->to(MemoryFormat::kChannelsLast);
        DistributedDataParallel ddp(net, group, {.first_bucket_bytes = 512, .bucket_bytes = 1024});
        if (channels_last && convert_late) net->to(MemoryFormat::kChannelsLast);
        optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
        auto reference = small_net(1, {.batch_norm = sync_bn});  // one process on the whole batch
        optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
        expect_same_parameters(*net, *reference, 0);
        EXPECT_EQ(ddp.reducer().buckets().size(), 2u);
        const std::string path = dir.file("rank" + std::to_string(r.rank) + ".safetensors");
        for (int step = 0; step < 5; ++step) {
          if (step == 3) {  // save and load back, in the middle of training
            optim::save_checkpoint(path, *net, opt, nullptr, {.step = step});
            optim::load_checkpoint(path, *net, &opt);
            std::remove(path.c_str());
          }
          auto batch = global_batch(step);
          // Shuffle the global batch (the same permutation on every rank).
          Generator g(500 + static_cast<uint64_t>(step));
          const Generator::State saved = default_generator().state();
          default_generator().set_state(g.state());
          const Tensor perm = argmax(rand({8, 8}), 1);  // any index tensor will do
          default_generator().set_state(saved);
          std::vector<int64_t> order(8);
          std::iota(order.begin(), order.end(), 0);
          const std::vector<int64_t> keys = perm.to_vector<int64_t>();
          std::stable_sort(order.begin(), order.end(),
                           [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
          const Tensor index = tensor<int64_t>(order, {8});
          batch = {index_select(batch.first, 0, index), index_select(batch.second, 0, index)};
          const auto [x, y] = share(batch, r.rank, r.world_size);
          opt.zero_grad();
          cross_entropy(ddp.forward(x), y).backward();
          // The gradients are views into the bucket buffers.
          for (const Tensor& p : net->parameters()) {
            bool in_bucket = false;
            for (const Bucket& b : ddp.reducer().buckets())
              in_bucket = in_bucket || p.grad().is_alias_of(b.buffer);
            EXPECT_TRUE(in_bucket);
            if (p.dim() == 4 && !convert_late) {
              EXPECT_EQ(suggest_memory_format(p.grad()), suggest_memory_format(p));
              EXPECT_EQ(suggest_memory_format(p),
                        channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous);
            }
          }
          opt.step();
          ref_opt.zero_grad();
          cross_entropy(reference->forward(batch.first), batch.second).backward();
          ref_opt.step();
          expect_same_parameters(*net, *reference, 1e-10);
        }
        EXPECT_EQ(ddp.reducer().iterations(), 5);
        EXPECT_EQ(ddp.reducer().timeline().launched.size(), ddp.reducer().buckets().size());
      },
      std::chrono::seconds(60));
}

TEST(DDP, TwoRanksOnShardsMatchOneProcessOnTheWholeBatch) { check_parity(2); }
TEST(DDP, FourRanksOnShardsMatchOneProcessOnTheWholeBatch) { check_parity(4); }
TEST(DDP, WithSyncBatchNormTwoRanksMatchOneProcess) { check_parity(2, /*sync_bn=*/true); }
TEST(DDP, ChannelsLastReplicasMatchOneRowMajorProcess) {
  check_parity(2, /*sync_bn=*/false, /*channels_last=*/true);
}
TEST(DDP, ReplicasConvertedAfterDdpWasBuiltStillAverage) {
  check_parity(2, /*sync_bn=*/false, /*channels_last=*/true, /*convert_late=*/true);
}

// Replicas that differ in what they hold, or in how they store it, are refused on every rank
// before anything is exchanged, with the first tensor that differs named.
TEST(DDP, ReplicasThatDifferAreRefusedOnEveryRank) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto group = gloo_group(r);
    auto layout = small_net(1);
    if (r.rank == 1) layout->to(MemoryFormat::kChannelsLast);
    EXPECT_LOOM_ERROR(
        DistributedDataParallel(layout, group), ValueError,
        {"DistributedDataParallel", "'0.weight'", "memory format", "channels-last on rank 1"});
    auto shape = small_net(1, {.hidden = r.rank == 0 ? 6 : 7});
    EXPECT_LOOM_ERROR(DistributedDataParallel(shape, group), ValueError,
                      {"'3.weight'", "shape", "on rank 1"});
    auto dtype = small_net(1, {.dtype = r.rank == 0 ? kFloat64 : kFloat32});
    EXPECT_LOOM_ERROR(DistributedDataParallel(dtype, group), ValueError,
                      {"'0.weight'", "dtype float64 on rank 0, float32 on rank 1"});
    // Same elements in other sizes: only the shape's hash tells them apart.
    auto sizes = r.rank == 0 ? nn::make<nn::Linear>(3, 2) : nn::make<nn::Linear>(2, 3);
    EXPECT_LOOM_ERROR(DistributedDataParallel(sizes, group), ValueError,
                      {"'weight'", "the same 6 elements in other sizes on rank 1"});
    // Frozen on one rank only: the ranks would plan different buckets.
    auto frozen = small_net(1);
    if (r.rank == 1) frozen->parameters()[0].requires_grad_(false);
    EXPECT_LOOM_ERROR(DistributedDataParallel(frozen, group), ValueError,
                      {"'0.weight'", "requires grad on rank 0, frozen on rank 1"});
    auto count = small_net(1, {.batch_norm = r.rank == 1});
    EXPECT_LOOM_ERROR(DistributedDataParallel(count, group), ValueError,
                      {"rank 1's model holds 11 tensors", "rank 0's 6"});
    // The same model stored alike passes, and the group still works.
    auto same = small_net(1 + static_cast<uint64_t>(r.rank));
    DistributedDataParallel ddp(same, group);
    expect_same_parameters(*same, *small_net(1), 0);
  });
}

TEST(DDP, GradientsAreAveragedOverRanks) {
  run_ranks(3, [](Rank& r) {
    set_num_threads(1);
    auto model = std::make_shared<nn::Linear>(1, 1, /*bias=*/false);
    model->to(kFloat64);
    DistributedDataParallel ddp(model, gloo_group(r));
    // d sum(w x) / dw = x = r on rank r: the mean over ranks 0, 1, 2 is 1.
    sum(ddp.forward(full({1, 1}, static_cast<double>(r.rank), kFloat64))).backward();
    EXPECT_TRUE(test::values_are(model->weight.grad(), {1.0}, 0));
  });
}

TEST(DDP, BucketsFollowReverseRegistrationOrderAndArePrintable) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto net = small_net(1);
    DistributedDataParallel ddp(net, gloo_group(r),
                                {.first_bucket_bytes = 256, .bucket_bytes = 1200});
    const auto& buckets = ddp.reducer().buckets();
    // The last registered parameter (the last Linear's bias) is the first of bucket 0.
    const NamedTensors params = net->named_parameters();
    ASSERT_FALSE(buckets.empty());
    EXPECT_EQ(buckets[0].params.front(), params.size() - 1);
    size_t expected = params.size();
    for (const Bucket& b : buckets)
      for (size_t i : b.params) EXPECT_EQ(i, --expected);  // reverse order, every one once
    EXPECT_EQ(expected, 0u);
    // Parameters join a bucket until it reaches its cap: the first one (256 bytes) closes with
    // the 1728-byte weight of the first Linear; the convolution goes to the next.
    ASSERT_EQ(buckets.size(), 2u);
    EXPECT_EQ(buckets[0].params, (std::vector<size_t>{5, 4, 3, 2}));
    EXPECT_EQ(buckets[0].bytes(), (3 + 18 + 6 + 216) * 8);
    EXPECT_EQ(buckets[1].params, (std::vector<size_t>{1, 0}));
    const std::string plan = ddp.bucket_plan();
    EXPECT_NE(plan.find("DDP bucket plan"), std::string::npos);
    EXPECT_NE(plan.find("5.weight"), std::string::npos) << plan;
    EXPECT_NE(plan.find("[3, 6]"), std::string::npos) << plan;
    // After the first iteration the plan is rebuilt from the order gradients arrived.
    const auto [x, y] = share(global_batch(0), r.rank, r.world_size);
    cross_entropy(ddp.forward(x), y).backward();
    EXPECT_NE(ddp.bucket_plan().find("rebuilt"), std::string::npos);
  });
}

// The flattened plan: every bucket's parameters, bucket after bucket.
std::vector<size_t> plan_order(const Reducer& reducer) {
  std::vector<size_t> order;
  for (const Bucket& b : reducer.buckets())
    order.insert(order.end(), b.params.begin(), b.params.end());
  return order;
}

// Registered a, b, c. Rank 0's forward runs c, a, b, so its gradients arrive from b, a, c;
// rank 1's runs a, b, c, so its arrive from c, b, a (reverse registration: the first plan).
class Reordered : public nn::Module {
 public:
  explicit Reordered(bool c_first) : Module("Reordered"), c_first_(c_first) {
    a = register_module("a", nn::make<nn::Linear>(4, 4));
    b = register_module("b", nn::make<nn::Linear>(4, 4));
    c = register_module("c", nn::make<nn::Linear>(4, 4));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    return c_first_ ? b->forward(a->forward(c->forward(x))) : c->forward(b->forward(a->forward(x)));
  }
  std::shared_ptr<nn::Linear> a, b, c;

 private:
  bool c_first_;
};

// Note [The bucketed reducer], step 4: after the first iteration the buckets hold the
// parameters in the order their gradients arrived on rank 0, on every rank, and keep it.
TEST(DDP, RebuiltBucketsFollowRankZerosArrivalOrder) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    std::vector<size_t> arrival;  // indices into the reducer's parameters, as their hooks fired
    manual_seed(4);
    auto net = std::make_shared<Reordered>(/*c_first=*/r.rank == 0);
    // A Linear is 160 bytes (weight 128, bias 32): one bucket each.
    DistributedDataParallel ddp(net, gloo_group(r),
                                {.first_bucket_bytes = 100, .bucket_bytes = 100});
    const NamedTensors params = net->named_parameters();  // the reducer's parameters, in order
    ASSERT_EQ(params.size(), 6u);
    for (size_t i = 0; i < params.size(); ++i)
      params[i].second.register_post_accumulate_grad_hook(
          [&arrival, i](Tensor&) { arrival.push_back(i); });
    EXPECT_EQ(plan_order(ddp.reducer()), (std::vector<size_t>{5, 4, 3, 2, 1, 0}));
    EXPECT_EQ(ddp.reducer().buckets().size(), 3u);

    sum(ddp.forward(ones({2, 4}, kFloat64))).backward();
    ASSERT_EQ(arrival.size(), params.size());
    std::string mine;
    for (size_t i : arrival) mine += std::to_string(i) + " ";
    if (r.rank == 0) r.store->set("test/arrival", mine);
    const std::string rank0 = r.store->get_string("test/arrival");
    std::vector<size_t> expected;
    std::istringstream words(rank0);
    for (size_t i; words >> i;) expected.push_back(i);
    // The two ranks' orders differ (else the broadcast would go untested), and rank 0's is
    // not the first plan's (else the rebuild would).
    if (r.rank == 1) {
      EXPECT_NE(mine, rank0);
    }
    ASSERT_NE(expected, (std::vector<size_t>{5, 4, 3, 2, 1, 0})) << rank0;
    EXPECT_EQ(plan_order(ddp.reducer()), expected)
        << "rank 0's gradients arrived as " << rank0 << "\n"
        << ddp.bucket_plan();
    for (const Bucket& b : ddp.reducer().buckets())
      for (size_t pos = 0; pos < b.params.size(); ++pos)
        EXPECT_EQ(b.names[pos], params[b.params[pos]].first);

    // Rebuilt once: a second iteration keeps the plan, and the gradients still reach it.
    net->zero_grad();
    sum(ddp.forward(ones({2, 4}, kFloat64))).backward();
    EXPECT_EQ(plan_order(ddp.reducer()), expected);
    for (const auto& [name, p] : params) {
      bool in_bucket = false;
      for (const Bucket& b : ddp.reducer().buckets())
        in_bucket = in_bucket || p.grad().is_alias_of(b.buffer);
      EXPECT_TRUE(in_bucket) << name;
    }
  });
}

// Passes its input through; its backward sleeps `seconds` first: a layer whose backward is slow,
// deterministically.
class SlowBackward : public nn::Module {
 public:
  explicit SlowBackward(double seconds) : Module("SlowBackward"), seconds_(seconds) {}
  Tensor forward(const Tensor& x) override {
    return autograd::record(
        "slow_backward", kernels::clone(x), {x}, {},
        [seconds = seconds_](const autograd::Grads& dout, autograd::Saved&, autograd::Grads& dx) {
          std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
          dx[0] = dout[0];
        });
  }

 private:
  double seconds_;
};

// The overlap (Note [The bucketed reducer], step 2): a bucket whose gradients are all in starts
// its allreduce at once, while backward is still computing the gradients of earlier layers. The
// second layer's backward sleeps kSlow: the buckets of the layers after it must have been
// launched at least half that before backward ended; the first layer's bucket only after it.
TEST(DDP, FullBucketsAreLaunchedWhileBackwardStillRuns) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    constexpr double kSlow = 0.3;
    manual_seed(6);
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(nn::make<nn::Linear>(8, 8));  // "0": its gradients come after the sleep
    net->push_back(std::make_shared<SlowBackward>(kSlow));
    for (int i = 0; i < 3; ++i) net->push_back(nn::make<nn::Linear>(8, 8));  // "2", "3", "4"
    net->to(kFloat64);
    // A Linear is 576 bytes (weight 512, bias 64): one bucket each.
    DistributedDataParallel ddp(net, gloo_group(r),
                                {.first_bucket_bytes = 512, .bucket_bytes = 512});
    for (int step = 0; step < 2; ++step) {  // the first plan, then the rebuilt one
      SCOPED_TRACE("step " + std::to_string(step));
      const std::vector<Bucket>& buckets = ddp.reducer().buckets();
      ASSERT_EQ(buckets.size(), 4u) << ddp.bucket_plan();
      std::vector<bool> after_slow;  // per bucket: only parameters of layers after the sleep
      for (const Bucket& b : buckets)
        after_slow.push_back(std::none_of(b.names.begin(), b.names.end(), [](const std::string& n) {
          return n.rfind("0.", 0) == 0;
        }));
      EXPECT_EQ(std::count(after_slow.begin(), after_slow.end(), true), 3);

      net->zero_grad();
      sum(ddp.forward(full({2, 8}, 1.0 + r.rank, kFloat64))).backward();
      const ReducerTimeline& t = ddp.reducer().timeline();
      ASSERT_EQ(t.launched.size(), after_slow.size());  // the plan this backward used
      EXPECT_GE(t.backward_seconds, kSlow);
      for (size_t b = 0; b < t.launched.size(); ++b) {
        EXPECT_LE(t.launched[b], t.completed[b]) << "bucket " << b;
        if (after_slow[b]) {
          EXPECT_GE(t.backward_seconds - t.launched[b], kSlow / 2)
              << "bucket " << b << " was launched at " << t.launched[b] << " s, backward ended at "
              << t.backward_seconds << " s";
        } else {
          EXPECT_GE(t.launched[b], kSlow) << "bucket " << b;
        }
      }
      EXPECT_GT(t.overlap(), 0.0);
    }
  });
}

TEST(DDP, NoSyncAccumulatesLocallyUntilTheNextSynchronisedBackward) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto net = small_net(1);
    DistributedDataParallel ddp(net, gloo_group(r));
    auto reference = small_net(1);
    // Two micro-batches: the first under no_sync, the second synchronised: the gradients are
    // the average over ranks of each rank's sum over both micro-batches.
    for (int micro = 0; micro < 2; ++micro) {
      const auto [x, y] = share(global_batch(micro), r.rank, r.world_size);
      if (micro == 0) {
        auto guard = ddp.no_sync();
        cross_entropy(ddp.forward(x), y).backward();
      } else {
        cross_entropy(ddp.forward(x), y).backward();
      }
    }
    for (int micro = 0; micro < 2; ++micro) {
      const auto batch = global_batch(micro);
      cross_entropy(reference->forward(batch.first), batch.second).backward();
    }
    const NamedTensors a = net->named_parameters(), b = reference->named_parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(tensors_close(a[i].second.grad(), b[i].second.grad(), 1e-10, 1e-12))
          << a[i].first;
  });
}

// Uses its second Linear only when asked to.
class Branchy : public nn::Module {
 public:
  Branchy() : Module("Branchy") {
    a = register_module("a", nn::make<nn::Linear>(4, 2));
    b = register_module("b", nn::make<nn::Linear>(4, 2));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    return use_b ? a->forward(x) + b->forward(x) : a->forward(x);
  }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = false;
};

TEST(DDP, UnusedParametersAreNamedOrFoundWhenAsked) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto group = gloo_group(r);
    {
      manual_seed(3);
      auto model = std::make_shared<Branchy>();
      DistributedDataParallel ddp(model, group);
      EXPECT_LOOM_ERROR(sum(ddp.forward(ones({2, 4}, kFloat64))).backward(), ValueError,
                        {"b.weight", "b.bias", "find_unused_parameters"});
    }
    manual_seed(3);
    auto model = std::make_shared<Branchy>();
    DistributedDataParallel ddp(model, group, {.find_unused_parameters = true});
    for (int step = 0; step < 2; ++step) {
      model->zero_grad();
      Tensor x = full({2, 4}, static_cast<double>(r.rank + 1), kFloat64);
      sum(ddp.forward(x)).backward();
      // d sum(x W^T + c)/dW = column sums of x: ranks give 2 and 4 per element, average 3.
      EXPECT_TRUE(test::values_are(model->a->weight.grad(), std::vector<double>(8, 3.0)));
      EXPECT_TRUE(test::values_are(model->b->weight.grad(), std::vector<double>(8, 0.0)));
    }
    model->use_b = true;  // now b is used: its gradient arrives and is averaged too
    model->zero_grad();
    sum(ddp.forward(full({2, 4}, static_cast<double>(r.rank + 1), kFloat64))).backward();
    EXPECT_TRUE(test::values_are(model->b->weight.grad(), std::vector<double>(8, 3.0)));
  });
}

TEST(DDP, CompressionHooksSendSixteenBitsAndSumInFloat32) {
  for (const bool bf16 : {false, true}) {
    run_ranks(2, [bf16](Rank& r) {
      set_num_threads(1);
      manual_seed(5);
      auto model = std::make_shared<nn::Linear>(16, 8);  // float32, as trained
      DistributedDataParallel ddp(model, gloo_group(r));
      ddp.register_comm_hook(bf16 ? bf16_compress_hook() : fp16_compress_hook());
      manual_seed(10 + static_cast<uint64_t>(r.rank));
      Tensor x = randn({4, 16});
      sum(ddp.forward(x)).backward();
      // The exact average: each rank's gradient is the column sums of its x.
      const Tensor mine = sum(x, {0});
      EXPECT_TRUE(model->weight.grad().defined());
      Tensor total = mine.clone();
      ddp.group().allreduce(total, ReduceOp::Sum)->wait();
      const Tensor expected = (total / 2.0).unsqueeze(0).expand({8, 16});
      const double tol = bf16 ? 2e-2 : 2e-3;  // 8 or 11 bits of mantissa
      EXPECT_TRUE(tensors_close(model->weight.grad(), expected, tol, tol));
    });
  }
}

TEST(DDP, BuffersFollowRankZeroBeforeEachForward) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    class WithBuffer : public nn::Module {
     public:
      WithBuffer() : Module("WithBuffer") {
        fc = register_module("fc", nn::make<nn::Linear>(2, 2));
        count = register_buffer("count", zeros({3}));
      }
      Tensor forward(const Tensor& x) override { return fc->forward(x); }
      std::shared_ptr<nn::Linear> fc;
      Tensor count;
    };
    auto model = std::make_shared<WithBuffer>();
    DistributedDataParallel ddp(model, gloo_group(r));
    model->count.fill_(r.rank == 0 ? 7.0 : -1.0);
    sum(ddp.forward(ones({1, 2}))).backward();
    EXPECT_TRUE(test::values_are(model->count, {7, 7, 7}));
    // State dict keys carry PyTorch's "module." prefix.
    EXPECT_EQ(ddp.state_dict().front().first, "module.count");
  });
}

TEST(SyncBatchNorm, UnevenSharesMatchOneBatchNormOnTheWholeBatch) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto group = gloo_group(r);
    manual_seed(8);
    Tensor whole = randn({8, 3, 2, 2}, kFloat64) * 2.0 + 1.0;
    Tensor dy = randn({8, 3, 2, 2}, kFloat64);
    // Rank 0 holds 3 samples, rank 1 holds 5.
    const int64_t begin = r.rank == 0 ? 0 : 3, count = r.rank == 0 ? 3 : 5;
    nn::BatchNorm2d sync_bn(3), plain(3);
    sync_bn.to(kFloat64);
    plain.to(kFloat64);
    EXPECT_EQ(convert_sync_batchnorm(sync_bn, group), 1);
    EXPECT_EQ(sync_bn.type_name(), "SyncBatchNorm");
    Tensor x = whole.narrow(0, begin, count).contiguous().requires_grad_();
    Tensor y = sync_bn.forward(x);
    (y * dy.narrow(0, begin, count)).sum().backward();

    Tensor x_all = whole.clone().requires_grad_();
    Tensor y_all = plain.forward(x_all);
    (y_all * dy).sum().backward();
    EXPECT_TRUE(tensors_close(y, y_all.narrow(0, begin, count), 1e-10, 1e-12));
    EXPECT_TRUE(tensors_close(x.grad(), x_all.grad().narrow(0, begin, count), 1e-10, 1e-12));
    EXPECT_TRUE(tensors_close(sync_bn.running_mean, plain.running_mean, 1e-12, 1e-12));
    EXPECT_TRUE(tensors_close(sync_bn.running_var, plain.running_var, 1e-12, 1e-12));
    // dweight and dbias are this rank's share; summed over ranks they are the whole batch's.
    Tensor dw = sync_bn.weight.grad().clone();
    group->allreduce(dw, ReduceOp::Sum)->wait();
    EXPECT_TRUE(tensors_close(dw, plain.weight.grad(), 1e-10, 1e-12));
  });
}

TEST(SyncBatchNorm, ARankWithNoSamplesStillTakesPart) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto group = gloo_group(r);
    manual_seed(9);
    Tensor whole = randn({4, 2, 3, 3}, kFloat64);
    nn::BatchNorm2d bn(2), plain(2);
    bn.to(kFloat64);
    plain.to(kFloat64);
    convert_sync_batchnorm(bn, group);
    Tensor x = (r.rank == 0 ? whole : empty({0, 2, 3, 3}, kFloat64)).clone().requires_grad_();
    Tensor y = bn.forward(x);
    y.sum().backward();
    plain.forward(whole);
    EXPECT_EQ(y.size(0), r.rank == 0 ? 4 : 0);
    EXPECT_TRUE(tensors_close(bn.running_mean, plain.running_mean, 1e-12, 1e-12));
    EXPECT_TRUE(tensors_close(bn.running_var, plain.running_var, 1e-12, 1e-12));
  });
}

// One value per channel over all ranks has no variance to normalise by: every rank raises. So
// does x beside parameters of another dtype.
TEST(SyncBatchNorm, OneValuePerChannelOverAllRanksRaisesOnEveryRank) {
  run_ranks(2, [](Rank& r) {
    set_num_threads(1);
    auto group = gloo_group(r);
    nn::BatchNorm2d bn(2);
    convert_sync_batchnorm(bn, group);
    // Parameters in another dtype than batch norm takes for x: refused before any collective.
    EXPECT_LOOM_ERROR(bn.forward(randn({2, 2, 1, 1}, kFloat64)), DTypeError,
                      {"SyncBatchNorm", "weight", "float64", "float32"});
    const Tensor before = bn.running_var.clone();
    const Tensor x = randn({r.rank == 0 ? 1 : 0, 2, 1, 1});
    EXPECT_LOOM_ERROR(bn.forward(x), ValueError,
                      {"SyncBatchNorm", "more than 1 value per channel", "got 1",
                       "[" + std::to_string(r.rank == 0 ? 1 : 0) + ", 2, 1, 1]"});
    EXPECT_TRUE(tensors_close(bn.running_var, before, 0, 0));  // raised before the update
  });
}

TEST(DistributedSampler, EqualDisjointSharesThatCoverTheDataset) {
  const int64_t n = 10;
  for (const bool drop_last : {false, true}) {
    std::vector<int> seen(n, 0);
    size_t per_rank = 0;
    for (int rank = 0; rank < 3; ++rank) {
      DistributedSampler s(n, rank, 3, /*shuffle=*/true, /*seed=*/4, drop_last);
      const std::vector<int64_t> mine = s.indices(2);
      EXPECT_EQ(static_cast<int64_t>(mine.size()), s.size());
      if (rank == 0) per_rank = mine.size();
      EXPECT_EQ(mine.size(), per_rank);  // every rank the same count: matched collectives
      for (int64_t i : mine) ++seen[static_cast<size_t>(i)];
      EXPECT_NE(s.indices(2), s.indices(3));  // another epoch, another order
      EXPECT_EQ(s.indices(2), DistributedSampler(n, rank, 3, true, 4, drop_last).indices(2));
    }
    EXPECT_EQ(per_rank, drop_last ? 3u : 4u);
    int total = 0, missing = 0;
    for (int c : seen) {
      total += c;
      missing += c == 0;
    }
    EXPECT_EQ(total, drop_last ? 9 : 12);  // padded by repeating, or cut
    EXPECT_EQ(missing, drop_last ? 1 : 0);
  }
  DistributedSampler ordered(5, 1, 2, /*shuffle=*/false);
  EXPECT_EQ(ordered.indices(0), (std::vector<int64_t>{1, 3, 0}));
  EXPECT_LOOM_ERROR(DistributedSampler(5, 2, 2), ValueError, {"DistributedSampler", "rank=2"});
}

}  // namespace
}  // namespace loom::dist

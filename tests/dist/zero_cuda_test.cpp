// tests/dist/zero_cuda_test.cpp — the ZeRO stages (Note [ZeRO stages], Note [FSDP units]) with
// the model on GPUs: two ranks of a small GPT with AdamW and clipping end, after four steps,
// with the weights DDP gives on the same GPUs, in each stage (float64, 1e-10), and move the
// bytes the stage should. Through gloo with both ranks on cuda:0 (host staging) and, where
// there are two GPUs, nccl. Skips without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/multiprocess.h"
#include "dist/nccl_process_group.h"
#include "dist/zero.h"
#include "loom.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "test_util.h"

namespace loom::dist {
namespace {

constexpr int64_t kVocab = 23;

struct Result {
  NamedTensors params;  // on the CPU
  CollectiveCounters last_step;
  int64_t state_bytes = 0;
};

// Four steps of DDP (stage 0) or ZeRO-`stage` on `device`; rank r takes its half of each
// step's batch of 8 sequences.
Result train(test::Rank& r, const std::shared_ptr<ProcessGroup>& group, Device device, int stage) {
  manual_seed(7);
  nn::GPTConfig c;
  c.vocab_size = kVocab;
  c.block_size = 8;
  c.n_embd = 12;
  c.n_layer = 2;
  c.n_head = 2;
  auto model = std::make_shared<nn::GPT>(c);
  model->to(kFloat64);
  model->to(device);
  std::vector<Tensor> params = model->parameters();
  auto adamw = [](std::vector<Tensor> ps, std::vector<bool> decay) {
    return std::make_unique<optim::AdamW>(
        std::move(ps), optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .decay = decay});
  };
  auto over_pieces = [&](std::vector<Tensor> pieces, const std::vector<size_t>& owner) {
    std::vector<bool> decay;
    for (size_t i : owner) decay.push_back(params[i].dim() >= 2);
    return adamw(std::move(pieces), decay);
  };
  std::shared_ptr<DistributedDataParallel> ddp;
  std::shared_ptr<FullyShardedDataParallel> fsdp;
  ZeroRedundancyOptimizer* zero = nullptr;
  std::unique_ptr<optim::Optimizer> optimizer;
  if (stage == 3) {
    fsdp = std::make_shared<FullyShardedDataParallel>(model, group);
    std::vector<size_t> owner;
    for (const ShardPiece& piece : fsdp->pieces()) owner.push_back(piece.param);
    optimizer = over_pieces(fsdp->optimizer_params(), owner);
  } else {
    ddp = std::make_shared<DistributedDataParallel>(model, group);
    params = ddp->reducer().params();
    if (stage == 0) {
      std::vector<bool> decay;
      for (const Tensor& p : params) decay.push_back(p.dim() >= 2);
      optimizer = adamw(params, decay);
    } else {
      auto z =
          std::make_unique<ZeroRedundancyOptimizer>(*ddp, over_pieces, ZeroOptions{.stage = stage});
      zero = z.get();
      optimizer = std::move(z);
    }
  }
  nn::Module& net = fsdp ? static_cast<nn::Module&>(*fsdp) : *ddp;
  Result result;
  for (int step = 0; step < 4; ++step) {
    Generator g(900 + static_cast<uint64_t>(step));
    const Generator::State saved = default_generator().state();
    default_generator().set_state(g.state());
    const Tensor x = randint(0, kVocab, {8, 8}), y = randint(0, kVocab, {8, 8});
    default_generator().set_state(saved);
    const int64_t n = 8 / r.world_size;
    group->reset_counters();
    optimizer->zero_grad();
    const Tensor logits = net.forward(x.narrow(0, r.rank * n, n).contiguous().to(device));
    cross_entropy(logits.reshape({-1, kVocab}),
                  y.narrow(0, r.rank * n, n).contiguous().reshape({-1}).to(device))
        .backward();
    if (zero)
      zero->clip_grad_norm_(0.5);
    else if (fsdp)
      fsdp->clip_grad_norm_(0.5);
    else
      optim::clip_grad_norm_(params, 0.5);
    optimizer->step();
    result.last_step = group->counters();
  }
  std::unique_ptr<FullyShardedDataParallel::FullParams> gathered;
  if (fsdp) gathered = fsdp->summon_full_params();
  for (const auto& [name, p] : model->named_parameters())
    result.params.emplace_back(name, p.to(kCPU));
  result.state_bytes = zero ? zero->inner().state_bytes() : optimizer->state_bytes();
  return result;
}

int64_t bus(const CollectiveCounters& c, const std::string& op) {
  auto it = c.find(op);
  return it == c.end() ? 0 : it->second.bus_bytes;
}

void check_stages(const std::string& backend) {
  test::run_ranks(
      2,
      [&](test::Rank& r) {
        const int gpus = cuda_device_count();
        const Device device{DeviceType::CUDA, backend == "nccl" ? r.rank % gpus : 0};
        set_cuda_device(device);
        const ProcessGroupOptions options{.timeout = std::chrono::seconds(60)};
        auto group = backend == "nccl"
                         ? make_nccl_process_group(r.store, r.rank, r.world_size, options)
                         : make_gloo_process_group(r.store, r.rank, r.world_size, options);
        const Result ddp = train(r, group, device, 0);
        for (int stage = 1; stage <= 3; ++stage) {
          const Result zero = train(r, group, device, stage);
          ASSERT_EQ(zero.params.size(), ddp.params.size());
          for (size_t i = 0; i < ddp.params.size(); ++i)
            EXPECT_TRUE(
                test::tensors_close(zero.params[i].second, ddp.params[i].second, 1e-10, 1e-12))
                << backend << " stage " << stage << " " << ddp.params[i].first;
          // Stages 1 and 2 move DDP's bytes, stage 3 about 1.5 times them (the root is gathered
          // once: less); AdamW's state is halved.
          const double ratio = static_cast<double>(bus(zero.last_step, "reduce_scatter") +
                                                   bus(zero.last_step, "allgather")) /
                               static_cast<double>(bus(ddp.last_step, "allreduce"));
          if (stage < 3)
            EXPECT_NEAR(ratio, 1.0, 0.01) << backend << " stage " << stage;
          else
            EXPECT_TRUE(ratio > 1.1 && ratio <= 1.5) << backend << " stage 3: " << ratio;
          EXPECT_NEAR(static_cast<double>(zero.state_bytes) / ddp.state_bytes, 0.5, 0.01)
              << backend << " stage " << stage;
        }
      },
      std::chrono::seconds(240), std::chrono::seconds(60));
}

TEST(ZeroOnGpus, GlooRanksSharingAGpuEndWithDDPsWeightsInEachStage) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  check_stages("gloo");
}

TEST(ZeroOnGpus, NcclRanksOnTwoGpusEndWithDDPsWeightsInEachStage) {
  LOOM_SKIP_WITHOUT_GPUS(2);
  check_stages("nccl");
}

}  // namespace
}  // namespace loom::dist

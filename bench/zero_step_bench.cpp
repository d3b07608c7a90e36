// bench/zero_step_bench.cpp — a GPT training step on 2 ranks of 1 thread under DDP and each ZeRO
// stage (Note [ZeRO stages], Note [FSDP units]), gloo on this machine's CPUs: the step time, its
// ratio to DDP's (the bar: ZeRO-3 at least 0.8x DDP's speed), the share of the gradient
// reduction hidden behind backward, and the bytes each rank moved a step.
//
// Each configuration is a fresh 2-rank job (the program re-launches itself with --worker, rank 0
// writes its step times to a file). The four configurations alternate within each round so that
// load from other processes falls on all alike; ratios are the medians of the per-round ratios.
//
//   zero_step_bench [--layers L (4)] [--embd E (256)] [--heads H (4)] [--block T (128)]
//                   [--batch B (8)] [--steps S (6)] [--warmup N (2)] [--rounds R (3)]

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/launch.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "dist/zero.h"
#include "dist_bench.h"
#include "loom.h"
#include "machine.h"
#include "nn/gpt.h"
#include "optim/adam.h"
#include "stats.h"
#include "tensor/cpu_info.h"

namespace {

namespace dist = loom::dist;
using loom::bench::median;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t layers = 4, embd = 256, heads = 4, block = 128, batch = 8;
  int steps = 6, warmup = 2, rounds = 3, stage = 0;
  bool worker = false;
  std::string result;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&] {
      LOOM_CHECK(i + 1 < argc, ValueError, "zero_step_bench: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--layers")
      o.layers = std::stoll(next());
    else if (arg == "--embd")
      o.embd = std::stoll(next());
    else if (arg == "--heads")
      o.heads = std::stoll(next());
    else if (arg == "--block")
      o.block = std::stoll(next());
    else if (arg == "--batch")
      o.batch = std::stoll(next());
    else if (arg == "--steps")
      o.steps = std::stoi(next());
    else if (arg == "--warmup")
      o.warmup = std::stoi(next());
    else if (arg == "--rounds")
      o.rounds = std::stoi(next());
    else if (arg == "--stage")
      o.stage = std::stoi(next());
    else if (arg == "--worker")
      o.worker = true;
    else if (arg == "--result")
      o.result = next();
    else
      LOOM_CHECK(false, ValueError, "zero_step_bench: unknown argument ", arg,
                 "; usage: zero_step_bench [--layers L] [--embd E] [--heads H] [--block T] "
                 "[--batch B] [--steps S] [--warmup N] [--rounds R]");
  }
  LOOM_CHECK(o.layers >= 1 && o.embd >= 1 && o.heads >= 1 && o.embd % o.heads == 0 &&
                 o.block >= 1 && o.batch >= 1 && o.steps >= 1 && o.warmup >= 0 && o.rounds >= 1 &&
                 o.stage >= 0 && o.stage <= 3,
             ValueError,
             "zero_step_bench: sizes and counts must be positive, --embd a multiple of --heads, "
             "--stage 0 to 3; got layers=",
             o.layers, " embd=", o.embd, " heads=", o.heads, " block=", o.block, " batch=", o.batch,
             " steps=", o.steps, " warmup=", o.warmup, " rounds=", o.rounds, " stage=", o.stage);
  return o;
}

// ---------------------------------------------------------------- a worker (one rank)

// What rank 0 writes: per timed step "step <ms> <hidden share>", then "bytes <bus bytes a step>".
int run_worker(const Options& o) {
  loom::set_num_threads(1);
  const dist::Environment env = dist::environment_from_env();
  auto store = dist::rendezvous(env, std::chrono::minutes(2));
  auto group = dist::make_gloo_process_group(store, env.rank, env.world_size);

  loom::manual_seed(0);
  loom::nn::GPTConfig c;
  c.vocab_size = 256;
  c.block_size = o.block;
  c.n_embd = o.embd;
  c.n_layer = o.layers;
  c.n_head = o.heads;
  auto model = std::make_shared<loom::nn::GPT>(c);
  std::vector<loom::Tensor> params = model->parameters();
  auto adamw = [](std::vector<loom::Tensor> ps) {
    return std::make_unique<loom::optim::AdamW>(std::move(ps),
                                                loom::optim::AdamWOptions{.lr = 1e-4});
  };
  std::shared_ptr<dist::DistributedDataParallel> ddp;
  std::shared_ptr<dist::FullyShardedDataParallel> fsdp;
  std::unique_ptr<loom::optim::Optimizer> optimizer;
  if (o.stage == 3) {
    fsdp = std::make_shared<dist::FullyShardedDataParallel>(model, group);
    optimizer = adamw(fsdp->optimizer_params());
  } else {
    ddp = std::make_shared<dist::DistributedDataParallel>(model, group);
    if (o.stage == 0)
      optimizer = adamw(params);
    else
      optimizer = std::make_unique<dist::ZeroRedundancyOptimizer>(
          *ddp,
          [&](std::vector<loom::Tensor> pieces, const std::vector<size_t>&) {
            return adamw(std::move(pieces));
          },
          dist::ZeroOptions{.stage = o.stage});
  }
  loom::nn::Module& net = fsdp ? static_cast<loom::nn::Module&>(*fsdp) : *ddp;

  loom::manual_seed(1000 + env.rank);  // each rank its own share of the batch
  const loom::Tensor x = loom::randint(0, 256, {o.batch, o.block});
  const loom::Tensor y = loom::randint(0, 256, {o.batch, o.block});

  std::ofstream out;
  if (env.rank == 0) {
    out.open(o.result);
    LOOM_CHECK(out.good(), ValueError, "zero_step_bench: cannot write ", o.result);
  }
  int64_t bus = 0;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    group->reset_counters();
    const auto start = Clock::now();
    optimizer->zero_grad();
    loom::Tensor loss = loom::cross_entropy(net.forward(x).reshape({-1, 256}), y.reshape({-1}));
    loss.backward();
    optimizer->step();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    LOOM_CHECK(std::isfinite(loss.item()), ValueError, "zero_step_bench: the loss is ", loss.item(),
               " at step ", s);
    if (env.rank != 0 || s < o.warmup) continue;
    bus = 0;
    for (const auto& [op, stats] : group->counters()) bus += stats.bus_bytes;
    const double hidden = fsdp ? fsdp->timeline().overlap() : ddp->reducer().timeline().overlap();
    out << "step " << ms << " " << hidden << "\n";
  }
  if (env.rank == 0) {
    out << "bytes " << bus << "\n";
    out.close();
    LOOM_CHECK(out.good(), ValueError, "zero_step_bench: cannot write ", o.result);
  }
  group->barrier()->wait();  // rank 0 serves the store: it leaves last
  return 0;
}

// ---------------------------------------------------------------- the launching process

struct Run {
  std::vector<double> step_ms, hidden;
  int64_t bytes = 0;
};

Run read_run(const std::string& path) {
  Run run;
  std::ifstream in(path);
  for (std::string tag; in >> tag;) {
    if (tag == "step") {
      double ms = 0, hidden = 0;
      in >> ms >> hidden;
      run.step_ms.push_back(ms);
      run.hidden.push_back(hidden);
    } else if (tag == "bytes") {
      in >> run.bytes;
    }
  }
  return run;
}

int run_launcher(const Options& o, int argc, char** argv) {
  const loom::bench::ResultFile result("zero_step_bench");
  std::vector<std::string> command = {dist::current_executable()};
  for (int i = 1; i < argc; ++i) command.push_back(argv[i]);
  command = dist::strip_flag(command, "--rounds", /*has_value=*/true);
  command.insert(command.end(), {"--worker", "--result", result.path});

  auto run_job = [&](int stage, Run& run) {
    dist::LaunchOptions launch;
    launch.nproc_per_node = 2;
    launch.master_port = 0;
    launch.grace = std::chrono::milliseconds(2000);
    launch.extra_env = {{"OMP_NUM_THREADS", "1"}};
    std::vector<std::string> args = command;
    args.insert(args.end(), {"--stage", std::to_string(stage)});
    const int status = loom::bench::launch_quietly(launch, args);
    if (status != 0) {
      std::fprintf(stderr, "zero_step_bench: the stage %d run failed (status %d)\n", stage, status);
      return status;
    }
    run = read_run(result.path);
    if (run.step_ms.size() != static_cast<size_t>(o.steps)) {
      std::fprintf(stderr, "zero_step_bench: the stage %d run wrote %zu of %d steps\n", stage,
                   run.step_ms.size(), o.steps);
      return 1;
    }
    return 0;
  };

  loom::bench::print_machine();
  std::printf(
      "GPT %lld layers, %lld embd, %lld heads, block %lld, vocabulary 256; batch %lld per rank; "
      "2 ranks of 1 thread, gloo; AdamW, float32; median of %d steps (after %d warm-up) per run, "
      "%d rounds\n\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.embd),
      static_cast<long long>(o.heads), static_cast<long long>(o.block),
      static_cast<long long>(o.batch), o.steps, o.warmup, o.rounds);
  const char* names[] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)"};
  std::vector<double> ms[4], ratio[4], hidden[4];
  int64_t bytes[4] = {0, 0, 0, 0};
  for (int round = 1; round <= o.rounds; ++round) {
    for (int stage = 0; stage < 4; ++stage) {
      Run run;
      if (const int status = run_job(stage, run)) return status;
      ms[stage].push_back(median(run.step_ms));
      hidden[stage].push_back(median(run.hidden));
      bytes[stage] = run.bytes;
    }
    for (int stage = 0; stage < 4; ++stage) ratio[stage].push_back(ms[0].back() / ms[stage].back());
    std::fprintf(stderr, "round %d: %.0f / %.0f / %.0f / %.0f ms\n", round, ms[0].back(),
                 ms[1].back(), ms[2].back(), ms[3].back());
  }
  std::printf(
      "| strategy | step ms | speed / DDP's | reduction hidden behind backward | MiB moved a step "
      "(rank 0, bus) |\n|---|---:|---:|---:|---:|\n");
  for (int stage = 0; stage < 4; ++stage)
    std::printf("| %s | %.1f | %.2f | %.0f%% | %.2f |\n", names[stage], median(ms[stage]),
                median(ratio[stage]), 100 * median(hidden[stage]), bytes[stage] / 1048576.0);
  std::printf(
      "\nspeed / DDP's = DDP's step time over the strategy's, median of the per-round ratios "
      "(ZeRO-3's bar: >= 0.8); hidden = share of the gradient reduce-scatter (DDP: allreduce) "
      "time that passed while backward still ran\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return loom::bench::run_bench(argc, argv, parse, run_worker, run_launcher);
}

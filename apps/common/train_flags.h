// apps/common/train_flags.h — the command-line flags of dist::TrainOptions, shared by the
// training programs (resnet18_cifar, gpt_train): --optimizer, --lr, --momentum, --nesterov,
// --beta1, --beta2, --weight-decay, --accumulate, --grad-clip, --max-steps, --max-memory (each
// rank applies it to its device: dist::apply_max_memory); and --strategy, how the ranks average
// the gradients. Header-only, on CLI11, which only the apps use (docs/decisions.md). Each program
// puts its own defaults in `o` before it adds the flags.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "dist/memory_plan.h"
#include "dist/train_options.h"
#include "tensor/error.h"
#include "tensor/memory_limit.h"

namespace loom_apps {

inline void add_train_flags(CLI::App& app, loom::dist::TrainOptions& o) {
  app.add_option("--optimizer", o.optimizer, "sgd, adam or adamw (decoupled weight decay)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", o.lr, "learning rate (the peak for onecycle)")->check(CLI::PositiveNumber);
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_flag("--nesterov", o.nesterov, "SGD with Nesterov momentum");
  app.add_option("--beta1", o.beta1, "Adam's and AdamW's first-moment decay")
      ->check(CLI::Range(0.0, 1.0));  // Adam refuses 1 with a message
  app.add_option("--beta2", o.beta2, "Adam's and AdamW's second-moment decay")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--weight-decay", o.weight_decay,
                 "weight decay: L2 on the gradient for sgd and adam, decoupled for adamw")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--accumulate", o.accumulate,
                 "micro-batches of --batch-size per optimizer step (gradient accumulation; the "
                 "effective batch is their sum)")
      ->check(CLI::PositiveNumber);
  app.add_option("--grad-clip", o.grad_clip,
                 "clip the gradients' total 2-norm to this before each step (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", o.max_steps, "stop after this many optimizer steps in all")
      ->check(CLI::NonNegativeNumber);
  app.add_option_function<std::string>(
         "--max-memory",
         [&o](const std::string& size) {
           try {
             o.max_memory = loom::parse_memory_size(size, "--max-memory");
           } catch (const loom::ValueError& e) {
             throw CLI::ValidationError(e.what());
           }
         },
         "cap the bytes loom's tensors hold on each rank's device, as a GPU's memory caps them: "
         "2GiB, 512MiB, 1.5GB or bytes (LOOM_MAX_MEMORY caps every device); past it the run "
         "stops with an out-of-memory error that says what held the memory and what to change")
      ->type_name("SIZE");
}

// --strategy dp|horovod|ddp|zero1|zero2|zero3: the ways docs/inside.md compares (Note
// [resnet18_cifar's strategies] in apps/resnet18_cifar/train.cpp).
inline void add_strategy_flag(CLI::App& app, std::string& strategy) {
  app.add_option("--strategy", strategy,
                 "how the gradients are averaged (docs/inside.md): dp (DataParallel: one process, "
                 "--nproc N replicas on its threads, or --gpus N), horovod (DistributedOptimizer: "
                 "allreduced in step(), after backward), ddp (the default: buckets overlapped "
                 "with backward), zero1, zero2, zero3 (--zero 1, 2, 3)")
      ->check(CLI::IsMember({"dp", "horovod", "ddp", "zero1", "zero2", "zero3"}));
}

// --powersgd R and --powersgd-start N: DDP's gradients compressed to rank R (Note [PowerSGD]),
// after N plain iterations (PyTorch's default 1000).
inline void add_powersgd_flags(CLI::App& app, int& rank, int64_t& start) {
  app.add_option("--powersgd", rank,
                 "compress DDP's gradients with PowerSGD at this rank (error feedback and warm "
                 "start on; 0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--powersgd-start", start,
                 "plain allreduce for this many iterations before PowerSGD (PyTorch's default "
                 "1000; at least 2)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 40));
}

// After parsing: --strategy zeroN and --zero N are one setting (CLI::ValidationError when they
// disagree, or --zero goes with dp or horovod), and under dp --nproc N (--gpus N) becomes N
// replicas of this process (`dp_devices`: CPU replicas on threads, or one per GPU) instead of N
// worker processes; the caller then starts no workers.
inline void resolve_strategy(const CLI::App& app, std::string& strategy, int& zero, int& nproc,
                             int& dp_devices, int gpus, bool sync_bn) {
  const bool zero_given = app.count("--zero") > 0 && zero > 0;
  if (strategy.rfind("zero", 0) == 0) {
    const int stage = strategy.back() - '0';
    if (zero_given && zero != stage)
      throw CLI::ValidationError("--strategy", strategy + " is --zero " + std::to_string(stage) +
                                                   ", not --zero " + std::to_string(zero));
    zero = stage;
  } else if (zero_given && strategy != "ddp") {
    throw CLI::ValidationError("--zero",
                               "shards DDP's buckets; it cannot go with --strategy " + strategy);
  }
  if (zero > 0) strategy = "zero" + std::to_string(zero);
  if (strategy == "dp") {
    if (sync_bn)
      throw CLI::ValidationError("--sync-bn", "needs ranks (ddp, horovod, zero1-3), not dp");
    dp_devices = gpus > 0 ? gpus : nproc;  // replicas in this process, not worker processes
    nproc = 1;
  }
}

// The strategy as a run's last lines name it: "DDP", "ZeRO-2", "Horovod-style: ...".
inline std::string strategy_label(const std::string& strategy, int zero) {
  if (strategy == "horovod")
    return "Horovod-style: every gradient allreduced in step(), after backward";
  return loom::dist::strategy_name(zero);
}

}  // namespace loom_apps

// apps/resnet18_cifar — trains ResNet-18 (CIFAR stem) on CIFAR-10, Fashion-MNIST or synthetic
// images, on CPUs or GPUs, with SGD, Adam or AdamW and a one-cycle, cosine or step schedule
// (optionally accumulating gradients and clipping them); reports progress, the test accuracy
// each epoch, and writes checkpoints that PyTorch can read.
//
//   resnet18_cifar --dataset fashion-mnist --epochs 2 --width 16 --nesterov
//   resnet18_cifar --dataset cifar10 --data DIR/cifar-10-batches-bin --epochs 30
//   resnet18_cifar --nproc 2 --sync-bn ...       (two data-parallel CPU workers)
//   resnet18_cifar --gpus 4 --dataset cifar10 ... (four GPU workers over nccl)
//   resnet18_cifar --optimizer adamw --lr 1e-3 --accumulate 4 --grad-clip 1 ...
//
// Exit status: 0 done, 2 bad input (flags, missing or malformed data, unusable checkpoint).

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "common/train_flags.h"
#include "dist/launch.h"
#include "dist/store.h"
#include "tensor/conv.h"
#include "tensor/error.h"
#include "train.h"

int main(int argc, char** argv) {
  resnet18_cifar::Options o;
  CLI::App app{"Train ResNet-18 (CIFAR form) with loom"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as argparse
  app.add_option("--data", o.data_dir,
                 "dataset directory (default: the Debian package's for fashion-mnist, "
                 "./cifar-10-batches-bin for cifar10)");
  app.add_option("--dataset", o.dataset, "cifar10, fashion-mnist or synthetic")
      ->check(CLI::IsMember({"cifar10", "fashion-mnist", "synthetic"}));
  app.add_option("--synthetic-size", o.synthetic_size, "training images of the synthetic set")
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "images per step")->check(CLI::PositiveNumber);
  loom_apps::add_train_flags(app, o.train);
  app.add_flag("--freeze-bn", o.freeze_bn,
               "keep batch norm in eval mode while training: normalise with the running "
               "statistics and leave them as they are (as detectron2's FrozenBatchNorm; the "
               "affine weights still train)");
  app.add_option("--schedule", o.schedule, "onecycle, cosine or step (x0.1 at 50% and 75%)")
      ->check(CLI::IsMember({"onecycle", "cosine", "step"}));
  app.add_option("--width", o.width, "channels of the first stage (64: the standard ResNet-18)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed of initialisation, shuffling and augmentation");
  app.add_option("--threads", o.threads, "compute threads (0: every core)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--workers", o.workers, "data loader threads")->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "write epoch-NNN.safetensors after each epoch and last.safetensors at the end");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "also write last.safetensors every K steps: a restart then loses at most K steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume", o.resume, "continue from a checkpoint");
  app.add_flag("--eval-only", o.eval_only, "evaluate the --resume checkpoint and stop");
  app.add_option("--log-json", o.log_json, "append one JSON object per epoch to this file");
  app.add_option("--tensorboard", o.tensorboard,
                 "write TensorBoard event files to this directory: loss, accuracy, lr, loss "
                 "scale, throughput and memory");
  app.add_option("--tensorboard-every", o.tensorboard_every,
                 "the training scalars every this many steps (default 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--nproc", o.nproc,
                 "data-parallel CPU worker processes to start (each with cores/N threads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--gpus", o.gpus,
                 "train on GPUs: one data-parallel worker process per GPU (backend nccl)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", o.backend,
                 "process group backend: gloo (CPUs; GPUs through host memory) or nccl (GPUs; the "
                 "default with --gpus)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_flag("--sync-bn", o.sync_bn, "batch-norm statistics over every rank (SyncBatchNorm)");
  app.add_flag("--scale-lr", o.scale_lr, "multiply the lr by the world size (linear scaling)");
  app.add_option("--max-restarts", o.max_restarts,
                 "with --nproc: restart the workers from the last checkpoint after a failure")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--zero", o.zero,
                 "shard across the ranks (Note [ZeRO stages]): 0 DDP, 1 the optimizer state, 2 and "
                 "the gradients, 3 and the parameters (FSDP, a unit per ResNet stage)")
      ->check(CLI::Range(0, 3));
  loom_apps::add_strategy_flag(app, o.strategy);
  loom_apps::add_powersgd_flags(app, o.powersgd, o.powersgd_start);
  app.add_flag("--print-buckets", o.print_buckets, "print the DDP bucket plan");
  app.add_flag("--print-memory", o.print_memory,
               "after the second step, print where the device's memory went: weights, gradients, "
               "optimizer state, and what the step held at its peak");
  app.add_option("--trace", o.trace,
                 "write a Chrome trace (chrome://tracing, Perfetto) of every rank's steps: data, "
                 "forward, backward, each bucket's allreduce, optimizer");
  app.add_option("--amp", o.amp,
                 "mixed precision: convolutions and the classifier in fp16 (with dynamic loss "
                 "scaling) or bf16; on GPUs batch norm, ReLU and the residual adds keep the 16-bit "
                 "activations, on CPUs they run in float32; losses and weights stay float32; off "
                 "by default")
      ->check(CLI::IsMember({"off", "fp16", "bf16"}));
  app.add_option("--comm-dtype", o.comm_dtype,
                 "the dtype gradients travel in between ranks (summed in float32): fp32, fp16, "
                 "bf16")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_flag("--channels-last", o.channels_last,
               "store batches, activations and weights channels-last (NHWC), the layout cuDNN's "
               "tensor-core convolutions prefer; results match NCHW up to rounding");
  // The names from the library's own list, so that a new algorithm needs no change here.
  std::vector<std::string> algorithms;
  std::string methods;  // the ones that fix a method for every layer
  for (const auto algorithm : loom::kernels::conv2d_algorithms()) {
    algorithms.emplace_back(loom::kernels::to_string(algorithm));
    if (algorithm == loom::kernels::Conv2dAlgorithm::kAuto ||
        algorithm == loom::kernels::Conv2dAlgorithm::kBenchmark)
      continue;
    methods += (methods.empty() ? "" : ", ") + algorithms.back();
  }
  app.add_option("--conv-algorithm", o.conv_algorithm,
                 "how the CPU's convolutions multiply: auto (by shape, reproducible to the bit), "
                 "benchmark (time each method on each layer's first call and keep the fastest, "
                 "Winograd included, as cudnn.benchmark), or one method for every layer: " +
                     methods)
      ->check(CLI::IsMember(algorithms));
  bool no_fusion = false;
  app.add_flag("--no-fusion", no_fusion,
               "run each batch norm, residual add and ReLU as separate ops, as torchvision does "
               "(by default a batch norm applies the add and ReLU after it as it writes)");
  try {
    app.parse(argc, argv);
    o.fuse_bn_relu = !no_fusion;
    if (o.eval_only && o.resume.empty())
      throw CLI::ValidationError("--eval-only", "needs --resume CHECKPOINT");
    if (o.gpus > 0 && o.nproc > 1)
      throw CLI::ValidationError("--nproc",
                                 "starts CPU workers; with --gpus N there is one per GPU");
    if (o.gpus > 0 && app.count("--backend") == 0) o.backend = "nccl";
    if (o.powersgd > 0 && (o.strategy != "ddp" || o.zero > 0 || o.comm_dtype != "fp32"))
      throw CLI::ValidationError("--powersgd",
                                 "compresses DDP's float32 buckets: --strategy ddp "
                                 "and --comm-dtype fp32 only");
    loom_apps::resolve_strategy(app, o.strategy, o.zero, o.nproc, o.dp_devices, o.gpus, o.sync_bn);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  try {
    // --strategy dp: one process, its replicas on threads (resolve_strategy).
    const int workers = o.strategy == "dp" ? 1 : o.gpus > 0 ? o.gpus : o.nproc;
    if (workers > 1 && !loom::dist::launched_by_launcher()) {
      // Start the workers: this same program, without --nproc, under dist::launch (what loomrun
      // does), which gives each its rank in the environment.
      std::vector<std::string> args(argv + 1, argv + argc);
      args = loom::dist::strip_flag(args, "--nproc", true);
      args = loom::dist::strip_flag(args, "--max-restarts", true);
      args.insert(args.begin(), loom::dist::current_executable());
      loom::dist::LaunchOptions launch;
      launch.nproc_per_node = workers;
      launch.master_port = 0;
      launch.max_restarts = o.max_restarts;
      return loom::dist::launch(launch, args);
    }
    resnet18_cifar::run(o);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "resnet18_cifar: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet18_cifar: %s\n", e.what());
    return 2;
  }
  return 0;
}

// apps/gpt_train — trains a GPT (GPT-2's architecture, Hugging Face's layout) on text, on CPUs
// or GPUs, alone or data-parallel; reports train and validation loss, time per iteration,
// tokens per second and MFU; writes checkpoints that Hugging Face's transformers loads; samples.
//
//   gpt_train                                   # fortunes-char: 4 layers x 128, bytes, 2000 iters
//   gpt_train --data FILE|DIR --layers 6 --heads 6 --embd 384 --block 256 --iters 5000
//   gpt_train --nproc 2 ...                     (two data-parallel CPU workers)
//   gpt_train --gpus 4 --amp bf16 ...           (four GPU workers over nccl)
//   gpt_train --sample "PROMPT" --resume ckpt/last.safetensors
//   gpt_train --sample "PROMPT" --resume gpt2/model.safetensors --tokenizer gpt2 --bpe-dir gpt2
//
// Exit status: 0 done, 2 bad input (flags, data, tokenizer files, checkpoint), nothing written.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "common/train_flags.h"
#include "dist/launch.h"
#include "dist/store.h"
#include "tensor/error.h"
#include "train.h"

int main(int argc, char** argv) {
  gpt_train::Options o;
  CLI::App app{"Train a GPT with loom"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--data", o.data,
                 "training text: a file, or a folder read in sorted order (default: Debian's "
                 "fortunes); the first 90% trains, the rest validates");
  app.add_option("--tokenizer", o.tokenizer,
                 "byte (the bytes of the text) or gpt2 (GPT-2's BPE from --bpe-dir)")
      ->check(CLI::IsMember({"byte", "gpt2"}));
  app.add_option("--bpe-dir", o.bpe_dir, "a folder with GPT-2's vocab.json and merges.txt");
  // The model's flags: on --resume each given one must match the checkpoint.
  std::vector<std::pair<std::string, CLI::Option*>> model_flags = {
      {"--layers",
       app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::PositiveNumber)},
      {"--heads",
       app.add_option("--heads", o.heads, "attention heads")->check(CLI::PositiveNumber)},
      {"--embd", app.add_option("--embd", o.embd, "embedding width")->check(CLI::PositiveNumber)},
      {"--block",
       app.add_option("--block", o.block, "context length in tokens")->check(CLI::PositiveNumber)},
      {"--dropout", app.add_option("--dropout", o.dropout,
                                   "dropout (attention, residual, "
                                   "embedding)")
                        ->check(CLI::Range(0.0, 0.999))},
      {"--bias", app.add_option("--bias", o.bias,
                                "biases in the projections and LayerNorms "
                                "(true/false)")}};
  app.add_option("--batch-size", o.batch_size, "windows per rank and micro-batch")
      ->check(CLI::PositiveNumber);
  app.add_option("--iters", o.iters, "optimizer steps")->check(CLI::PositiveNumber);
  loom_apps::add_train_flags(app, o.train);
  app.add_option("--min-lr", o.min_lr, "the learning rate the cosine ends at")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.warmup, "linear warm-up steps")->check(CLI::NonNegativeNumber);
  app.add_option("--eval-every", o.eval_every, "evaluate and checkpoint every this many steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--eval-iters", o.eval_iters, "batches per split in an evaluation")
      ->check(CLI::PositiveNumber);
  app.add_option("--log-every", o.log_every, "print the training loss every this many steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--nproc", o.nproc, "data-parallel CPU worker processes")
      ->check(CLI::PositiveNumber);
  app.add_option("--gpus", o.gpus, "one data-parallel worker per GPU (backend nccl)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", o.backend, "gloo or nccl")->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_option("--amp", o.amp, "mixed precision: off, bf16 or fp16 (dynamic loss scaling)")
      ->check(CLI::IsMember({"off", "bf16", "fp16"}));
  app.add_option("--threads", o.threads, "compute threads (0: every core)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "seed of initialisation and of the windows");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "write last.safetensors (under --zero: last.sharded/, a shard per rank), "
                 "model.safetensors and config.json at each evaluation");
  app.add_option("--resume", o.resume,
                 "continue from (or sample from) a checkpoint: gpt_train's last.safetensors (or "
                 "last.sharded/ with --zero, on any number of ranks), or a GPT-2 "
                 "model.safetensors (with config.json beside it)");
  app.add_option("--zero", o.zero,
                 "shard across the ranks (Note [ZeRO stages]): 0 DDP, 1 the optimizer state, 2 and "
                 "the gradients, 3 and the parameters (FSDP)")
      ->check(CLI::Range(0, 3));
  loom_apps::add_strategy_flag(app, o.strategy);
  loom_apps::add_powersgd_flags(app, o.powersgd, o.powersgd_start);
  app.add_flag("--print-memory", o.print_memory,
               "after the second step, print where the device's memory went: the model states "
               "beside the ZeRO paper's figures, and what the step held at its peak");
  app.add_option("--trace", o.trace,
                 "write a Chrome trace (chrome://tracing, Perfetto) of every rank's steps: data, "
                 "forward, backward, optimizer, and each bucket's reduction (DDP, ZeRO-1/2) or "
                 "each unit's all-gathers and reduce-scatter (ZeRO-3)");
  app.add_flag("--checkpoint-activations", o.checkpoint_activations,
               "keep only each block's input in forward and recompute the block in backward "
               "(the same gradients, less memory, about a third more compute)");
  app.add_flag("--eval-only", o.eval_only, "evaluate the --resume checkpoint and stop");
  app.add_option("--log-json", o.log_json, "append one JSON object per report to this file");
  app.add_option("--tensorboard", o.tensorboard, "write TensorBoard event files to this directory");
  app.add_option("--sample", o.sample, "generate from --resume after this prompt and stop");
  app.add_option("--sample-tokens", o.sample_tokens, "tokens to generate")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", o.top_k, "sample among the k likeliest tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--sample-seed", o.sample_seed, "seed of the sampling draws");
  bool no_sample = false;
  app.add_flag("--no-sample", no_sample, "print no sample after training");
  try {
    app.parse(argc, argv);
    o.sample_after = !no_sample;
    for (const auto& [name, option] : model_flags)
      if (option->count() > 0) o.model_flags_given.insert(name);
    if (o.eval_only && o.resume.empty())
      throw CLI::ValidationError("--eval-only", "needs --resume CHECKPOINT");
    if (o.gpus > 0 && o.nproc > 1)
      throw CLI::ValidationError("--nproc",
                                 "starts CPU workers; with --gpus N there is one per GPU");
    if (o.gpus > 0 && app.count("--backend") == 0) o.backend = "nccl";
    if (o.powersgd > 0 && (o.strategy != "ddp" || o.zero > 0))
      throw CLI::ValidationError("--powersgd", "compresses DDP's buckets: --strategy ddp only");
    loom_apps::resolve_strategy(app, o.strategy, o.zero, o.nproc, o.dp_devices, o.gpus,
                                /*sync_bn=*/false);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  try {
    // --strategy dp: one process, its replicas on threads (resolve_strategy).
    const int workers = o.strategy == "dp" ? 1 : o.gpus > 0 ? o.gpus : o.nproc;
    if (workers > 1 && o.sample.empty() && !loom::dist::launched_by_launcher()) {
      std::vector<std::string> args(argv + 1, argv + argc);
      args = loom::dist::strip_flag(args, "--nproc", true);
      args.insert(args.begin(), loom::dist::current_executable());
      loom::dist::LaunchOptions launch;
      launch.nproc_per_node = workers;
      launch.master_port = 0;
      return loom::dist::launch(launch, args);
    }
    gpt_train::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_train: %s\n", e.what());
    return 2;
  }
  return 0;
}

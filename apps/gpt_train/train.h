// apps/gpt_train/train.h — the options and the run of gpt_train (the flags are main.cpp's).
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "dist/train_options.h"

namespace gpt_train {

struct Options {
  // data and tokenizer
  std::string data = "/usr/share/games/fortunes";  // a file or a folder (data::read_corpus)
  std::string tokenizer = "byte";                  // byte | gpt2
  std::string bpe_dir;                             // vocab.json and merges.txt, for gpt2
  // the model (nn::GPTConfig); on --resume, the checkpoint's unless given
  int64_t layers = 4, heads = 4, embd = 128, block = 64;
  double dropout = 0.0;
  bool bias = true;
  std::set<std::string> model_flags_given;  // the model flags of the command line
  // training
  int64_t batch_size = 12;  // windows per rank and micro-batch
  int64_t iters = 2000;     // optimizer steps in all
  double min_lr = 1e-4;     // where the cosine ends, at --iters
  int64_t warmup = 100;     // linear warm-up steps
  loom::dist::TrainOptions train = default_train_options();
  int64_t eval_every = 250, eval_iters = 20, log_every = 50;
  bool checkpoint_activations = false;  // recompute each block in backward (nn::GPT)
  bool print_memory =
      false;          // where the memory went after the second step (Note [The memory report])
  std::string trace;  // a Chrome trace of every rank's steps (dist/trace.h)
  int zero = 0;  // ZeRO stage: 0 DDP, 1 and 2 ZeroRedundancyOptimizer, 3 FullyShardedDataParallel
  // How the gradients are averaged: dp, horovod, ddp (the default), zero1-3 (--strategy; Note
  // [resnet18_cifar's strategies] in apps/resnet18_cifar/train.cpp says what each does).
  std::string strategy = "ddp";
  int dp_devices = 1;  // --strategy dp: replicas on threads of this one process (--nproc's N)
  int powersgd = 0;    // DDP's gradients compressed by PowerSGD at this rank (0: off)
  int64_t powersgd_start = 1000;  // plain allreduce before this iteration (PyTorch's default)
  // where and how
  int nproc = 1, gpus = 0;
  std::string backend = "gloo";
  std::string amp = "off";  // off | bf16 | fp16
  int threads = 0;
  uint64_t seed = 1337;
  // files
  std::string checkpoint_dir, resume, log_json, tensorboard;
  bool eval_only = false;
  // generation
  std::string sample;  // a prompt: generate from --resume and stop
  bool sample_after = true;
  int64_t sample_tokens = 200, top_k = 200;
  double temperature = 0.8;
  uint64_t sample_seed = 0;

  // nanoGPT's shakespeare_char recipe, with the fortunes-char betas.
  static loom::dist::TrainOptions default_train_options() {
    loom::dist::TrainOptions t;
    t.optimizer = "adamw";
    t.lr = 1e-3;
    t.beta1 = 0.9;
    t.beta2 = 0.99;
    t.weight_decay = 0.1;
    t.grad_clip = 1.0;
    return t;
  }
};

// Trains (or evaluates, or samples) as the options say; returns the last validation loss (0
// when sampling). loom::Error for bad input, before anything is written.
double run(const Options& options);

}  // namespace gpt_train

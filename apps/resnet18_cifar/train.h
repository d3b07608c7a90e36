// apps/resnet18_cifar/train.h — the training run behind resnet18_cifar: the options its flags
// set, the datasets and transforms each dataset gets, and the loop (train an epoch, evaluate,
// report, checkpoint), kept apart from the command line so that each piece reads on its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/transforms.h"
#include "dist/train_options.h"

namespace resnet18_cifar {

struct Options {
  std::string data_dir;                   // empty: the dataset's default place
  std::string dataset = "fashion-mnist";  // cifar10 | fashion-mnist | synthetic
  int64_t synthetic_size = 5000;          // training images of the synthetic dataset
  int epochs = 2;
  int64_t batch_size = 128;  // per process and micro-batch
  // The optimizer, accumulation, clipping, --max-steps (flags in apps/common/train_flags.h). The
  // lr is the peak for onecycle, the start for cosine and step.
  loom::dist::TrainOptions train{.lr = 0.2, .momentum = 0.9, .weight_decay = 5e-4};
  // Batch norm in eval mode while training: normalised with the running statistics, which stay
  // as they are (Note [Frozen batch norm] in train.cpp).
  bool freeze_bn = false;
  std::string schedule = "onecycle";  // onecycle | cosine | step
  int64_t width = 64;
  uint64_t seed = 0;
  int threads = 0;  // 0: every core
  int workers = 2;  // data loader threads
  std::string checkpoint_dir;
  std::string resume;
  bool eval_only = false;
  std::string log_json;
  std::string tensorboard;         // TensorBoard event files in this directory
  int64_t tensorboard_every = 10;  // training scalars every this many steps
  // Data parallelism (Note [resnet18_cifar in parallel] in train.cpp).
  int nproc = 1;  // CPU worker processes this program starts (--nproc)
  int gpus = 0;   // GPU worker processes (--gpus): rank r trains on cuda:(local rank % GPUs)
  std::string backend = "gloo";  // nccl by default with --gpus
  bool sync_bn = false;          // batch statistics over all ranks
  int zero = 0;  // ZeRO stage: 0 DDP, 1 and 2 ZeroRedundancyOptimizer, 3 FullyShardedDataParallel
  // How the gradients are averaged (Note [resnet18_cifar's strategies] in train.cpp): dp,
  // horovod, ddp (the default), zero1, zero2, zero3 (--strategy zeroN is --zero N).
  std::string strategy = "ddp";
  int dp_devices = 1;  // --strategy dp: replicas on threads of this one process (--nproc's N)
  int powersgd = 0;    // DDP's gradients compressed by PowerSGD at this rank (0: off)
  int64_t powersgd_start = 1000;  // plain allreduce before this iteration (PyTorch's default)
  bool scale_lr = false;          // lr x world size (the linear scaling rule)
  int max_restarts = 0;           // restart the workers from the last checkpoint after a failure
  int64_t checkpoint_every = 0;   // also write last.safetensors every this many steps (0: never)
  bool print_buckets = false;     // print DDP's bucket plan
  bool print_memory = false;      // print where memory went after the second step
  std::string trace;              // write a Chrome trace of every rank's steps here
  // Mixed precision (Note [resnet18_cifar in mixed precision] in train.cpp).
  std::string amp = "off";          // off | fp16 | bf16
  std::string comm_dtype = "fp32";  // the dtype DDP's gradients travel in: fp32 | fp16 | bf16
  // Batches (and so every activation) stored channels-last, NHWC (Note [Memory formats]).
  bool channels_last = false;
  // Each block's batch norms apply the ReLU and the residual add after them in one op (Note
  // [Batch norm with ReLU]); false runs them one by one, as torchvision does.
  bool fuse_bn_relu = true;
  // How the CPU's convolutions multiply (kernels::Conv2dAlgorithm): "auto" reproducible to the
  // bit; "benchmark" times each method on each layer's first call and keeps the fastest (Note
  // [Choosing convolutions by measurement]).
  std::string conv_algorithm = "auto";
};

// A dataset split with the transforms the recipe uses for it and its normalisation constants.
struct Split {
  std::shared_ptr<const loom::data::Dataset> dataset;
  loom::data::Pipeline transforms;
};
struct Data {
  Split train, test;
  std::vector<float> mean, std;
  std::string description;  // "Fashion-MNIST (60000 train, 10000 test) from DIR"
};
// IOError (with the path) when the files are missing or malformed.
Data load_data(const Options& options);

// Trains (or, with eval_only, evaluates) as the options say; prints progress and returns the
// final test accuracy in [0, 1].
double run(const Options& options);

}  // namespace resnet18_cifar

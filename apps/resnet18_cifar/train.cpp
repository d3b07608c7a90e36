// apps/resnet18_cifar/train.cpp — datasets and the training loop of
// resnet18_cifar.
//
// One optimizer step: zero_grad, forward, cross-entropy, backward, SGD step,
// schedule step. Every epoch ends with an evaluation on the test split (eval
// mode: batch norm's running statistics), a summary line, a JSON line
// (--log-json) and a checkpoint (--checkpoint-dir). Resuming restores the
// weights, optimizer, schedule, generator, epoch and step, and the loader skips
// the batches already trained: the data order and augmentation are functions of
// (seed, epoch, sample index), so the resumed run sees exactly the batches the
// uninterrupted one did.
//
// Note [resnet18_cifar in parallel]
// Started by a launcher (loomrun, torchrun --no-python, or this program's own
// --nproc, which re-launches itself through dist::launch), each process is one
// rank: it joins the store and a gloo process group, wraps the model in
// DistributedDataParallel (SyncBatchNorm first with
// --sync-bn), and trains on its DistributedSampler share; --batch-size is per
// process, so the global batch is batch x world (--scale-lr multiplies the lr
// by the world size). Every rank evaluates a strided shard of the test set; the
// metrics are summed over ranks with one allreduce. Only rank 0 prints, logs
// and writes checkpoints. After a failure the launcher restarts every rank with
// LOOM_RESTART_COUNT > 0: they resume from <checkpoint-dir>/last.safetensors,
// written at the end of every epoch. With --gpus N the same program starts N
// ranks that train on cuda:(local rank): the model, each batch and the metrics
// live on the GPU, and the group is nccl (or gloo, with --backend gloo, which
// stages the buckets through host memory and lets ranks share one GPU).
//
// Note [resnet18_cifar in mixed precision]
// --amp fp16|bf16 runs the forward (and evaluation) in an autocast region:
// convolutions and the classifier's product in 16 bits; on a GPU batch norm
// (with float32 statistics), ReLU and the residual adds keep the 16-bit
// activations, on the CPU they run in float32; the loss runs in float32 (Note
// [Autocast policy] in autograd/autocast.h). The weights and the optimizer stay
// float32.
// fp16 adds dynamic loss scaling (optim::GradScaler): the loss is scaled before
// backward, the step is skipped when a gradient overflowed, and under DDP the
// ranks agree on skipping with one allreduce. bf16 keeps float32's exponent
// range, so it needs no scaling. The scaler's state is part of the checkpoint.
// --comm-dtype fp16|bf16 sends DDP's gradients in 16 bits.
//
// Note [The memory report]
// --print-memory prints, after the first training step the optimizer takes
// (with --amp fp16 a step skipped for an overflow does not count), where this
// rank's device memory went, from loom's own count of the bytes its tensors
// hold and of the allocator's cache (memory_stats):
//   weights           the parameters;
//   gradients         their .grad tensors: under DDP the bucket buffers, which
//   hold them; optimizer state   the optimizer's buffers (SGD's momentum: as
//   large as the weights); buffers           the modules' buffers (batch norm's
//   running statistics); other held        whatever else outlives the step: the
//   batch and the running totals, and
//                     on the CPU the dataset (CIFAR-10 and Fashion-MNIST are
//                     held as tensors) and the batches the loader has ready;
//   step peak         the most the step held at once, beyond what outlives it:
//   the activations
//                     autograd saved for backward, and the temporaries alive
//                     with them. It grows with the batch; the lines above do
//                     not;
//   cached            freed blocks the allocator keeps for reuse (on a GPU the
//   caching
//                     allocator's, which nvidia-smi counts as used; on the CPU
//                     large blocks).
// The first four are the model's fixed cost (with momentum SGD, three times the
// weights); mixed precision shrinks the activations, not them.

#include "train.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "data/cifar10.h"
#include "data/idx.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "dist/ddp.h"
#include "dist/job.h"
#include "dist/metrics.h"
#include "dist/process_group.h"
#include "dist/sampler.h"
#include "dist/store.h"
#include "dist/sync_batchnorm.h"
#include "dist/trace.h"
#include "loom.h"
#include "optim/checkpoint_manager.h"
#include "optim/grad_scaler.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "tensor/atomic_file.h"
#include "tensor/cuda/runtime.h" // synchronize
#include "tensor/cuda/upload.h"

namespace resnet18_cifar {

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string floats_json(const std::vector<float> &v) {
  nlohmann::json j = nlohmann::json::array();
  for (float x : v)
    j.push_back(x);
  return j.dump();
}

std::string duration_str(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buf;
}

// The progress bar of a terminal: redrawn in place, at most ten times a second.
class ProgressBar {
public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  // Whether to draw now (the running loss is read back from the GPU only then).
  bool due(int64_t done, int64_t total) const {
    return enabled_ && (seconds_since(last_) >= 0.1 || done >= total);
  }
  void draw(int epoch, int64_t done, int64_t total, double loss, double acc,
            double ips, double eta) {
    last_ = Clock::now();
    constexpr int kWidth = 24;
    const int filled =
        total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kWidth)
      bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), ' ');
    std::printf("\r\033[Kepoch %d [%s] %lld/%lld  loss %.4f  acc %.2f%%  %.0f "
                "img/s  left %s",
                epoch, bar.c_str(), static_cast<long long>(done),
                static_cast<long long>(total), loss, 100 * acc, ips,
                duration_str(eta).c_str());
    std::fflush(stdout);
  }
  void clear() {
    if (enabled_)
      std::printf("\r\033[K");
  }

private:
  bool enabled_;
  Clock::time_point last_{};
};

// The dtype a flag names: fp32, fp16 or bf16.
DType flag_dtype(const std::string &flag) {
  return flag == "fp16" ? kFloat16 : flag == "bf16" ? kBFloat16 : kFloat32;
}

// The autocast region --amp asks for: a disabled one for off.
struct AmpRegion : autocast::Guard {
  explicit AmpRegion(const std::string &amp)
      : autocast::Guard(amp == "fp16" ? kFloat16 : kBFloat16, amp != "off") {}
};

dist::Totals evaluate(nn::Module &model, data::DataLoader &loader,
                      cuda::Uploader &upload, Device device,
                      const std::string &amp, MemoryFormat format) {
  model.eval();
  NoGradGuard no_grad;
  AmpRegion region(amp);
  dist::RunningTotals totals(device);
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    const Tensor labels = upload(batch->labels, device);
    const Tensor logits = model.forward(upload(batch->images, device, format));
    totals.add(cross_entropy(logits, labels), logits, labels);
  }
  model.train();
  return totals.read();
}

// Note [The memory report], from memory_stats after the first step (its peak
// reset before it).
std::string memory_report(nn::Module &model, const optim::Optimizer &optimizer,
                          dist::DistributedDataParallel *ddp, Device device,
                          const MemoryStats &stats) {
  const int64_t held = stats.current_bytes, peak = stats.peak_bytes;
  int64_t weights = 0, gradients = 0, buffers = 0;
  std::set<const StorageImpl *>
      grad_storages; // DDP's views share their bucket's
  for (const Tensor &p : model.parameters()) {
    weights += static_cast<int64_t>(p.nbytes());
    const Tensor g = p.grad();
    if (g.defined() && grad_storages.insert(g.storage().get()).second)
      gradients += static_cast<int64_t>(g.storage()->nbytes);
  }
  for (const Tensor &b : model.buffers())
    buffers += static_cast<int64_t>(b.nbytes());
  const int64_t state = optimizer.state_bytes();
  const auto mib = [](int64_t bytes) {
    return static_cast<double>(bytes) / (1 << 20);
  };
  const std::string where =
      ddp ? detail::str("in ", ddp->reducer().buckets().size(), " DDP buckets")
          : detail::str("one per parameter");
  char text[1024];
  std::snprintf(
      text, sizeof text,
      "memory after the first step on %s (MiB; Note [The memory report]):\n"
      "  weights          %9.2f  (%lld parameters)\n"
      "  gradients        %9.2f  (%s)\n"
      "  optimizer state  %9.2f  (%s)\n"
      "  buffers          %9.2f  (batch norm's running statistics)\n"
      "  other held       %9.2f\n"
      "  step peak        %9.2f  above what is held after it (activations "
      "saved for "
      "backward, temporaries)\n"
      "  cached           %9.2f  (freed blocks kept for reuse)\n",
      detail::str(device).c_str(), mib(weights),
      static_cast<long long>(model.num_parameters()), mib(gradients),
      where.c_str(), mib(state), optimizer.name().c_str(), mib(buffers),
      mib(held - weights - gradients - state - buffers), mib(peak - held),
      mib(stats.cached_bytes));
  return text;
}

std::unique_ptr<optim::LRSchedule>
make_schedule(const Options &o, optim::Optimizer &opt, int64_t total_steps) {
  if (o.schedule == "onecycle")
    return std::make_unique<optim::OneCycleLR>(opt, o.lr, total_steps);
  if (o.schedule == "cosine")
    return std::make_unique<optim::CosineAnnealingLR>(opt, total_steps);
  // "step": x0.1 at half and at three quarters of the run.
  return std::make_unique<optim::MultiStepLR>(
      opt, std::vector<int64_t>{total_steps / 2, total_steps * 3 / 4}, 0.1);
}

} // namespace

Data load_data(const Options &o) {
  using namespace loom::data;
  Data d;
  if (o.dataset == "cifar10") {
    const std::string dir =
        o.data_dir.empty() ? "cifar-10-batches-bin" : o.data_dir;
    d.mean = {0.4914f, 0.4822f, 0.4465f};
    d.std = {0.2470f, 0.2435f, 0.2616f};
    d.train = {std::make_shared<Cifar10>(dir, true),
               compose(RandomCrop(32, 4), RandomHorizontalFlip(), ToFloat(),
                       Normalize(d.mean, d.std))};
    d.test = {std::make_shared<Cifar10>(dir, false),
              compose(ToFloat(), Normalize(d.mean, d.std))};
    d.description = "CIFAR-10 from " + dir;
  } else if (o.dataset == "fashion-mnist") {
    const std::string dir = o.data_dir.empty()
                                ? "/usr/share/datasets/fashion-mnist"
                                : o.data_dir; // Debian's place
    d.mean = {0.2860f};
    d.std = {0.3530f};
    // Padded with black to 32 x 32, then flipped; normalised with
    // Fashion-MNIST's statistics.
    d.train = {std::make_shared<FashionMnist>(dir, true),
               compose(Pad::to(32, 32), RandomHorizontalFlip(), ToFloat(),
                       Normalize(d.mean, d.std))};
    d.test = {std::make_shared<FashionMnist>(dir, false),
              compose(Pad::to(32, 32), ToFloat(), Normalize(d.mean, d.std))};
    d.description = "Fashion-MNIST from " + dir;
  } else {
    LOOM_CHECK(o.dataset == "synthetic", ValueError, "unknown dataset '",
               o.dataset, "' (cifar10, fashion-mnist or synthetic)");
    d.mean = {0.5f, 0.5f, 0.5f};
    d.std = {0.29f, 0.29f, 0.29f};
    const int64_t n_test = std::max<int64_t>(1, o.synthetic_size / 5);
    d.train = {std::make_shared<Synthetic>(o.synthetic_size, Shape{3, 32, 32},
                                           10, o.seed),
               compose(RandomCrop(32, 4), RandomHorizontalFlip(), ToFloat(),
                       Normalize(d.mean, d.std))};
    d.test = {
        std::make_shared<Synthetic>(n_test, Shape{3, 32, 32}, 10, o.seed + 1),
        compose(ToFloat(), Normalize(d.mean, d.std))};
    d.description = "synthetic random images";
  }
  d.description += " (" + std::to_string(d.train.dataset->size()) + " train, " +
                   std::to_string(d.test.dataset->size()) + " test)";
  return d;
}

double run(const Options &o) {
  if (o.threads > 0)
    set_num_threads(o.threads);
  manual_seed(o.seed);
  const dist::Job job = dist::join_job({.gpus = o.gpus, .backend = o.backend});
  const bool tty = job.leader() && isatty(STDOUT_FILENO) != 0;
  auto say = [&](const char *format, auto... args) {
    if (!job.leader())
      return;
    std::printf(format, args...);
    std::fflush(stdout);
  };

  const Data data = load_data(o);
  const Shape image =
      data.train.transforms.output_shape(data.train.dataset->image_shape());
  auto model = nn::resnet18({.width = o.width,
                             .in_channels = image[0],
                             .num_classes = data.train.dataset->num_classes(),
                             .fuse_bn_relu = o.fuse_bn_relu});
  if (!o.fuse_bn_relu)
    say("batch norm, add and ReLU run one by one (--no-fusion)\n");
  model->to(job.device);
  // Weights in the order NHWC convolutions read, before the optimizer and DDP
  // see them.
  if (o.channels_last)
    model->to(MemoryFormat::kChannelsLast);

  data::LoaderOptions train_options{.batch_size = o.batch_size,
                                    .shuffle = true,
                                    .seed = o.seed,
                                    .num_workers = o.workers};
  std::shared_ptr<const data::Sampler> train_sampler, test_sampler;
  int64_t train_share = data.train.dataset->size();
  if (job.parallel()) {
    train_sampler = std::make_shared<dist::DistributedSampler>(
        data.train.dataset->size(), job.rank, job.world, /*shuffle=*/true,
        o.seed);
    test_sampler = std::make_shared<dist::ShardSampler>(
        data.test.dataset->size(), job.rank, job.world);
    train_share = train_sampler->size();
  }
  // A last batch of one sample cannot be batch-normalised in training: drop it
  // in that case.
  train_options.drop_last = train_share % o.batch_size == 1;
  data::DataLoader train_loader(data.train.dataset, data.train.transforms,
                                train_options, train_sampler);
  data::DataLoader test_loader(
      data.test.dataset, data.test.transforms,
      {.batch_size = std::max<int64_t>(o.batch_size, 256),
       .shuffle = false,
       .seed = o.seed,
       .num_workers = o.workers},
      test_sampler);
  const int64_t steps_per_epoch = train_loader.batches_per_epoch();
  const int64_t total_steps = std::max<int64_t>(1, steps_per_epoch * o.epochs);

  const double lr = o.lr * (o.scale_lr ? job.world : 1);
  optim::SGD optimizer(model->parameters(), {.lr = lr,
                                             .momentum = o.momentum,
                                             .weight_decay = o.weight_decay,
                                             .nesterov = o.nesterov});
  Options with_lr = o;
  with_lr.lr = lr;
  auto schedule = make_schedule(with_lr, optimizer, total_steps);
  // fp16 only: bf16 has float32's exponent range (Note [resnet18_cifar in mixed
  // precision]).
  optim::GradScaler scaler({.enabled = o.amp == "fp16"});
  optim::GradScaler *saved_scaler = scaler.is_enabled() ? &scaler : nullptr;

  const optim::Metadata info = {
      {"model", model->name()},
      {"width", std::to_string(o.width)},
      {"in_channels", std::to_string(image[0])},
      {"num_classes", std::to_string(data.train.dataset->num_classes())},
      {"dataset", o.dataset},
      {"mean", floats_json(data.mean)},
      {"std", floats_json(data.std)}};
  optim::CheckpointManager checkpoints({.dir = o.checkpoint_dir,
                                        .writer = job.leader(),
                                        .world_size = job.world},
                                       *model, optimizer, schedule.get(),
                                       saved_scaler, info);
  // A restarted job (the launcher sets LOOM_RESTART_COUNT) resumes from its
  // last checkpoint.
  const optim::Resumed resumed =
      checkpoints.resume(o.resume, *model, &optimizer, schedule.get(),
                         saved_scaler, /*model_only=*/o.eval_only);
  const std::string &resume = resumed.path;
  optim::TrainingProgress progress = resumed.progress;
  if (!resume.empty()) {
    if (saved_scaler && !resumed.scaler_restored)
      say("the checkpoint holds no loss scale: starting from %g\n",
          scaler.get_scale());
    say("resumed from %s: %lld epochs and %lld steps done\n", resume.c_str(),
        static_cast<long long>(progress.epoch),
        static_cast<long long>(progress.step));
  }

  say("resnet18_cifar: ResNet-18 width %lld (%lld parameters), %s\n",
      static_cast<long long>(o.width),
      static_cast<long long>(model->num_parameters()),
      data.description.c_str());
  std::FILE *log = nullptr;
  if (!o.log_json.empty() && job.leader()) {
    log = std::fopen(o.log_json.c_str(), resume.empty() ? "w" : "a");
    LOOM_CHECK(log != nullptr, IOError, "cannot open the JSON log ",
               o.log_json);
  }
  auto log_line = [&](const nlohmann::json &j) {
    if (!log)
      return;
    std::fprintf(log, "%s\n", j.dump().c_str());
    std::fflush(log);
  };

  // Batches reach a GPU without stopping the host (Note [Uploading batches]).
  cuda::Uploader upload;
  const MemoryFormat format =
      o.channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
  if (o.channels_last)
    say("batches, activations and weights channels-last (NHWC)\n");
  if (o.eval_only) {
    const dist::Totals test = dist::sum_over_ranks(
        job, evaluate(*model, test_loader, upload, job.device, o.amp, format));
    say("test loss %.4f  test accuracy %.2f%%\n", test.mean_loss(),
        100 * test.accuracy());
    log_line({{"epoch", progress.epoch},
              {"test_loss", test.mean_loss()},
              {"test_acc", test.accuracy()}});
    if (log)
      std::fclose(log);
    return test.accuracy();
  }

  // The network the training steps run through: the model, or DDP around it.
  std::shared_ptr<dist::DistributedDataParallel> ddp;
  if (job.parallel()) {
    if (o.sync_bn)
      dist::convert_sync_batchnorm(*model, job.group);
    ddp = std::make_shared<dist::DistributedDataParallel>(
        model, job.group,
        dist::DDPOptions{.comm_dtype = flag_dtype(o.comm_dtype)});
    if (scaler.is_enabled())
      scaler.set_found_inf_agreement(
          dist::found_inf_agreement(job.group, job.device));
    say("data parallel: world size %d (%s), global batch %lld, effective lr "
        "%g%s; %zu DDP "
        "buckets\n",
        job.world, job.group->backend().c_str(),
        static_cast<long long>(o.batch_size * job.world), lr,
        o.sync_bn ? ", SyncBatchNorm" : "", ddp->reducer().buckets().size());
    if (o.print_buckets)
      say("%s", ddp->bucket_plan().c_str());
  }
  nn::Module &net = ddp ? static_cast<nn::Module &>(*ddp) : *model;

  say("batch %lld, %d threads, %d loader workers; SGD lr %g momentum %g%s "
      "weight decay %g, "
      "schedule %s; %lld steps per epoch\n",
      static_cast<long long>(o.batch_size), get_num_threads(), o.workers, lr,
      o.momentum, o.nesterov ? " (nesterov)" : "", o.weight_decay,
      o.schedule.c_str(), static_cast<long long>(steps_per_epoch));
  if (o.amp != "off")
    say("mixed precision: convolutions and the classifier in %s, the rest in "
        "float32, float32 "
        "master weights%s\n",
        o.amp.c_str(),
        scaler.is_enabled()
            ? detail::str("; dynamic loss scale from ", scaler.get_scale())
                  .c_str()
            : "");

  ProgressBar bar(tty);
  // Note [The memory report]: after this run's first step the optimizer took (a
  // loss-scaled step skipped for an overflow has made no optimizer state yet).
  bool memory_to_report = o.print_memory;
  dist::Trace trace(job.rank);
  double overlap_total = 0;
  int64_t overlap_steps = 0;
  dist::Totals test;
  bool stopped = false, evaluated = false;
  for (int64_t epoch = progress.epoch; epoch < o.epochs && !stopped; ++epoch) {
    if (o.max_steps >= 0 && progress.step >= o.max_steps)
      break;
    const auto epoch_start = Clock::now();
    reset_peak_memory(
        job.device); // the epoch's peak: weights, state, activations, batches
    const int64_t skip = progress.batch;
    train_loader.start_epoch(epoch, skip);
    net.train();
    dist::RunningTotals train(job.device);
    double train_seconds = 0, first_step_seconds = 0, overlap_sum = 0;
    int64_t first_step_images = 0, trained = 0, skipped = 0;
    double data_start = dist::steady_seconds();
    while (auto batch = train_loader.next()) {
      if (o.max_steps >= 0 && progress.step >= o.max_steps) {
        stopped = true;
        break;
      }
      if (memory_to_report)
        reset_peak_memory(job.device);
      const auto step_start = Clock::now();
      const double t0 = dist::steady_seconds();
      optimizer.zero_grad();
      checkpoints.changed();
      const Tensor images = upload(batch->images, job.device, format);
      const Tensor labels = upload(batch->labels, job.device);
      Tensor logits, loss;
      {
        AmpRegion region(o.amp);
        logits = net.forward(images);
        loss = cross_entropy(logits, labels);
      }
      const double t1 = dist::steady_seconds();
      scaler.scale(loss).backward();
      const double t2 = dist::steady_seconds();
      const bool stepped = scaler.step(optimizer);
      if (!stepped)
        ++skipped;
      scaler.update();
      schedule->step();
      if (!o.trace.empty()) {
        const double t3 = dist::steady_seconds();
        trace.add("data", "data", data_start, t0);
        trace.add("forward", "compute", t0, t1);
        trace.add("backward", "compute", t1, t2);
        trace.add("optimizer", "compute", t2, t3);
        if (ddp) {
          const dist::ReducerTimeline &tl = ddp->reducer().timeline();
          for (size_t b = 0; b < tl.launched.size(); ++b)
            trace.add("allreduce bucket " + std::to_string(b), "communication",
                      tl.start + tl.launched[b], tl.start + tl.completed[b], 1);
        }
      }
      const auto n = batch->labels.size(0);
      train.add(loss, logits, labels);
      if (memory_to_report && stepped) {
        say("%s", memory_report(*model, optimizer, ddp.get(), job.device,
                                memory_stats(job.device))
                      .c_str());
        memory_to_report = false;
      }
      const double step_seconds = seconds_since(step_start);
      if (trained == 0) {
        first_step_seconds = step_seconds;
        first_step_images = n;
      }
      if (ddp) {
        const double overlap = ddp->reducer().timeline().overlap();
        overlap_sum += overlap;
        overlap_total += overlap;
        ++overlap_steps;
      }
      train_seconds += step_seconds;
      ++trained;
      ++progress.step;
      progress.batch = skip + trained;
      if (bar.due(progress.batch, steps_per_epoch)) {
        const double ips =
            job.world *
            (trained > 1
                 ? (train.seen() - first_step_images) /
                       std::max(1e-9, train_seconds - first_step_seconds)
                 : n / std::max(1e-9, step_seconds));
        const double eta =
            (steps_per_epoch - progress.batch) * train_seconds / trained;
        const dist::Totals so_far = train.read();
        bar.draw(static_cast<int>(epoch + 1), progress.batch, steps_per_epoch,
                 so_far.mean_loss(), so_far.accuracy(), ips, eta);
      }
      data_start = dist::steady_seconds();
    }
    bar.clear();
    // A GPU may still be working on the last steps: their time belongs to
    // training.
    if (job.device.is_cuda() && trained > 0) {
      const auto wait_start = Clock::now();
      cuda::synchronize(job.device.index);
      train_seconds += seconds_since(wait_start);
    }
    // Images per second of the whole job: every rank's training images over
    // this rank's training time, the first step left out.
    const double seen = train.seen();
    const double local_ips =
        trained > 1
            ? (seen - first_step_images) / (train_seconds - first_step_seconds)
            : (trained == 1 ? seen / train_seconds : 0.0);
    if (!stopped) {
      progress.epoch = epoch + 1;
      progress.batch = 0;
    }
    const dist::Totals train_all = dist::sum_over_ranks(job, train.read());
    test = dist::sum_over_ranks(
        job, evaluate(*model, test_loader, upload, job.device, o.amp, format));
    evaluated = true;
    const double images_per_s = local_ips * job.world;
    const double seconds = seconds_since(epoch_start);
    const int64_t peak_bytes = memory_stats(job.device).peak_bytes;
    std::string extra;
    if (ddp && trained > 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "  allreduce overlap %.0f%%",
                    100 * overlap_sum / trained);
      extra = buf;
    }
    if (scaler.is_enabled()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "  loss scale %g (%lld steps skipped)",
                    scaler.get_scale(), static_cast<long long>(skipped));
      extra += buf;
    }
    say("epoch %lld/%d  train loss %.4f  acc %.2f%%  test loss %.4f  acc "
        "%.2f%%  %.0f img/s  "
        "data wait %.1f s  peak memory %.1f MiB%s  %.1f s%s\n",
        static_cast<long long>(epoch + 1), o.epochs, train_all.mean_loss(),
        100 * train_all.accuracy(), test.mean_loss(), 100 * test.accuracy(),
        images_per_s, train_loader.wait_seconds(),
        static_cast<double>(peak_bytes) / (1 << 20), extra.c_str(), seconds,
        stopped ? "  (stopped by --max-steps)" : "");
    log_line({{"epoch", epoch + 1},
              {"train_loss", train_all.mean_loss()},
              {"train_acc", train_all.accuracy()},
              {"test_loss", test.mean_loss()},
              {"test_acc", test.accuracy()},
              {"images_per_s", images_per_s},
              {"seconds", seconds},
              {"peak_memory_bytes", peak_bytes},
              {"steps", progress.step},
              {"world_size", job.world},
              {"amp", o.amp},
              {"loss_scale", scaler.get_scale()},
              {"skipped_steps", skipped},
              {"complete", !stopped}});
    if (!stopped)
      checkpoints.save_epoch(progress);
  }
  if (!evaluated) // nothing left to train
    test = dist::sum_over_ranks(
        job, evaluate(*model, test_loader, upload, job.device, o.amp, format));
  checkpoints.save_last(progress);
  if (log)
    std::fclose(log);
  if (overlap_steps > 0)
    say("communication hidden behind backward: %.0f%% of the allreduce time "
        "(mean over %lld "
        "steps)\n",
        100 * overlap_total / overlap_steps,
        static_cast<long long>(overlap_steps));
  if (!o.trace.empty()) {
    trace.write(o.trace, job.store.get(), job.world);
    say("trace of %zu events per rank written to %s\n", trace.size(),
        o.trace.c_str());
  }
  say("test accuracy %.2f%%\n", 100 * test.accuracy());
  return test.accuracy();
}

} // namespace resnet18_cifar

// apps/resnet18_cifar/train.cpp — datasets and the training loop of resnet18_cifar.
//
// One optimizer step: zero_grad, forward, cross-entropy, backward, SGD step, schedule step.
// Every epoch ends with an evaluation on the test split (eval mode: batch norm's running
// statistics), a summary line, a JSON line (--log-json) and a checkpoint (--checkpoint-dir).
// Resuming restores the weights, optimizer, schedule, generator, epoch and step, and the loader
// skips the batches already trained: the data order and augmentation are functions of (seed,
// epoch, sample index), so the resumed run sees exactly the batches the uninterrupted one did.
//
// Note [resnet18_cifar in parallel]
// Started by a launcher (loomrun, torchrun --no-python, or this program's own --nproc, which
// re-launches itself through dist::launch), each process is one rank: it joins the store and a
// gloo process group, wraps the model in DistributedDataParallel (SyncBatchNorm first with
// --sync-bn), and trains on its DistributedSampler share; --batch-size is per process, so the
// global batch is batch x world (--scale-lr multiplies the lr by the world size). Every rank
// evaluates a strided shard of the test set; the metrics are summed over ranks with one
// allreduce. Only rank 0 prints, logs and writes checkpoints. After a failure the launcher
// restarts every rank with LOOM_RESTART_COUNT > 0: they resume from
// <checkpoint-dir>/last.safetensors, written at the end of every epoch.
// With --gpus N the same program starts N ranks that train on cuda:(local rank): the model, each
// batch and the metrics live on the GPU, and the group is nccl (or gloo, with --backend gloo,
// which stages the buckets through host memory and lets ranks share one GPU).
//
// Note [resnet18_cifar in mixed precision]
// --amp fp16|bf16 runs the forward (and evaluation) in an autocast region: convolutions and the
// classifier's product in 16 bits; on a GPU batch norm (with float32 statistics), ReLU and the
// residual adds keep the 16-bit activations, on the CPU they run in float32; the loss runs in
// float32 (Note [Autocast policy] in autograd/autocast.h). The weights and the optimizer stay
// float32.
// fp16 adds dynamic loss scaling (optim::GradScaler): the loss is scaled before backward, the
// step is skipped when a gradient overflowed, and under DDP the ranks agree on skipping with one
// allreduce. bf16 keeps float32's exponent range, so it needs no scaling. The scaler's state is
// part of the checkpoint. --comm-dtype fp16|bf16 sends DDP's gradients in 16 bits.
//
//
// The loop's parts are library code: dist/job.h (joining the job), dist/sampler.h, dist/metrics.h
// (totals summed over ranks), optim/checkpoint_manager.h, dist/trace.h (the step timeline),
// dist/memory_report.h (Note [The memory report]) and dist/report.h (terminal, JSON log).

#include "train.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "data/cifar10.h"
#include "data/idx.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "dist/ddp.h"
#include "dist/job.h"
#include "dist/memory_report.h"
#include "dist/metrics.h"
#include "dist/report.h"
#include "dist/sampler.h"
#include "dist/sync_batchnorm.h"
#include "dist/trace.h"
#include "loom.h"
#include "optim/checkpoint_manager.h"
#include "optim/grad_scaler.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "tensor/cuda/runtime.h"  // synchronize
#include "tensor/cuda/upload.h"

namespace resnet18_cifar {

using namespace loom;

namespace {

std::string floats_json(const std::vector<float>& v) {
  nlohmann::json j = nlohmann::json::array();
  for (float x : v) j.push_back(x);
  return j.dump();
}

// The dtype a flag names: fp32, fp16 or bf16.
DType flag_dtype(const std::string& flag) {
  return flag == "fp16" ? kFloat16 : flag == "bf16" ? kBFloat16 : kFloat32;
}

// The autocast region --amp asks for: a disabled one for off.
struct AmpRegion : autocast::Guard {
  explicit AmpRegion(const std::string& amp)
      : autocast::Guard(amp == "fp16" ? kFloat16 : kBFloat16, amp != "off") {}
};

// The test loss and accuracy of the whole job: each rank evaluates its shard, then one allreduce.
dist::Totals evaluate(nn::Module& model, data::DataLoader& loader, cuda::Uploader& upload,
                      const dist::Job& job, const std::string& amp, MemoryFormat format) {
  model.eval();
  NoGradGuard no_grad;
  AmpRegion region(amp);
  dist::RunningTotals totals(job.device);
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    const Tensor labels = upload(batch->labels, job.device);
    const Tensor logits = model.forward(upload(batch->images, job.device, format));
    totals.add(cross_entropy(logits, labels), logits, labels);
  }
  model.train();
  return dist::sum_over_ranks(job, totals.read());
}

// A rank's loaders: its DistributedSampler share of the training set (all of it in a job of
// one), and a strided shard of the test set (Note [resnet18_cifar in parallel]).
struct Loaders {
  std::unique_ptr<data::DataLoader> train, test;
};
Loaders make_loaders(const Options& o, const Data& data, const dist::Job& job) {
  data::LoaderOptions train_options{
      .batch_size = o.batch_size, .shuffle = true, .seed = o.seed, .num_workers = o.workers};
  std::shared_ptr<const data::Sampler> train_sampler, test_sampler;
  int64_t train_share = data.train.dataset->size();
  if (job.parallel()) {
    train_sampler = std::make_shared<dist::DistributedSampler>(data.train.dataset->size(), job.rank,
                                                               job.world, /*shuffle=*/true, o.seed);
    test_sampler =
        std::make_shared<dist::ShardSampler>(data.test.dataset->size(), job.rank, job.world);
    train_share = train_sampler->size();
  }
  // A last batch of one sample cannot be batch-normalised in training: drop it in that case.
  train_options.drop_last = train_share % o.batch_size == 1;
  Loaders loaders;
  loaders.train = std::make_unique<data::DataLoader>(data.train.dataset, data.train.transforms,
                                                     train_options, train_sampler);
  loaders.test = std::make_unique<data::DataLoader>(
      data.test.dataset, data.test.transforms,
      data::LoaderOptions{.batch_size = std::max<int64_t>(o.batch_size, 256),
                          .shuffle = false,
                          .seed = o.seed,
                          .num_workers = o.workers},
      test_sampler);
  return loaders;
}

std::unique_ptr<optim::LRSchedule> make_schedule(const Options& o, optim::Optimizer& opt, double lr,
                                                 int64_t total_steps) {
  if (o.schedule == "onecycle") return std::make_unique<optim::OneCycleLR>(opt, lr, total_steps);
  if (o.schedule == "cosine") return std::make_unique<optim::CosineAnnealingLR>(opt, total_steps);
  // "step": x0.1 at half and at three quarters of the run.
  return std::make_unique<optim::MultiStepLR>(
      opt, std::vector<int64_t>{total_steps / 2, total_steps * 3 / 4}, 0.1);
}

// What the checkpoints say of the model, for readers that are not this program.
optim::Metadata model_info(const Options& o, const std::string& model, const Data& data,
                           int64_t in_channels) {
  return {{"model", model},
          {"width", std::to_string(o.width)},
          {"in_channels", std::to_string(in_channels)},
          {"num_classes", std::to_string(data.train.dataset->num_classes())},
          {"dataset", o.dataset},
          {"mean", floats_json(data.mean)},
          {"std", floats_json(data.std)}};
}

// The lines that say how this run trains.
void describe(const dist::Reporter& out, const Options& o, const dist::Job& job, double lr,
              dist::DistributedDataParallel* ddp, const optim::GradScaler& scaler,
              int64_t steps_per_epoch) {
  if (ddp) {
    out.say(
        "data parallel: world size %d (%s), global batch %lld, effective lr %g%s; %zu DDP "
        "buckets\n",
        job.world, job.group->backend().c_str(), static_cast<long long>(o.batch_size * job.world),
        lr, o.sync_bn ? ", SyncBatchNorm" : "", ddp->reducer().buckets().size());
    if (o.print_buckets) out.say("%s", ddp->bucket_plan().c_str());
  }
  out.say(
      "batch %lld, %d threads, %d loader workers; SGD lr %g momentum %g%s weight decay %g, "
      "schedule %s; %lld steps per epoch\n",
      static_cast<long long>(o.batch_size), get_num_threads(), o.workers, lr, o.momentum,
      o.nesterov ? " (nesterov)" : "", o.weight_decay, o.schedule.c_str(),
      static_cast<long long>(steps_per_epoch));
  if (o.amp != "off")
    out.say(
        "mixed precision: convolutions and the classifier in %s, the rest in float32, float32 "
        "master weights%s\n",
        o.amp.c_str(),
        scaler.is_enabled() ? detail::str("; dynamic loss scale from ", scaler.get_scale()).c_str()
                            : "");
}

// The end of an epoch: its line on the terminal and in the JSON log.
struct EpochSummary {
  int64_t epoch = 0;  // counted from 1
  dist::Totals train, test;
  double images_per_s = 0, seconds = 0, data_wait = 0;
  int64_t peak_bytes = 0, steps = 0, skipped = 0;
  double overlap = -1;  // -1: no DDP
  bool complete = true;
};
void report_epoch(dist::Reporter& out, const Options& o, const dist::Job& job,
                  const optim::GradScaler& scaler, const EpochSummary& e) {
  std::string extra;
  char buf[128];
  if (e.overlap >= 0) {
    std::snprintf(buf, sizeof buf, "  allreduce overlap %.0f%%", 100 * e.overlap);
    extra = buf;
  }
  if (scaler.is_enabled()) {
    std::snprintf(buf, sizeof buf, "  loss scale %g (%lld steps skipped)", scaler.get_scale(),
                  static_cast<long long>(e.skipped));
    extra += buf;
  }
  out.say(
      "epoch %lld/%d  train loss %.4f  acc %.2f%%  test loss %.4f  acc %.2f%%  %.0f img/s  "
      "data wait %.1f s  peak memory %.1f MiB%s  %.1f s%s\n",
      static_cast<long long>(e.epoch), o.epochs, e.train.mean_loss(), 100 * e.train.accuracy(),
      e.test.mean_loss(), 100 * e.test.accuracy(), e.images_per_s, e.data_wait,
      static_cast<double>(e.peak_bytes) / (1 << 20), extra.c_str(), e.seconds,
      e.complete ? "" : "  (stopped by --max-steps)");
  for (const auto& [tag, value] :
       {std::pair<const char*, double>{"epoch/train_loss", e.train.mean_loss()},
        {"epoch/train_acc", e.train.accuracy()},
        {"epoch/test_loss", e.test.mean_loss()},
        {"epoch/test_acc", e.test.accuracy()},
        {"epoch/images_per_s", e.images_per_s},
        {"epoch/peak_memory_mib", static_cast<double>(e.peak_bytes) / (1 << 20)}})
    out.scalar(tag, value, e.steps);
  out.flush();
  out.log(dist::LogRecord()
              .add("epoch", e.epoch)
              .add("train_loss", e.train.mean_loss())
              .add("train_acc", e.train.accuracy())
              .add("test_loss", e.test.mean_loss())
              .add("test_acc", e.test.accuracy())
              .add("images_per_s", e.images_per_s)
              .add("seconds", e.seconds)
              .add("peak_memory_bytes", e.peak_bytes)
              .add("steps", e.steps)
              .add("world_size", job.world)
              .add("amp", o.amp)
              .add("loss_scale", scaler.get_scale())
              .add("skipped_steps", e.skipped)
              .add("complete", e.complete));
}

}  // namespace

Data load_data(const Options& o) {
  using namespace loom::data;
  Data d;
  if (o.dataset == "cifar10") {
    const std::string dir = o.data_dir.empty() ? "cifar-10-batches-bin" : o.data_dir;
    d.mean = {0.4914f, 0.4822f, 0.4465f};
    d.std = {0.2470f, 0.2435f, 0.2616f};
    d.train = {
        std::make_shared<Cifar10>(dir, true),
        compose(RandomCrop(32, 4), RandomHorizontalFlip(), ToFloat(), Normalize(d.mean, d.std))};
    d.test = {std::make_shared<Cifar10>(dir, false), compose(ToFloat(), Normalize(d.mean, d.std))};
    d.description = "CIFAR-10 from " + dir;
  } else if (o.dataset == "fashion-mnist") {
    const std::string dir =
        o.data_dir.empty() ? "/usr/share/datasets/fashion-mnist" : o.data_dir;  // Debian's place
    d.mean = {0.2860f};
    d.std = {0.3530f};
    // Padded with black to 32 x 32, then flipped; normalised with Fashion-MNIST's statistics.
    d.train = {
        std::make_shared<FashionMnist>(dir, true),
        compose(Pad::to(32, 32), RandomHorizontalFlip(), ToFloat(), Normalize(d.mean, d.std))};
    d.test = {std::make_shared<FashionMnist>(dir, false),
              compose(Pad::to(32, 32), ToFloat(), Normalize(d.mean, d.std))};
    d.description = "Fashion-MNIST from " + dir;
  } else {
    LOOM_CHECK(o.dataset == "synthetic", ValueError, "unknown dataset '", o.dataset,
               "' (cifar10, fashion-mnist or synthetic)");
    d.mean = {0.5f, 0.5f, 0.5f};
    d.std = {0.29f, 0.29f, 0.29f};
    const int64_t n_test = std::max<int64_t>(1, o.synthetic_size / 5);
    d.train = {
        std::make_shared<Synthetic>(o.synthetic_size, Shape{3, 32, 32}, 10, o.seed),
        compose(RandomCrop(32, 4), RandomHorizontalFlip(), ToFloat(), Normalize(d.mean, d.std))};
    d.test = {std::make_shared<Synthetic>(n_test, Shape{3, 32, 32}, 10, o.seed + 1),
              compose(ToFloat(), Normalize(d.mean, d.std))};
    d.description = "synthetic random images";
  }
  d.description += " (" + std::to_string(d.train.dataset->size()) + " train, " +
                   std::to_string(d.test.dataset->size()) + " test)";
  return d;
}

double run(const Options& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  manual_seed(o.seed);
  const dist::Job job = dist::join_job({.gpus = o.gpus, .backend = o.backend});
  dist::Reporter out(job, /*progress_bar=*/isatty(STDOUT_FILENO) != 0);

  const Data data = load_data(o);
  const Shape image = data.train.transforms.output_shape(data.train.dataset->image_shape());
  auto model = nn::resnet18({.width = o.width,
                             .in_channels = image[0],
                             .num_classes = data.train.dataset->num_classes(),
                             .fuse_bn_relu = o.fuse_bn_relu});
  if (!o.fuse_bn_relu) out.say("batch norm, add and ReLU run one by one (--no-fusion)\n");
  model->to(job.device);
  // Weights in the order NHWC convolutions read, before the optimizer and DDP see them.
  if (o.channels_last) model->to(MemoryFormat::kChannelsLast);
  Loaders loaders = make_loaders(o, data, job);
  const int64_t steps_per_epoch = loaders.train->batches_per_epoch();
  const int64_t total_steps = std::max<int64_t>(1, steps_per_epoch * o.epochs);

  const double lr = o.lr * (o.scale_lr ? job.world : 1);
  optim::SGD optimizer(
      model->parameters(),
      {.lr = lr, .momentum = o.momentum, .weight_decay = o.weight_decay, .nesterov = o.nesterov});
  auto schedule = make_schedule(o, optimizer, lr, total_steps);
  // fp16 only: bf16 has float32's exponent range (Note [resnet18_cifar in mixed precision]).
  optim::GradScaler scaler({.enabled = o.amp == "fp16"});
  optim::GradScaler* saved_scaler = scaler.is_enabled() ? &scaler : nullptr;
  optim::CheckpointManager checkpoints(
      {.dir = o.checkpoint_dir, .writer = job.leader(), .world_size = job.world}, *model, optimizer,
      schedule.get(), saved_scaler, model_info(o, model->name(), data, image[0]));
  // --resume, or after a restart (LOOM_RESTART_COUNT > 0) the last checkpoint.
  const optim::Resumed resumed = checkpoints.resume(o.resume, *model, &optimizer, schedule.get(),
                                                    saved_scaler, /*model_only=*/o.eval_only);
  optim::TrainingProgress progress = resumed.progress;
  if (!resumed.path.empty()) {
    if (saved_scaler && !resumed.scaler_restored)
      out.say("the checkpoint holds no loss scale: starting from %g\n", scaler.get_scale());
    out.say("resumed from %s: %lld epochs and %lld steps done\n", resumed.path.c_str(),
            static_cast<long long>(progress.epoch), static_cast<long long>(progress.step));
  }
  out.say("resnet18_cifar: ResNet-18 width %lld (%lld parameters), %s\n",
          static_cast<long long>(o.width), static_cast<long long>(model->num_parameters()),
          data.description.c_str());
  out.open_log(o.log_json, /*append=*/!resumed.path.empty());
  out.open_tensorboard(o.tensorboard);

  cuda::Uploader
      upload;  // batches reach a GPU without stopping the host (Note [Uploading batches])
  const MemoryFormat format =
      o.channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
  if (o.channels_last) out.say("batches, activations and weights channels-last (NHWC)\n");
  if (o.eval_only) {
    const dist::Totals test = evaluate(*model, *loaders.test, upload, job, o.amp, format);
    out.say("test loss %.4f  test accuracy %.2f%%\n", test.mean_loss(), 100 * test.accuracy());
    out.log(dist::LogRecord()
                .add("epoch", progress.epoch)
                .add("test_loss", test.mean_loss())
                .add("test_acc", test.accuracy()));
    return test.accuracy();
  }

  // The network the training steps run through: the model, or DDP around it.
  std::shared_ptr<dist::DistributedDataParallel> ddp;
  if (job.parallel()) {
    if (o.sync_bn) dist::convert_sync_batchnorm(*model, job.group);
    ddp = std::make_shared<dist::DistributedDataParallel>(
        model, job.group, dist::DDPOptions{.comm_dtype = flag_dtype(o.comm_dtype)});
    if (scaler.is_enabled())
      scaler.set_found_inf_agreement(dist::found_inf_agreement(job.group, job.device));
  }
  nn::Module& net = ddp ? static_cast<nn::Module&>(*ddp) : *model;
  describe(out, o, job, lr, ddp.get(), scaler, steps_per_epoch);

  dist::StepTimeline timeline(job.rank, /*record=*/!o.trace.empty());
  dist::FirstStepMemoryReport memory(o.print_memory);
  dist::Totals test;
  bool stopped = false, evaluated = false;
  for (int64_t epoch = progress.epoch; epoch < o.epochs && !stopped; ++epoch) {
    if (o.max_steps >= 0 && progress.step >= o.max_steps) break;
    const double epoch_start = dist::steady_seconds();
    reset_peak_memory(job.device);  // the epoch's peak: weights, state, activations, batches
    const int64_t skip = progress.batch;
    loaders.train->start_epoch(epoch, skip);
    net.train();
    dist::RunningTotals train(job.device);
    dist::Throughput speed;
    int64_t skipped = 0;
    timeline.begin_epoch();
    timeline.restart();
    while (auto batch = loaders.train->next()) {
      if (o.max_steps >= 0 && progress.step >= o.max_steps) {
        stopped = true;
        break;
      }
      memory.before_step(job.device);
      const double step_start = dist::steady_seconds();
      timeline.mark("data", "data");
      // The step, as in PyTorch: zero the gradients, forward, loss, backward, step.
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
      timeline.mark("forward");
      scaler.scale(loss).backward();  // under DDP, each full bucket's allreduce starts here
      timeline.mark("backward");
      const bool stepped = scaler.step(optimizer);  // skipped when an fp16 gradient overflowed
      if (!stepped) ++skipped;
      scaler.update();
      schedule->step();
      timeline.mark("optimizer");
      timeline.end_step(ddp ? &ddp->reducer() : nullptr);

      train.add(loss, logits, labels);
      if (auto report = memory.after_step(stepped, *model, optimizer, ddp.get(), job.device))
        out.say("%s", report->c_str());
      speed.add_step(dist::steady_seconds() - step_start, batch->labels.size(0));
      ++progress.step;
      progress.batch = skip + speed.steps();
      if (out.tensorboard() && progress.step % o.tensorboard_every == 0) {
        out.scalar("train/loss", loss.item(), progress.step);
        out.scalar("train/lr", optimizer.lr(), progress.step);
        if (scaler.is_enabled()) out.scalar("train/loss_scale", scaler.get_scale(), progress.step);
        out.scalar("train/images_per_s", job.world * speed.running_images_per_s(), progress.step);
      }
      if (out.progress_due(progress.batch, steps_per_epoch)) {
        const dist::Totals so_far = train.read();
        out.progress({.epoch = epoch + 1,
                      .done = progress.batch,
                      .total = steps_per_epoch,
                      .loss = so_far.mean_loss(),
                      .accuracy = so_far.accuracy(),
                      .images_per_s = job.world * speed.running_images_per_s(),
                      .seconds_left = speed.eta(steps_per_epoch - progress.batch)});
      }
      timeline.restart();
    }
    out.end_progress();
    // A GPU may still be working on the last steps: their time belongs to training.
    if (job.device.is_cuda() && speed.steps() > 0) {
      const double wait_start = dist::steady_seconds();
      cuda::synchronize(job.device.index);
      speed.add_seconds(dist::steady_seconds() - wait_start);
    }
    if (!stopped) progress.epoch = epoch + 1, progress.batch = 0;
    EpochSummary summary;
    summary.epoch = epoch + 1;
    summary.train = dist::sum_over_ranks(job, train.read());
    test = summary.test = evaluate(*model, *loaders.test, upload, job, o.amp, format);
    evaluated = true;
    // Images per second of the whole job: every rank's images over this rank's time.
    summary.images_per_s = speed.images_per_s() * job.world;
    summary.seconds = dist::steady_seconds() - epoch_start;
    summary.data_wait = loaders.train->wait_seconds();
    summary.peak_bytes = memory_stats(job.device).peak_bytes;
    summary.steps = progress.step;
    summary.skipped = skipped;
    summary.overlap = ddp && speed.steps() > 0 ? timeline.epoch_overlap() : -1;
    summary.complete = !stopped;
    report_epoch(out, o, job, scaler, summary);
    if (!stopped) checkpoints.save_epoch(progress);
  }
  if (!evaluated)
    test = evaluate(*model, *loaders.test, upload, job, o.amp, format);  // no epoch left
  checkpoints.save_last(progress);
  if (timeline.overlap_steps() > 0)
    out.say(
        "communication hidden behind backward: %.0f%% of the allreduce time (mean over %lld "
        "steps)\n",
        100 * timeline.mean_overlap(), static_cast<long long>(timeline.overlap_steps()));
  if (!o.trace.empty()) {
    timeline.trace().write(o.trace, job.store.get(), job.world);
    out.say("trace of %zu events per rank written to %s\n", timeline.trace().size(),
            o.trace.c_str());
  }
  out.say("test accuracy %.2f%%\n", 100 * test.accuracy());
  return test.accuracy();
}

}  // namespace resnet18_cifar

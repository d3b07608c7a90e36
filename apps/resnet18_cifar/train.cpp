// apps/resnet18_cifar/train.cpp — datasets and the training loop of resnet18_cifar.
//
// One optimizer step: zero_grad; forward, cross-entropy, backward for each of --accumulate
// micro-batches (Note [Gradient accumulation] in dist/train_options.h); clip (--grad-clip);
// the SGD, Adam or AdamW step; the schedule's step.
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
// Note [resnet18_cifar's strategies]
// --strategy picks how the gradients are averaged, the ways docs/inside.md compares:
//   dp       DataParallel (Note [DataParallel]): one process, no launcher; --nproc N makes N
//            replicas on threads of it, each on a chunk of --batch-size (the global batch).
//   horovod  every rank trains the bare model; DistributedOptimizer (Note [Horovod-style
//            averaging]) averages the gradients in step(), after backward. Rank 0's weights
//            and optimizer state are broadcast at the start (after a resume too).
//   ddp      the default: DistributedDataParallel's buckets, overlapped with backward.
//   zero1-3  --zero 1, 2, 3 (Note [resnet18_cifar under ZeRO]).
// Every one of them steps as one process on the global batch would (dp, horovod and ddp to
// rounding; batch norm's statistics are each replica's or rank's own, but with --sync-bn).
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
// --grad-clip with fp16 unscales the gradients first (scaler.unscale_), so that the norm clipped is
// the true one, as PyTorch's recipe does.
//
// The loop's parts are library code: dist/job.h (joining the job), dist/sampler.h, dist/metrics.h
// (totals summed over ranks), dist/train_options.h (the optimizer), optim/checkpoint_manager.h,
// dist/trace.h (the step timeline), dist/memory_report.h (Note [The memory report]) and
// dist/report.h (terminal, JSON log). run() below is the loop itself; what it calls above it.

#include "train.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/train_flags.h"
#include "data/cifar10.h"
#include "data/idx.h"
#include "data/loader.h"
#include "data/sha256.h"
#include "data/synthetic.h"
#include "dist/data_parallel.h"
#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/health.h"
#include "dist/horovod.h"
#include "dist/job.h"
#include "dist/memory_plan.h"
#include "dist/memory_report.h"
#include "dist/metrics.h"
#include "dist/powersgd.h"
#include "dist/report.h"
#include "dist/sampler.h"
#include "dist/sync_batchnorm.h"
#include "dist/trace.h"
#include "dist/train_options.h"
#include "dist/zero.h"
#include "loom.h"
#include "optim/checkpoint_manager.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/schedule.h"
#include "tensor/accelerator.h"
#include "tensor/conv.h"
#include "tensor/cpu_info.h"

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

// Note [Frozen batch norm]
// --freeze-bn trains with every batch norm in eval mode: it normalises with its running mean and
// variance, which no step changes, so the layer is a fixed per-channel affine map of its input
// followed by its (trained) weight and bias. detectron2's FrozenBatchNorm2d also fixes the weight
// and bias; here they keep training. What it buys: a micro-batch's normalisation no longer
// depends on the other images of the micro-batch, so N accumulated micro-batches of B give the
// step that one batch of N x B gives (Note [Gradient accumulation] in dist/train_options.h), and
// small per-device batches do not train on noisy statistics (fine-tuning from a checkpoint).
// From scratch the running statistics are the initial ones (mean 0, variance 1).
void train_mode(nn::Module& net, bool freeze_bn) {
  net.train();
  if (freeze_bn)
    net.apply([](nn::Module& m) {
      if (dynamic_cast<nn::BatchNorm2d*>(&m)) m.eval();
    });
}

// The test loss and accuracy of the whole job: each rank evaluates its shard, then one allreduce.
dist::Totals evaluate(nn::Module& model, data::DataLoader& loader, BatchUploader& upload,
                      const dist::Job& job, const std::string& amp, MemoryFormat format) {
  model.eval();
  NoGradGuard no_grad;
  AmpRegion region(amp);
  dist::RunningTotals totals(job.device);
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    dist::heartbeat();
    const Tensor labels = upload(batch->labels, job.device);
    const Tensor logits = model.forward(upload(batch->images, job.device, format));
    totals.add(cross_entropy(logits, labels), logits, labels);
  }
  model.train();
  return dist::sum_over_ranks(job, totals.read());
}

// ResNet-18 for the dataset's images and classes, on the job's device.
std::shared_ptr<nn::ResNet> build_model(const Options& o, const Data& data, const dist::Job& job) {
  const Shape image = data.train.transforms.output_shape(data.train.dataset->image_shape());
  auto model = nn::resnet18({.width = o.width,
                             .in_channels = image[0],
                             .num_classes = data.train.dataset->num_classes(),
                             .fuse_bn_relu = o.fuse_bn_relu});
  model->to(job.device);
  // Weights in the order NHWC convolutions read, before the optimizer and DDP see them.
  if (o.channels_last) model->to(MemoryFormat::kChannelsLast);
  return model;
}
std::shared_ptr<nn::ResNet> make_model(const Options& o, const Data& data, const dist::Job& job,
                                       const dist::Reporter& out) {
  if (!o.fuse_bn_relu) out.say("batch norm, add and ReLU run one by one (--no-fusion)\n");
  return build_model(o, data, job);
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
optim::Metadata model_info(const Options& o, const nn::ResNet& model, const Data& data) {
  const Shape image = data.train.transforms.output_shape(data.train.dataset->image_shape());
  return {{"model", model.name()},
          {"width", std::to_string(o.width)},
          {"in_channels", std::to_string(image[0])},
          {"num_classes", std::to_string(data.train.dataset->num_classes())},
          {"dataset", o.dataset},
          {"mean", floats_json(data.mean)},
          {"std", floats_json(data.std)}};
}

// --resume, or after a restart (LOOM_RESTART_COUNT > 0) the last checkpoint: what was restored.
optim::Resumed resume(const Options& o, const optim::CheckpointManager& checkpoints,
                      nn::Module& model, optim::Optimizer& optimizer, optim::LRSchedule& schedule,
                      optim::GradScaler* scaler, const dist::Reporter& out) {
  const optim::Resumed resumed = checkpoints.resume(o.resume, model, &optimizer, &schedule, scaler,
                                                    /*model_only=*/o.eval_only);
  if (!resumed.path.empty()) {
    if (scaler && !resumed.scaler_restored)
      out.say("the checkpoint holds no loss scale: starting from %g\n", scaler->get_scale());
    out.say("resumed from %s: %lld epochs and %lld steps done\n", resumed.path.c_str(),
            static_cast<long long>(resumed.progress.epoch),
            static_cast<long long>(resumed.progress.step));
  }
  return resumed;
}

// --eval-only: the test metrics of the resumed weights, printed and logged.
double evaluate_only(const Options& o, nn::Module& model, data::DataLoader& test_loader,
                     BatchUploader& upload, const dist::Job& job, MemoryFormat format,
                     const optim::TrainingProgress& progress, dist::Reporter& out) {
  const dist::Totals test = evaluate(model, test_loader, upload, job, o.amp, format);
  out.say("test loss %.4f  test accuracy %.2f%%\n", test.mean_loss(), 100 * test.accuracy());
  out.log(dist::LogRecord()
              .add("epoch", progress.epoch)
              .add("test_loss", test.mean_loss())
              .add("test_acc", test.accuracy()));
  return test.accuracy();
}

// The run's first line, and the JSON log and TensorBoard files it writes (`append`: resumed).
void open_reports(dist::Reporter& out, const Options& o, const nn::ResNet& model, const Data& data,
                  bool append) {
  out.say("resnet18_cifar: ResNet-18 width %lld (%lld parameters), %s\n",
          static_cast<long long>(o.width), static_cast<long long>(model.num_parameters()),
          data.description.c_str());
  out.open_log(o.log_json, append);
  out.open_tensorboard(o.tensorboard);
}

// The layout batches are stored in on the device (--channels-last).
MemoryFormat batch_format(const Options& o, const dist::Reporter& out) {
  if (!o.channels_last) return MemoryFormat::kContiguous;
  out.say("batches, activations and weights channels-last (NHWC)\n");
  return MemoryFormat::kChannelsLast;
}

// The micro-batches the next optimizer step takes: --accumulate, fewer at the end of an epoch;
// 0 at the end of the epoch, or once --max-steps steps are done.
int64_t step_size(const dist::TrainOptions& t, const optim::TrainingProgress& progress,
                  int64_t batches_per_epoch) {
  if (t.max_steps >= 0 && progress.step >= t.max_steps) return 0;
  return std::min(t.accumulate, batches_per_epoch - progress.batch);
}

// In a job of several ranks: the model as SyncBatchNorm (--sync-bn) inside DDP, and the loss
// scaler's skips agreed over the ranks; null in a job of one.
std::shared_ptr<dist::DistributedDataParallel> wrap_for_the_job(const Options& o,
                                                                const dist::Job& job,
                                                                const nn::ModulePtr& model,
                                                                optim::GradScaler& scaler) {
  if (!job.parallel()) return nullptr;
  if (o.sync_bn) dist::convert_sync_batchnorm(*model, job.group);
  auto ddp = std::make_shared<dist::DistributedDataParallel>(
      model, job.group, dist::DDPOptions{.comm_dtype = flag_dtype(o.comm_dtype)});
  if (o.powersgd > 0)
    ddp->register_comm_hook(dist::powersgd_hook(
        {.matrix_approximation_rank = o.powersgd, .start_powersgd_iter = o.powersgd_start}));
  if (scaler.is_enabled())
    scaler.set_found_inf_agreement(dist::found_inf_agreement(job.group, job.device));
  return ddp;
}

// Note [resnet18_cifar under ZeRO]
// --zero 1 and 2 wrap the model in DDP and the optimizer in ZeroRedundancyOptimizer (its
// pieces of each bucket); --zero 3 wraps the model in FullyShardedDataParallel, a unit per
// stage (layer1 .. layer4; the stem, the last norm and the classifier in the root). The
// optimizer updates this rank's pieces only, so clipping sums the squares over the ranks and
// the loss scaler agrees on overflows across them. Training checkpoints hold the whole
// optimizer state, which no rank has under ZeRO: --checkpoint-dir, --resume and --eval-only are
// refused (dist/sharded_checkpoint.h writes and reshards sharded ones for programs).
struct Sharded {
  std::shared_ptr<dist::DistributedDataParallel> ddp;
  std::shared_ptr<dist::FullyShardedDataParallel> fsdp;
  dist::ZeroRedundancyOptimizer* zero = nullptr;  // owned by `optimizer`
  std::unique_ptr<optim::Optimizer> optimizer;    // null without ZeRO
};
Sharded shard_for_the_job(const Options& o, const dist::Job& job, const nn::ModulePtr& model,
                          double lr) {
  Sharded s;
  if (o.zero == 0) return s;
  LOOM_CHECK(job.parallel(), ValueError, "--zero ", o.zero,
             " shards across ranks: give --nproc N or --gpus N with N > 1");
  LOOM_CHECK(o.checkpoint_dir.empty() && o.resume.empty() && !o.eval_only, ValueError, "--zero ",
             o.zero,
             ": resnet18_cifar's checkpoints hold the whole optimizer state, which no rank has "
             "under ZeRO; run without --checkpoint-dir, --resume and --eval-only (Note "
             "[resnet18_cifar under ZeRO])");
  if (o.sync_bn) dist::convert_sync_batchnorm(*model, job.group);
  if (o.zero == 3) {
    // Under --amp, FSDP's mixed precision (Note [FSDP mixed precision]).
    dist::FSDPOptions fsdp_options;
    if (o.amp != "off") fsdp_options.param_dtype = o.amp == "bf16" ? kBFloat16 : kFloat16;
    s.fsdp = std::make_shared<dist::FullyShardedDataParallel>(model, job.group, fsdp_options);
    s.optimizer = dist::make_optimizer(o.train, s.fsdp->optimizer_params(), lr);
    return s;
  }
  // Under --amp bf16 the model itself is 16-bit, with float32 masters of this rank's pieces
  // (Note [ZeRO with a 16-bit model]).
  if (o.amp == "bf16") model->to(kBFloat16);
  s.ddp = std::make_shared<dist::DistributedDataParallel>(
      model, job.group, dist::DDPOptions{.comm_dtype = flag_dtype(o.comm_dtype)});
  auto zero = std::make_unique<dist::ZeroRedundancyOptimizer>(
      *s.ddp,
      [&](std::vector<Tensor> pieces, const std::vector<size_t>&) {
        return dist::make_optimizer(o.train, std::move(pieces), lr);
      },
      dist::ZeroOptions{.stage = o.zero});
  s.zero = zero.get();
  s.optimizer = std::move(zero);
  return s;
}

// The lines that say how this run trains.
void describe(const dist::Reporter& out, const Options& o, const dist::Job& job, double lr,
              dist::DistributedDataParallel* ddp, const optim::GradScaler& scaler,
              int64_t steps_per_epoch) {
  const int64_t accumulate = o.train.accumulate;
  if (ddp) {
    const std::string carrier = job.group->carrier();
    out.say(
        "data parallel: world size %d (%s), global batch %lld, effective lr %g%s; %zu DDP "
        "buckets\n",
        job.world, carrier.c_str(), static_cast<long long>(o.batch_size * accumulate * job.world),
        lr, o.sync_bn ? ", SyncBatchNorm" : "", ddp->reducer().buckets().size());
    if (o.print_buckets) out.say("%s", ddp->bucket_plan().c_str());
  }
  if (accumulate > 1)
    out.say(
        "gradient accumulation: %lld micro-batches of %lld per step, effective batch %lld "
        "(%lld per rank)\n",
        static_cast<long long>(accumulate), static_cast<long long>(o.batch_size),
        static_cast<long long>(o.batch_size * accumulate * job.world),
        static_cast<long long>(o.batch_size * accumulate));
  if (o.freeze_bn) out.say("batch norm frozen: running statistics, eval mode (--freeze-bn)\n");
  out.say(
      "batch %lld, %d threads (%s kernels), %d loader workers; %s, schedule %s; %lld steps per "
      "epoch\n",
      static_cast<long long>(o.batch_size), get_num_threads(),
      std::string(to_string(cpu_isa())).c_str(), o.workers,
      dist::describe_optimizer(o.train, lr).c_str(), o.schedule.c_str(),
      static_cast<long long>(steps_per_epoch));
  if (o.amp != "off") {
    // Batch norm keeps 16-bit activations on a GPU, and on the CPU a bfloat16 one unless it is a
    // SyncBatchNorm (Note [Autocast policy]).
    const bool bn_16bit = job.device.is_cuda() || (o.amp == "bf16" && !o.sync_bn);
    out.say(
        "mixed precision: convolutions%s and the classifier in %s, the rest in float32, float32 "
        "master weights%s\n",
        bn_16bit ? ", batch norm" : "", o.amp.c_str(),
        scaler.is_enabled() ? detail::str("; dynamic loss scale from ", scaler.get_scale()).c_str()
                            : "");
  }
}

// After an optimizer step: the training scalars (every --tensorboard-every steps) and the bar.
void report_step(dist::Reporter& out, const Options& o, const dist::Job& job, const Tensor& loss,
                 const optim::Optimizer& optimizer, const optim::GradScaler& scaler,
                 const dist::Throughput& speed, const dist::RunningTotals& train,
                 const optim::TrainingProgress& progress, int64_t epoch,
                 int64_t batches_per_epoch) {
  const double images_per_s = job.world * speed.running_images_per_s();
  if (out.tensorboard() && progress.step % o.tensorboard_every == 0) {
    out.scalar("train/loss", loss.item(), progress.step);  // the step's last micro-batch
    out.scalar("train/lr", optimizer.lr(), progress.step);
    if (scaler.is_enabled()) out.scalar("train/loss_scale", scaler.get_scale(), progress.step);
    out.scalar("train/images_per_s", images_per_s, progress.step);
  }
  if (out.progress_due(progress.batch, batches_per_epoch)) {
    const dist::Totals so_far = train.read();
    const int64_t steps_left =
        dist::optimizer_steps(batches_per_epoch - progress.batch, o.train.accumulate);
    out.progress({.epoch = epoch + 1,
                  .done = progress.batch,
                  .total = batches_per_epoch,
                  .loss = so_far.mean_loss(),
                  .accuracy = so_far.accuracy(),
                  .images_per_s = images_per_s,
                  .seconds_left = speed.eta(steps_left)});
  }
}

// What an epoch counts as it trains.
struct EpochMeter {
  explicit EpochMeter(Device device) : train(device) {}
  double start = dist::steady_seconds();
  dist::RunningTotals train;  // over this rank's micro-batches
  dist::Throughput speed;     // per optimizer step
  int64_t skipped = 0;        // steps the loss scaler skipped (an fp16 gradient overflowed)
};

// The end of an epoch: its line on the terminal and in the JSON log.
struct EpochSummary {
  int64_t epoch = 0;  // counted from 1
  dist::Totals train, test;
  double images_per_s = 0, seconds = 0, data_wait = 0;
  int64_t peak_bytes = 0, steps = 0, skipped = 0;
  double overlap = -1;  // -1: no DDP
  bool complete = true;
  // Per step: the collectives' bus bytes of this rank (Note [Bytes moved]), or under dp what
  // went through device 0 (Note [DataParallel]).
  double bytes_per_step = 0;
};
// The epoch's summary: the training metrics summed over the ranks (one allreduce), `test` as
// evaluated, the throughput, time and memory.
EpochSummary summarise(const dist::Job& job, int64_t epoch, const EpochMeter& meter,
                       const dist::Totals& test, const data::DataLoader& train_loader,
                       const dist::StepTimeline& timeline, bool ddp, int64_t steps, bool complete,
                       double bytes_per_step) {
  return {.epoch = epoch + 1,
          .train = dist::sum_over_ranks(job, meter.train.read()),
          .test = test,
          // Images per second of the whole job: every rank's images over this rank's time.
          .images_per_s = meter.speed.images_per_s() * job.world,
          .seconds = dist::steady_seconds() - meter.start,
          .data_wait = train_loader.wait_seconds(),
          .peak_bytes = memory_stats(job.device).peak_bytes,
          .steps = steps,
          .skipped = meter.skipped,
          .overlap = ddp && meter.speed.steps() > 0 ? timeline.epoch_overlap() : -1,
          .complete = complete,
          .bytes_per_step = bytes_per_step};
}

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
              .add("complete", e.complete)
              .add("strategy", o.strategy)
              .add("bytes_per_step", e.bytes_per_step)
              .add("overlap", e.overlap));
}

// A GPU may still be working on the epoch's last steps: their time belongs to training.
void wait_for_device(const dist::Job& job, dist::Throughput& speed) {
  if (!job.device.is_cuda() || speed.steps() == 0) return;
  const double wait_start = dist::steady_seconds();
  synchronize(job.device);
  speed.add_seconds(dist::steady_seconds() - wait_start);
}

// The run's last lines: how much communication backward hid, and the trace (--trace).
void report_run(const dist::Reporter& out, const Options& o, const dist::Job& job,
                const dist::StepTimeline& timeline) {
  dist::report_communication(out, timeline, job, o.zero > 0 ? "reduce-scatter" : "allreduce",
                             o.trace);
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

// What a rank loaded, cheaply: the split sizes and a hash of three examples of each, compared
// across ranks at start-up (dist::check_same_on_every_rank), so that hosts whose copies of the
// data differ stop before they train on different data.
std::string data_fingerprint(const Data& d) {
  std::string bytes;
  for (const data::Dataset* set : {d.train.dataset.get(), d.test.dataset.get()}) {
    const int64_t n = set->size();
    bytes += std::to_string(n) + ";";
    for (const int64_t i : {int64_t{0}, n / 2, n - 1}) {
      if (i < 0 || i >= n) continue;
      const data::Example e = set->get(i);
      const Tensor image = e.image.contiguous();
      bytes.append(static_cast<const char*>(image.data()), image.nbytes());
      bytes += std::to_string(e.label) + ";";
    }
  }
  return std::to_string(d.train.dataset->size()) + " train and " +
         std::to_string(d.test.dataset->size()) + " test images, sha256 of samples " +
         data::sha256_hex(bytes).substr(0, 16);
}

std::string format_ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g ms", 1e3 * seconds);
  return text;
}

// Under --conv-algorithm benchmark: what each layer chose and what each method took.
void report_conv_choices(const dist::Reporter& out) {
  const std::vector<kernels::Conv2dChoice> choices = kernels::conv2d_choices();
  if (choices.empty()) return;
  out.say("convolutions chosen by measurement (Note [Choosing convolutions by measurement]):\n");
  for (const kernels::Conv2dChoice& c : choices) {
    std::string times;
    for (const auto& [method, seconds] : c.seconds)
      times += detail::str(times.empty() ? "" : ", ", method, " ", format_ms(seconds));
    out.say("  x %s%s w %s stride %lld pad %lld, %s: %s (%s)\n", detail::str(c.x).c_str(),
            c.channels_last ? " channels-last" : "", detail::str(c.weight).c_str(),
            static_cast<long long>(c.stride[0]), static_cast<long long>(c.padding[0]),
            c.pass.c_str(), c.chosen.c_str(), times.c_str());
  }
}

double run(const Options& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  kernels::set_conv2d_algorithm(kernels::parse_conv2d_algorithm(o.conv_algorithm));
  manual_seed(o.seed);
  const dist::Job job = dist::join_job({.gpus = o.gpus, .backend = o.backend});
  dist::apply_max_memory(o.train, job.device);  // --max-memory
  dist::Reporter out(job, /*progress_bar=*/isatty(STDOUT_FILENO) != 0);

  const Data data = load_data(o);
  dist::check_same_on_every_rank(job, "data", data_fingerprint(data));
  const auto model = make_model(o, data, job, out);
  Loaders loaders = make_loaders(o, data, job);
  const int64_t batches_per_epoch = loaders.train->batches_per_epoch();  // micro-batches
  const int64_t steps_per_epoch = dist::optimizer_steps(batches_per_epoch, o.train.accumulate);

  const double lr = o.train.lr * (o.scale_lr ? job.world : 1);
  // Under ZeRO the optimizer takes this rank's pieces: the sharding wrapper comes first.
  Sharded sharded = shard_for_the_job(o, job, model, lr);
  // Horovod-style (Note [resnet18_cifar's strategies]): rank 0's weights, then the optimizer
  // that averages in step().
  const bool horovod = o.strategy == "horovod";
  if (horovod) {
    LOOM_CHECK(job.parallel(), ValueError,
               "--strategy horovod averages across ranks: give --nproc N or --gpus N with N > 1");
    LOOM_CHECK(o.comm_dtype == "fp32", ValueError, "--comm-dtype ", o.comm_dtype,
               " compresses DDP's buckets; --strategy horovod sends float32 (use ddp)");
    if (o.sync_bn) dist::convert_sync_batchnorm(*model, job.group);
    dist::broadcast_parameters(*job.group, model->state_dict());
  }
  const std::unique_ptr<optim::Optimizer> optimizer =
      sharded.optimizer ? std::move(sharded.optimizer)
      : horovod         ? std::make_unique<dist::DistributedOptimizer>(
                      dist::make_optimizer(o.train, model->parameters(), lr), job.group)
                : dist::make_optimizer(o.train, model->parameters(), lr);
  const auto schedule =
      make_schedule(o, *optimizer, lr, std::max<int64_t>(1, steps_per_epoch * o.epochs));
  // fp16 only: bf16 has float32's exponent range (Note [resnet18_cifar in mixed precision]).
  optim::GradScaler scaler({.enabled = o.amp == "fp16"});
  optim::GradScaler* saved_scaler = scaler.is_enabled() ? &scaler : nullptr;
  optim::CheckpointManager checkpoints(
      {.dir = o.checkpoint_dir, .writer = job.leader(), .world_size = job.world}, *model,
      *optimizer, schedule.get(), saved_scaler, model_info(o, *model, data));
  const optim::Resumed resumed =
      resume(o, checkpoints, *model, *optimizer, *schedule, saved_scaler, out);
  optim::TrainingProgress progress = resumed.progress;
  if (horovod) dist::broadcast_optimizer_state(*job.group, *optimizer);
  open_reports(out, o, *model, data, /*append=*/!resumed.path.empty());

  BatchUploader upload;  // batches reach a GPU without stopping the host
  const MemoryFormat format = batch_format(o, out);
  if (o.eval_only)
    return evaluate_only(o, *model, *loaders.test, upload, job, format, progress, out);

  // The network the training steps run through: the model, or DDP, FSDP or DataParallel
  // around it.
  const bool dp = o.strategy == "dp";
  const auto ddp = o.zero > 0        ? sharded.ddp
                   : (horovod || dp) ? nullptr
                                     : wrap_for_the_job(o, job, model, scaler);
  const auto fsdp = sharded.fsdp;
  const auto data_parallel = dp ? std::make_shared<dist::DataParallel>(
                                      model, dist::data_parallel_devices(job.device, o.dp_devices),
                                      [&] { return build_model(o, data, job); })
                                : nullptr;
  if ((o.zero > 0 || horovod) && scaler.is_enabled())
    scaler.set_found_inf_agreement(dist::found_inf_agreement(job.group, job.device));
  const dist::DataParallelism parallel{.ddp = ddp.get(), .zero = sharded.zero, .fsdp = fsdp.get()};
  const dist::TrainingMemoryExplainer explain_out_of_memory(*model, *optimizer, parallel);
  nn::Module& net = fsdp            ? static_cast<nn::Module&>(*fsdp)
                    : ddp           ? static_cast<nn::Module&>(*ddp)
                    : data_parallel ? static_cast<nn::Module&>(*data_parallel)
                                    : *model;
  describe(out, o, job, lr, ddp.get(), scaler, steps_per_epoch);
  if (data_parallel)
    out.say(
        "DataParallel: %d replicas on threads of this process, %d threads each, chunks of "
        "about %lld images (Note [DataParallel])\n",
        o.dp_devices, std::max(1, get_num_threads() / o.dp_devices),
        static_cast<long long>((o.batch_size + o.dp_devices - 1) / o.dp_devices));
  if (horovod)
    out.say(
        "Horovod-style: world size %d, gradients averaged in step() after backward, fusion "
        "buffers of %lld MiB (Note [Horovod-style averaging])\n",
        job.world, static_cast<long long>(dist::DistributedOptimizerOptions{}.fusion_bytes >> 20));
  if (sharded.zero) out.say("%s", dist::first_line(sharded.zero->plan()).c_str());
  if (fsdp) out.say("%s", dist::first_line(fsdp->plan()).c_str());
  // FSDP: every unit gathered while the whole model is evaluated.
  auto evaluate_model = [&] {
    const auto gathered = fsdp ? fsdp->summon_full_params() : nullptr;
    return evaluate(*model, *loaders.test, upload, job, o.amp, format);
  };
  dist::CollectiveCounters moved;  // by the training steps (Note [Bytes moved])

  dist::StepTimeline timeline(job.rank, /*record=*/!o.trace.empty());
  dist::StepMemoryReport memory(o.print_memory);
  std::optional<dist::Totals> test;
  bool stopped = false;
  for (int64_t epoch = progress.epoch; epoch < o.epochs && !stopped; ++epoch) {
    if (o.train.max_steps >= 0 && progress.step >= o.train.max_steps) break;
    reset_peak_memory(job.device);  // the epoch's peak: weights, state, activations, batches
    loaders.train->start_epoch(epoch, progress.batch);
    train_mode(net, o.freeze_bn);
    EpochMeter meter(job.device);
    timeline.begin_epoch();
    timeline.restart();
    double epoch_bytes = 0;  // EpochSummary::bytes_per_step
    // One optimizer step per `micro` micro-batches (Note [Gradient accumulation]).
    while (const int64_t micro = step_size(o.train, progress, batches_per_epoch)) {
      memory.before_step(job.device);
      if (job.parallel()) job.group->reset_counters();
      const double step_start = dist::steady_seconds();
      // The step, as in PyTorch: zero the gradients; forward, loss, backward per micro-batch; step.
      optimizer->zero_grad();
      checkpoints.changed();
      Tensor loss;
      int64_t images = 0;
      for (int64_t i = 0; i < micro; ++i) {
        dist::heartbeat();  // Note [Job health]: the launcher sees the rank make progress
        const auto batch = loaders.train->next();
        LOOM_ASSERT(batch, "the loader ended its epoch before batches_per_epoch batches");
        timeline.mark("data", "data");
        const Tensor x = upload(batch->images, job.device, format);
        const Tensor y = upload(batch->labels, job.device);
        // Under DDP the gradients of all micro-batches but the last stay local (no_sync).
        const auto local = ddp && i + 1 < micro ? ddp->no_sync() : nullptr;
        Tensor logits;
        {
          AmpRegion region(o.amp);
          logits = net.forward(x);
          loss = cross_entropy(logits, y);
        }
        timeline.mark("forward");
        // Under DDP, each full bucket's allreduce starts during the last micro-batch's backward.
        scaler.scale(micro > 1 ? loss / static_cast<double>(micro) : loss).backward();
        timeline.mark("backward");
        if (data_parallel)
          epoch_bytes += static_cast<double>(data_parallel->last_report().through_device0());
        meter.train.add(loss, logits, y);
        images += batch->labels.size(0);
      }
      // Horovod-style: averaged now, so that unscaling and clipping see the averages (the
      // step then does not average again: DistributedOptimizer::synchronize).
      if (horovod) {
        static_cast<dist::DistributedOptimizer&>(*optimizer).synchronize();
        timeline.mark("allreduce");
      }
      if (o.train.grad_clip > 0) {
        scaler.unscale_(*optimizer);  // clip the true gradients, not the loss-scaled ones
        if (sharded.zero)
          sharded.zero->clip_grad_norm_(o.train.grad_clip);  // over every rank's pieces
        else if (fsdp)
          fsdp->clip_grad_norm_(o.train.grad_clip);
        else
          optim::clip_grad_norm_(optimizer->params(), o.train.grad_clip);
      }
      const bool stepped = scaler.step(*optimizer);  // skipped when an fp16 gradient overflowed
      if (!stepped) ++meter.skipped;
      scaler.update();
      schedule->step();
      timeline.mark("optimizer");
      if (fsdp)
        timeline.end_step(fsdp->timeline());  // each unit's gathers and reduce-scatter
      else
        timeline.end_step(ddp ? &ddp->reducer() : nullptr);
      if (job.parallel()) {
        const dist::CollectiveCounters step_moved = job.group->counters();
        dist::accumulate(moved, step_moved);
        for (const auto& [op, stats] : step_moved)
          epoch_bytes += static_cast<double>(stats.bus_bytes);
      }

      if (auto report = memory.after_step(stepped, *model, *optimizer, parallel, job.device))
        out.say("%s", report->c_str());
      meter.speed.add_step(dist::steady_seconds() - step_start, images);
      ++progress.step;
      progress.batch += micro;
      if (o.checkpoint_every > 0 && progress.step % o.checkpoint_every == 0)
        checkpoints.save_last(progress);  // a restart resumes here (Note [Restarts])
      report_step(out, o, job, loss, *optimizer, scaler, meter.speed, meter.train, progress, epoch,
                  batches_per_epoch);
      timeline.restart();
    }
    out.end_progress();
    wait_for_device(job, meter.speed);
    stopped = progress.batch < batches_per_epoch;  // by --max-steps
    if (!stopped) progress.epoch = epoch + 1, progress.batch = 0;
    test = evaluate_model();
    report_epoch(out, o, job, scaler,
                 summarise(job, epoch, meter, *test, *loaders.train, timeline,
                           job.parallel() && !horovod, progress.step, !stopped,
                           epoch_bytes / std::max<int64_t>(1, meter.speed.steps())));
    if (!stopped) checkpoints.save_epoch(progress);
  }
  if (!test) test = evaluate_model();  // no epoch left
  checkpoints.save_last(progress);
  report_run(out, o, job, timeline);
  report_conv_choices(out);
  if (job.parallel() && progress.step > resumed.progress.step)
    out.say(
        "collectives of rank %d over %lld training steps (%s; bus bytes: Note [Bytes moved]):\n%s",
        job.rank, static_cast<long long>(progress.step - resumed.progress.step),
        loom_apps::strategy_label(o.strategy, o.zero).c_str(),
        dist::format_counters(moved).c_str());
  if (data_parallel && progress.step > resumed.progress.step) {
    out.say("%s", data_parallel->last_report().describe().c_str());
  }
  out.say("test accuracy %.2f%%\n", 100 * test->accuracy());
  return test->accuracy();
}

}  // namespace resnet18_cifar

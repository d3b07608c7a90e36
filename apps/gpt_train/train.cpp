// apps/gpt_train/train.cpp — the text, the tokenizer, the model and the training loop of
// gpt_train.
//
// Note [gpt_train]
// One iteration is one optimizer step, as in nanoGPT: zero_grad; for each of --accumulate
// micro-batches, --batch-size windows of block + 1 tokens (Note [Text windows] in data/text.h:
// window g of micro-step s starts where Philox (seed, s, g) says), forward, the mean cross
// entropy divided by the micro-batch count, backward; the gradients' norm clipped to
// --grad-clip; AdamW (weight decay on the matrices and embeddings only); the learning rate
// warmed up linearly over --warmup steps, then a cosine from --lr down to --min-lr at --iters.
// Micro-step s of a job of W ranks takes windows g = rank * B ... rank * B + B - 1, so the job
// sees the windows one rank with batch W x B sees, and DDP averages the gradients (the same step
// up to rounding: tested).
// Every --eval-every iterations and at the end: the mean loss over --eval-iters batches of the
// training and the validation split (the same windows every time, drawn from their own seeds,
// shared out over the ranks), a line with both, the time per iteration, tokens per second and
// MFU, a JSON record (--log-json), TensorBoard scalars, and a checkpoint (--checkpoint-dir):
// last.safetensors (model, optimizer, schedule, generator and step: what --resume continues
// from, at the same windows) and, beside it, model.safetensors and config.json (Hugging Face's
// GPT2LMHeadModel loads that folder with from_pretrained). After training, rank 0 prints a
// sample from the model.
//
// Note [MFU]
// Model FLOPs utilisation = the model's FLOPs per token (nn::gpt_flops_per_token: 6 per
// parameter and token, plus the attention's 12 L T C) x tokens per second / the machine's peak.
// On a CPU the peak is the float32 FMA peak that each rank measures at start with its threads
// (tensor/cpu_info.h), so the job's peak is their sum; on a GPU, the device's dense peak for
// the precision it trains in (accelerator.h). As nanoGPT and llm.c report it, the recomputed
// scores of the fused attention's backward do not count: they are not the model's FLOPs.

#include "train.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>

#include "common/train_flags.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_tokenizer.h"
#include "data/sha256.h"
#include "data/text.h"
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
#include "dist/sharded_checkpoint.h"
#include "dist/trace.h"
#include "dist/zero.h"
#include "loom.h"
#include "nn/gpt.h"
#include "optim/checkpoint.h"
#include "optim/checkpoint_manager.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/schedule.h"
#include "tensor/accelerator.h"
#include "tensor/copy.h"
#include "tensor/cpu_info.h"

namespace gpt_train {

using namespace loom;
namespace fs = std::filesystem;

namespace {

// The tokenizer a run encodes with: the byte vocabulary of its text (or of its checkpoint), or
// GPT-2's byte-level BPE from --bpe-dir.
class Tokenizer {
 public:
  static Tokenizer bytes(std::string vocabulary) {
    Tokenizer t;
    t.bytes_.emplace(std::move(vocabulary));
    t.info_ = {.kind = "byte", .vocabulary = t.bytes_->vocabulary(), .files = {}};
    return t;
  }
  static Tokenizer bpe(const std::string& dir) {
    LOOM_CHECK(!dir.empty(), ValueError,
               "--tokenizer gpt2 needs --bpe-dir DIR (vocab.json and "
               "merges.txt, as Hugging Face's gpt2 folder has them)");
    Tokenizer t;
    t.bpe_.emplace(data::BpeTokenizer::from_dir(dir));
    t.info_.kind = "gpt2-bpe";
    for (const char* name : {"vocab.json", "merges.txt"})
      t.info_.files[name] = data::sha256_file_hex(fs::path(dir) / name);
    return t;
  }

  std::vector<int64_t> encode(std::string_view text) const {
    return bytes_ ? bytes_->encode(text) : bpe_->encode(text);
  }
  std::string decode(std::span<const int64_t> ids) const {
    return bytes_ ? bytes_->decode(ids) : bpe_->decode(ids);
  }
  int64_t vocab_size() const { return bytes_ ? bytes_->vocab_size() : bpe_->vocab_size(); }
  const nn::GPTTokenizerInfo& info() const { return info_; }
  std::string describe() const {
    return bytes_ ? detail::str("bytes (", vocab_size(), " symbols)")
                  : detail::str("GPT-2 BPE (", vocab_size(), " tokens)");
  }

 private:
  std::optional<data::ByteTokenizer> bytes_;
  std::optional<data::BpeTokenizer> bpe_;
  nn::GPTTokenizerInfo info_;
};

// A file gpt_train resumes or samples from: the configuration and tokenizer it records and the
// kind of file it is.
struct Source {
  std::string path;
  bool training_checkpoint = false;  // gpt_train's last.safetensors (loom.checkpoint metadata)
  bool sharded = false;              // or a --zero run's last.sharded folder
  std::optional<nn::GPTConfig> config;
  nn::GPTTokenizerInfo tokenizer;
};

Source inspect(const std::string& path) {
  Source s{.path = path, .training_checkpoint = false, .config = std::nullopt, .tokenizer = {}};
  if (dist::is_sharded_checkpoint(path)) {  // Note [Sharded checkpoints]
    const auto meta = dist::read_sharded_checkpoint_metadata(path);
    s.training_checkpoint = s.sharded = true;
    std::tie(s.config, s.tokenizer) = nn::read_gpt_metadata(meta, "'" + path + "'");
    LOOM_CHECK(s.config.has_value(), ValueError, "'", path, "' records no GPT configuration");
    return s;
  }
  LOOM_CHECK(fs::is_regular_file(path), IOError, "--resume: no file '", path, "'");
  const optim::Metadata meta = optim::read_checkpoint_metadata(path);
  s.training_checkpoint = meta.count("loom.checkpoint") > 0;
  std::tie(s.config, s.tokenizer) = nn::read_gpt_metadata(meta, "'" + path + "'");
  // A Hugging Face folder: model.safetensors beside config.json.
  const fs::path hf_config = fs::path(path).parent_path() / "config.json";
  if (!s.config && fs::is_regular_file(hf_config)) s.config = nn::read_hf_config(hf_config);
  LOOM_CHECK(s.config.has_value(), ValueError, "'", path,
             "' records no GPT configuration and has no config.json beside it");
  return s;
}

// The model flags as a configuration: the checkpoint's where there is one, and then every model
// flag given on the command line must agree with it.
nn::GPTConfig model_config(const Options& o, const std::optional<Source>& source,
                           int64_t vocab_size) {
  nn::GPTConfig flags{.vocab_size = vocab_size,
                      .block_size = o.block,
                      .n_embd = o.embd,
                      .n_layer = o.layers,
                      .n_head = o.heads,
                      .dropout = o.dropout,
                      .bias = o.bias};
  if (!source) {
    flags.validate();
    return flags;
  }
  nn::GPTConfig c = *source->config;
  auto agree = [&](const char* flag, auto given, auto saved) {
    LOOM_CHECK(!o.model_flags_given.count(flag) || given == saved, ValueError, flag, " ", given,
               " does not match the checkpoint '", source->path, "', whose model has ", saved);
  };
  agree("--layers", o.layers, c.n_layer);
  agree("--heads", o.heads, c.n_head);
  agree("--embd", o.embd, c.n_embd);
  agree("--block", o.block, c.block_size);
  agree("--bias", o.bias, c.bias);
  // Dropout is a training setting, not a shape: a resumed run may change it.
  if (o.model_flags_given.count("--dropout")) c.dropout = o.dropout;
  LOOM_CHECK(vocab_size <= c.vocab_size, ValueError, "the tokenizer has ", vocab_size,
             " tokens, more than the checkpoint's vocab_size ", c.vocab_size, " ('", source->path,
             "')");
  return c;
}

// The tokenizer: the checkpoint's (its byte vocabulary; its BPE files checked against the ones
// --bpe-dir holds), else the one the flags name, over the whole text.
Tokenizer make_tokenizer(const Options& o, const std::optional<Source>& source,
                         const std::string& text) {
  if (source && source->tokenizer.kind == "byte") {
    LOOM_CHECK(o.tokenizer == "byte", ValueError, "--tokenizer ", o.tokenizer, ": the checkpoint '",
               source->path, "' was trained on bytes");
    return Tokenizer::bytes(source->tokenizer.vocabulary);
  }
  if (o.tokenizer == "gpt2") {
    Tokenizer t = Tokenizer::bpe(o.bpe_dir);
    if (source && source->tokenizer.kind == "gpt2-bpe")
      for (const auto& [name, sha] : source->tokenizer.files) {
        const auto mine = t.info().files.find(name);
        LOOM_CHECK(mine != t.info().files.end() && mine->second == sha, ValueError, "--bpe-dir ",
                   o.bpe_dir, ": ", name, " is not the file the checkpoint '", source->path,
                   "' was trained with (sha256 ", sha, ")");
      }
    return t;
  }
  LOOM_CHECK(!source || source->tokenizer.kind.empty(), ValueError,
             "--tokenizer byte: the "
             "checkpoint '",
             source->path, "' was trained with GPT-2's BPE (--tokenizer gpt2)");
  LOOM_CHECK(!text.empty(), ValueError,
             "--tokenizer byte needs training text (--data) or a "
             "checkpoint that records its vocabulary");
  // The bytes of the whole text (both splits), so that the validation split encodes too.
  return Tokenizer::bytes(data::ByteTokenizer::from_text(text).vocabulary());
}

// Ids the model can embed: an id from a tokenizer larger than the model's vocabulary would not.
void check_ids(const std::vector<int64_t>& ids, int64_t vocab_size, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    LOOM_CHECK(ids[i] >= 0 && ids[i] < vocab_size, IndexError, what, ": token ", ids[i],
               " at position ", i, " is outside the model's vocabulary of ", vocab_size);
}

// The autocast region --amp asks for: a disabled one for off.
struct AmpRegion : autocast::Guard {
  explicit AmpRegion(const std::string& amp)
      : autocast::Guard(amp == "fp16" ? kFloat16 : kBFloat16, amp != "off") {}
};

// What the run trains on: the encoded splits and their windows.
struct Text {
  std::string description;
  std::unique_ptr<data::TextWindows> train, validation;  // training windows; the eval sets'
  std::unique_ptr<data::TextWindows> train_eval;
};

Text make_text(const Options& o, const Tokenizer& tokenizer, const std::string& corpus,
               int64_t block_size, int64_t vocab_size) {
  const data::TextSplit split = data::split_text(corpus);
  std::vector<int64_t> train = tokenizer.encode(split.train);
  std::vector<int64_t> validation = tokenizer.encode(split.validation);
  check_ids(train, vocab_size, "--data");
  check_ids(validation, vocab_size, "--data");
  Text t;
  t.description = detail::str(o.data, ": ", corpus.size(), " bytes, ", train.size(),
                              " training and ", validation.size(), " validation tokens");
  t.train_eval = std::make_unique<data::TextWindows>(train, block_size, o.seed + 2);
  t.train = std::make_unique<data::TextWindows>(std::move(train), block_size, o.seed);
  t.validation = std::make_unique<data::TextWindows>(std::move(validation), block_size, o.seed + 1);
  return t;
}

// The mean loss over eval_iters batches of `windows` (the same ones each time), shared over the
// ranks: rank r takes batches r, r + W, ...
double evaluate(nn::GPT& model, const data::TextWindows& windows, const Options& o,
                const dist::Job& job) {
  model.eval();
  NoGradGuard no_grad;
  AmpRegion region(o.amp);
  double sum = 0, count = 0;
  for (int64_t i = job.rank; i < o.eval_iters; i += job.world) {
    dist::heartbeat();  // Note [Job health]
    auto [x, y] = windows.batch(i, 0, o.batch_size);
    sum += model.loss(x.to(job.device), y.to(job.device)).item();
    count += 1;
  }
  model.train();
  const std::vector<double> total = dist::sum_over_ranks(job, std::vector<double>{sum, count});
  return total[1] > 0 ? total[0] / total[1] : 0.0;
}

// The job's peak FLOP/s for MFU (Note [MFU]).
double job_peak_flops(const Options& o, const dist::Job& job) {
  if (job.device.is_cuda())
    return job.world * dense_peak_flops(job.device, o.amp == "off" ? kFloat32 : kBFloat16);
  const double mine = fma_peak_gflops(get_num_threads()) * 1e9;
  return dist::sum_over_ranks(job, std::vector<double>{mine})[0];
}

std::unique_ptr<optim::LRSchedule> make_schedule(const Options& o, optim::Optimizer& opt) {
  // nanoGPT's: lr (it + 1) / (warmup + 1) during the warm-up, then the cosine to min_lr.
  auto cosine = std::make_unique<optim::CosineAnnealingLR>(
      opt, std::max<int64_t>(1, o.iters - o.warmup), o.min_lr);
  if (o.warmup == 0) return cosine;
  return std::make_unique<optim::LinearWarmup>(opt, o.warmup, 1.0 / (o.warmup + 1),
                                               std::move(cosine));
}

// Weight decay on the parameters of two or more dims (matrices, embeddings), none on biases
// and LayerNorm weights: nanoGPT's two groups.
std::vector<bool> decay_mask(const std::vector<Tensor>& params) {
  std::vector<bool> decay;
  for (const Tensor& p : params) decay.push_back(p.dim() >= 2);
  return decay;
}

// The folder's model.safetensors and config.json, which transformers' from_pretrained reads.
void export_model(const Options& o, const nn::GPT& model, const Tokenizer& tokenizer,
                  int64_t step) {
  if (o.checkpoint_dir.empty()) return;
  const fs::path dir = o.checkpoint_dir;
  fs::create_directories(dir);  // under ZeRO no last.safetensors made it
  nn::save_gpt((dir / "model.safetensors").string(), model, tokenizer.info(),
               {{"loom.step", std::to_string(step)}});
  if (model.config.bias) nn::write_hf_config((dir / "config.json").string(), model.config);
}

std::string sample(nn::GPT& model, const Tokenizer& tokenizer, const Options& o,
                   const std::string& prompt) {
  std::vector<int64_t> ids = tokenizer.encode(prompt.empty() ? "\n" : prompt);
  LOOM_CHECK(static_cast<int64_t>(ids.size()) <= model.config.block_size, ValueError,
             "--sample: the prompt is ", ids.size(), " tokens, longer than the model's block of ",
             model.config.block_size);
  check_ids(ids, model.config.vocab_size, "--sample");
  const std::vector<int64_t> out =
      model.generate(ids, o.sample_tokens, o.temperature, o.top_k, o.sample_seed);
  return tokenizer.decode(out);
}

struct IntervalMeter {
  double start = dist::steady_seconds();
  int64_t steps = 0;
  double loss = 0;
  void reset() { *this = IntervalMeter(); }
};

}  // namespace

double run(const Options& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  manual_seed(o.seed);
  // Everything that can refuse the input comes first: nothing is written before it passes.
  const std::optional<Source> source =
      o.resume.empty() ? std::nullopt : std::optional<Source>(inspect(o.resume));
  const bool sampling = !o.sample.empty();
  LOOM_CHECK(!sampling || source, ValueError, "--sample needs --resume CHECKPOINT");
  LOOM_CHECK(o.zero >= 0 && o.zero <= 3, ValueError, "--zero ", o.zero,
             ": the ZeRO stages are 0 (DDP), 1, 2 and 3");
  if (source && source->sharded) {
    LOOM_CHECK(!sampling, ValueError, "--sample: '", o.resume,
               "' is a sharded checkpoint; sample from the model.safetensors beside it");
    LOOM_CHECK(o.zero > 0, ValueError, "--resume '", o.resume,
               "' is a sharded checkpoint of a --zero run: resume it with --zero 1, 2 or 3 (on "
               "any number of ranks)");
  } else if (source && source->training_checkpoint && !sampling) {
    LOOM_CHECK(o.zero == 0, ValueError, "--zero ", o.zero, ": '", o.resume,
               "' holds the whole optimizer state of a DDP run; resume it without --zero (a "
               "--zero run resumes from its last.sharded folder)");
  }
  const std::string corpus = sampling ? std::string() : data::read_corpus(o.data);
  const Tokenizer tokenizer = make_tokenizer(o, source, corpus);
  const nn::GPTConfig config = model_config(o, source, tokenizer.vocab_size());
  std::optional<Text> text;
  if (!sampling)
    text.emplace(make_text(o, tokenizer, corpus, config.block_size, config.vocab_size));

  const dist::Job job = dist::join_job({.gpus = o.gpus, .backend = o.backend});
  dist::apply_max_memory(o.train, job.device);  // --max-memory
  dist::Reporter out(job, /*progress_bar=*/false);
  auto model = std::make_shared<nn::GPT>(config);
  model->to(job.device);
  model->set_gradient_checkpointing(o.checkpoint_activations);
  const std::vector<Tensor> params = model->parameters();
  LOOM_CHECK(o.zero == 0 || job.parallel(), ValueError, "--zero ", o.zero,
             " shards across ranks: give --nproc N or --gpus N with N > 1");
  const bool horovod = o.strategy == "horovod", dp = o.strategy == "dp";
  LOOM_CHECK(!horovod || job.parallel(), ValueError,
             "--strategy horovod averages across ranks: give --nproc N or --gpus N with N > 1");
  // SGD's weight decay (L2) applies to every parameter; Adam's and AdamW's to the matrices
  // (under ZeRO to the pieces of the matrices: Note [ZeRO stages]).
  const bool sgd = o.train.optimizer == "sgd";
  auto over_pieces = [&](std::vector<Tensor> pieces, const std::vector<size_t>& owner) {
    std::vector<bool> decay;
    for (size_t i : owner) decay.push_back(params[i].dim() >= 2);
    return dist::make_optimizer(o.train, std::move(pieces), o.train.lr,
                                sgd ? std::vector<bool>() : decay);
  };
  std::shared_ptr<dist::DistributedDataParallel> ddp;
  std::shared_ptr<dist::FullyShardedDataParallel> fsdp;
  dist::ZeroRedundancyOptimizer* zero = nullptr;
  std::unique_ptr<optim::Optimizer> optimizer;
  if (o.zero == 1 || o.zero == 2) {
    // Under --amp bf16 the model itself is 16-bit, with float32 masters of this rank's pieces
    // (Note [ZeRO with a 16-bit model]).
    if (o.amp == "bf16") model->to(kBFloat16);
    ddp = std::make_shared<dist::DistributedDataParallel>(model, job.group);
    auto z = std::make_unique<dist::ZeroRedundancyOptimizer>(*ddp, over_pieces,
                                                             dist::ZeroOptions{.stage = o.zero});
    zero = z.get();
    optimizer = std::move(z);
  } else if (o.zero == 3) {
    // Under --amp, FSDP's mixed precision (Note [FSDP mixed precision]).
    dist::FSDPOptions fsdp_options;
    if (o.amp != "off") fsdp_options.param_dtype = o.amp == "bf16" ? kBFloat16 : kFloat16;
    fsdp = std::make_shared<dist::FullyShardedDataParallel>(model, job.group, fsdp_options);
    std::vector<size_t> owner;
    for (const dist::ShardPiece& piece : fsdp->pieces()) owner.push_back(piece.param);
    optimizer = over_pieces(fsdp->optimizer_params(), owner);
  } else {
    optimizer = dist::make_optimizer(o.train, params, o.train.lr,
                                     sgd ? std::vector<bool>() : decay_mask(params));
    if (horovod) {  // rank 0's weights; the gradients averaged in step()
      dist::broadcast_parameters(*job.group, model->state_dict());
      optimizer = std::make_unique<dist::DistributedOptimizer>(std::move(optimizer), job.group);
    }
  }
  const auto schedule = make_schedule(o, *optimizer);
  optim::GradScaler scaler({.enabled = o.amp == "fp16"});
  optim::GradScaler* saved_scaler = scaler.is_enabled() ? &scaler : nullptr;
  optim::Metadata info = nn::gpt_metadata(config, tokenizer.info());
  optim::CheckpointManager checkpoints(
      {.dir = o.checkpoint_dir, .writer = job.leader(), .world_size = job.world}, *model,
      *optimizer, schedule.get(), saved_scaler, info);

  optim::TrainingProgress progress;
  if (source && source->sharded) {
    const dist::ShardedState state =
        zero ? dist::sharded_state(*zero) : dist::sharded_state(*fsdp, *optimizer);
    progress = dist::load_sharded_training_checkpoint(o.resume, state, schedule.get(),
                                                      /*restore_generator=*/true, saved_scaler);
  } else if (source && source->training_checkpoint) {
    progress = checkpoints
                   .resume(o.resume, *model, optimizer.get(), schedule.get(), saved_scaler,
                           /*model_only=*/sampling || o.eval_only)
                   .progress;
  } else if (source) {
    const nn::GPTCheckpoint loaded = nn::load_gpt(o.resume, *source->config);
    NoGradGuard no_grad;
    const NamedTensors from = loaded.model->named_parameters();
    const NamedTensors to = model->named_parameters();
    for (size_t i = 0; i < to.size(); ++i) kernels::copy_(to[i].second, from[i].second);
  }
  if (horovod) dist::broadcast_optimizer_state(*job.group, *optimizer);
  if (sampling) {
    if (job.leader()) out.say("%s\n", sample(*model, tokenizer, o, o.sample).c_str());
    return 0;
  }

  const int64_t tokens_per_step = o.batch_size * config.block_size * o.train.accumulate * job.world;
  const double peak = job_peak_flops(o, job);
  const double flops_per_token = nn::gpt_flops_per_token(config, config.block_size);
  out.say(
      "gpt_train: GPT %lld layers, %lld heads, %lld embd, block %lld, vocabulary %lld (%lld "
      "parameters); %s\n",
      static_cast<long long>(config.n_layer), static_cast<long long>(config.n_head),
      static_cast<long long>(config.n_embd), static_cast<long long>(config.block_size),
      static_cast<long long>(config.vocab_size), static_cast<long long>(model->num_parameters()),
      tokenizer.describe().c_str());
  out.say("%s\n", text->description.c_str());
  out.open_log(o.log_json, /*append=*/source.has_value());
  out.open_tensorboard(o.tensorboard);

  if (o.eval_only) {
    const double val = evaluate(*model, *text->validation, o, job);
    const double train = evaluate(*model, *text->train_eval, o, job);
    out.say("step %lld: train loss %.4f, val loss %.4f\n", static_cast<long long>(progress.step),
            train, val);
    out.log(
        dist::LogRecord().add("step", progress.step).add("train_loss", train).add("val_loss", val));
    return val;
  }

  if (job.parallel()) {
    if (!ddp && !fsdp && !horovod) {
      ddp = std::make_shared<dist::DistributedDataParallel>(model, job.group);
      if (o.powersgd > 0)
        ddp->register_comm_hook(dist::powersgd_hook(
            {.matrix_approximation_rank = o.powersgd, .start_powersgd_iter = o.powersgd_start}));
    }
    if (scaler.is_enabled())
      scaler.set_found_inf_agreement(dist::found_inf_agreement(job.group, job.device));
  }
  // --strategy dp: replicas of the model on threads, each on a chunk of the batch.
  const auto data_parallel =
      dp ? std::make_shared<dist::DataParallel>(
               model, dist::data_parallel_devices(job.device, o.dp_devices),
               [&] {
                 auto replica = std::make_shared<nn::GPT>(config);
                 replica->to(job.device);
                 replica->set_gradient_checkpointing(o.checkpoint_activations);
                 return replica;
               })
         : nullptr;
  nn::Module& net = fsdp            ? static_cast<nn::Module&>(*fsdp)
                    : ddp           ? static_cast<nn::Module&>(*ddp)
                    : data_parallel ? static_cast<nn::Module&>(*data_parallel)
                                    : *model;
  if (data_parallel)
    out.say("DataParallel: %d replicas on threads of this process (Note [DataParallel])\n",
            o.dp_devices);
  if (horovod)
    out.say(
        "Horovod-style: gradients averaged in step() after backward (Note [Horovod-style "
        "averaging])\n");
  if (zero) out.say("%s", dist::first_line(zero->plan()).c_str());
  if (fsdp) out.say("%s", dist::first_line(fsdp->plan()).c_str());
  out.say(
      "batch %lld x %lld tokens, %lld micro-batches a step, world %d: %lld tokens per step; "
      "%s; warm-up %lld, cosine to %g at %lld; %d threads%s%s%s\n",
      static_cast<long long>(o.batch_size), static_cast<long long>(config.block_size),
      static_cast<long long>(o.train.accumulate), job.world,
      static_cast<long long>(tokens_per_step),
      dist::describe_optimizer(o.train, o.train.lr).c_str(), static_cast<long long>(o.warmup),
      o.min_lr, static_cast<long long>(o.iters), get_num_threads(),
      o.amp == "off" ? "" : ", mixed precision ", o.amp == "off" ? "" : o.amp.c_str(),
      o.checkpoint_activations ? ", activations recomputed per block" : "");
  out.say("peak %.0f GFLOP/s (%s), %.2f GFLOP per token\n", peak / 1e9,
          job.device.is_cuda() ? "the GPUs' dense peak" : "FMA peak measured on these cores",
          flops_per_token / 1e9);

  net.train();
  dist::CollectiveCounters moved;  // by the training steps (Note [Bytes moved])
  int64_t steps_taken = 0;
  double dp_bytes = 0;  // --strategy dp: through device 0 (Note [DataParallel])
  // Per step so far: the collectives' bus bytes of this rank, or what went through device 0.
  auto bytes_per_step = [&] {
    double bus = dp_bytes;
    for (const auto& [op, stats] : moved) bus += static_cast<double>(stats.bus_bytes);
    return steps_taken > 0 ? bus / static_cast<double>(steps_taken) : 0.0;
  };
  IntervalMeter interval;
  double val_loss = 0;
  auto report = [&](bool last) {
    const double seconds = dist::steady_seconds() - interval.start;
    const double ms = interval.steps ? 1e3 * seconds / interval.steps : 0.0;
    const double tokens_per_s = interval.steps ? tokens_per_step * interval.steps / seconds : 0.0;
    const double mfu = peak > 0 ? tokens_per_s * flops_per_token / peak : 0.0;
    const bool eval = last || progress.step % o.eval_every == 0;
    double train_loss = interval.steps ? interval.loss / interval.steps : 0.0;
    dist::LogRecord record;
    record.add("step", progress.step).add("lr", optimizer->lr());
    // FSDP: every unit gathered while the whole model evaluates and is exported.
    const auto gathered = eval && fsdp ? fsdp->summon_full_params() : nullptr;
    if (eval) {
      val_loss = evaluate(*model, *text->validation, o, job);
      train_loss = evaluate(*model, *text->train_eval, o, job);
      out.say(
          "step %lld: train loss %.4f, val loss %.4f, %.1f ms/iter, %.0f tokens/s, MFU "
          "%.1f%%\n",
          static_cast<long long>(progress.step), train_loss, val_loss, ms, tokens_per_s, 100 * mfu);
      record.add("val_loss", val_loss);
      out.scalar("val/loss", val_loss, progress.step);
    } else {
      out.say("step %lld: loss %.4f, %.1f ms/iter, %.0f tokens/s, MFU %.1f%%\n",
              static_cast<long long>(progress.step), train_loss, ms, tokens_per_s, 100 * mfu);
    }
    record.add("train_loss", train_loss).add("ms_per_iter", ms).add("tokens_per_s", tokens_per_s);
    record.add("mfu", mfu).add("world_size", job.world).add("strategy", o.strategy);
    record.add("bytes_per_step", bytes_per_step())
        .add("peak_memory_bytes", memory_stats(job.device).peak_bytes);
    out.log(record);
    out.scalar("train/loss", train_loss, progress.step);
    out.scalar("train/tokens_per_s", tokens_per_s, progress.step);
    out.scalar("train/mfu", mfu, progress.step);
    out.scalar("train/lr", optimizer->lr(), progress.step);
    out.flush();
    if (eval) {
      // Under ZeRO each rank writes its shard (Note [Sharded checkpoints]).
      if (o.zero == 0)
        checkpoints.save_last(progress);
      else if (!o.checkpoint_dir.empty())
        dist::save_sharded_training_checkpoint(
            (fs::path(o.checkpoint_dir) / "last.sharded").string(),
            zero ? dist::sharded_state(*zero) : dist::sharded_state(*fsdp, *optimizer),
            schedule.get(), progress, info, saved_scaler);
      if (job.leader()) export_model(o, *model, tokenizer, progress.step);
    }
    interval.reset();
  };

  dist::StepMemoryReport memory(o.print_memory);
  const dist::DataParallelism parallel{.ddp = ddp.get(), .zero = zero, .fsdp = fsdp.get()};
  const dist::TrainingMemoryExplainer explain_out_of_memory(*model, *optimizer, parallel);
  dist::StepTimeline timeline(job.rank, /*record=*/!o.trace.empty());
  while (progress.step < o.iters && (o.train.max_steps < 0 || progress.step < o.train.max_steps)) {
    timeline.restart();
    if (job.parallel()) job.group->reset_counters();
    memory.before_step(job.device);
    optimizer->zero_grad();
    checkpoints.changed();
    Tensor loss;
    const int64_t micro = o.train.accumulate;
    for (int64_t i = 0; i < micro; ++i) {
      auto [x, y] =
          text->train->batch(progress.step * micro + i, job.rank * o.batch_size, o.batch_size);
      dist::heartbeat();
      timeline.mark("data", "data");
      const auto local = ddp && i + 1 < micro ? ddp->no_sync() : nullptr;
      {
        AmpRegion region(o.amp);
        // Through `net`: DDP's forward is what arms its reducer for the backward that follows.
        const Tensor logits = net.forward(x.to(job.device));
        loss =
            cross_entropy(logits.reshape({-1, config.vocab_size}), y.to(job.device).reshape({-1}));
      }
      timeline.mark("forward");
      scaler.scale(micro > 1 ? loss / static_cast<double>(micro) : loss).backward();
      timeline.mark("backward");
      if (data_parallel)
        dp_bytes += static_cast<double>(data_parallel->last_report().through_device0());
      interval.loss += loss.item() / static_cast<double>(micro);
    }
    // Horovod-style: averaged now, so that unscaling and clipping see the averages (the
    // step then does not average again: DistributedOptimizer::synchronize).
    if (horovod) {
      static_cast<dist::DistributedOptimizer&>(*optimizer).synchronize();
      timeline.mark("allreduce");
    }
    if (o.train.grad_clip > 0) {
      scaler.unscale_(*optimizer);
      if (zero)
        zero->clip_grad_norm_(o.train.grad_clip);
      else if (fsdp)
        fsdp->clip_grad_norm_(o.train.grad_clip);
      else
        optim::clip_grad_norm_(params, o.train.grad_clip);
    }
    const bool stepped = scaler.step(*optimizer);
    scaler.update();
    timeline.mark("optimizer");
    if (fsdp)
      timeline.end_step(fsdp->timeline());
    else
      timeline.end_step(ddp ? &ddp->reducer() : nullptr);
    if (auto report = memory.after_step(stepped, *model, *optimizer, parallel, job.device))
      out.say("%s", report->c_str());
    schedule->step();
    if (job.parallel()) dist::accumulate(moved, job.group->counters());
    ++steps_taken;
    ++progress.step;
    ++interval.steps;
    if (progress.step % o.log_every == 0 || progress.step % o.eval_every == 0 ||
        progress.step == o.iters)
      report(progress.step == o.iters);
  }
  if (interval.steps > 0) report(true);
  if (job.parallel() && steps_taken > 0) {
    int64_t bus = 0;
    for (const auto& [op, stats] : moved) bus += stats.bus_bytes;
    out.say(
        "collectives of rank %d over %lld training steps (%s; bus bytes: Note [Bytes moved]), "
        "%.3f MiB a step:\n%s",
        job.rank, static_cast<long long>(steps_taken),
        loom_apps::strategy_label(o.strategy, o.zero).c_str(),
        bus / 1048576.0 / static_cast<double>(steps_taken), dist::format_counters(moved).c_str());
  }
  if (data_parallel && steps_taken > 0) {
    out.say("%s", data_parallel->last_report().describe().c_str());
  }
  dist::report_communication(out, timeline, job, o.zero > 0 ? "reduce-scatter" : "allreduce",
                             o.trace);
  const auto gathered = fsdp ? fsdp->summon_full_params() : nullptr;
  if (o.sample_after && job.leader()) {
    out.say("sample (temperature %g, top-k %lld):\n%s\n", o.temperature,
            static_cast<long long>(o.top_k), sample(*model, tokenizer, o, "").c_str());
  }
  return val_loss;
}

}  // namespace gpt_train

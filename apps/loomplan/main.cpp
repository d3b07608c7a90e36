// apps/loomplan — the memory planner: for a model, a global batch, a world size, a precision, an
// optimizer and a device's memory, the bytes a rank needs under DDP and each ZeRO stage (with
// and without activation checkpointing), and the strategy the seeds' decision tree picks
// (Note [The memory planner], Note [Choosing a strategy] in dist/memory_plan.h).
//
//   loomplan --model resnet18 --width 16 --channels 1 --batch 512 --world 4 --memory 2GiB
//   loomplan --model gpt --layers 12 --heads 12 --embd 768 --block 1024 --vocab 50257
//       --batch 32 --world 8 --precision bf16 --optimizer adamw --memory 16GiB
//   loomplan --checkpoint runs/gpt/last.safetensors --batch 96 --world 2 --memory 1GiB
//   loomrun --nproc-per-node 4 --plan --model gpt ...   (the world from loomrun's flags)
//
// The activations come from a dry run of the real model on this machine's CPU (a few seconds
// for small models; a large GPT needs its weights and gradients in host memory).
// Exit status: 0 a plan was printed (whether or not anything fits), 2 bad input, 1 a failure
// of the dry run itself.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "dist/memory_plan.h"
#include "tensor/error.h"
#include "tensor/parallel.h"

namespace {

constexpr int kUsageError = 2;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Plan a data-parallel run's memory: per rank, the weights, gradients, optimizer state,\n"
      "activations (from a dry run of one step on this CPU, scaled to the per-rank batch) and\n"
      "each strategy's own buffers, for DDP and ZeRO stages 1-3 with and without activation\n"
      "checkpointing; then the strategy to use (Note [Choosing a strategy])."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string model_name, checkpoint, precision = "fp32", optimizer, memory;
  loom::dist::PlanRequest request;
  loom::nn::ResNetOptions& resnet = request.model.resnet;
  resnet.width = 64;
  loom::nn::GPTConfig& gpt = request.model.gpt;
  gpt = {.vocab_size = 256, .block_size = 64, .n_embd = 128, .n_layer = 4, .n_head = 4};
  double momentum = 0.9;
  int threads = 0;
  std::vector<int64_t> probes;

  app.add_option("--model", model_name, "resnet18 or gpt (or give --checkpoint)")
      ->check(CLI::IsMember({"resnet18", "gpt"}));
  app.add_option("--checkpoint", checkpoint,
                 "read the model from a checkpoint: a GPT file (gpt_train's, or a Hugging Face "
                 "model.safetensors with config.json beside it) or a resnet18_cifar checkpoint");
  const std::vector<CLI::Option*> model_flags = {
      app.add_option("--width", resnet.width, "resnet18: channels of the first stage")
          ->check(CLI::PositiveNumber),
      app.add_option("--channels", resnet.in_channels,
                     "resnet18: input channels (1: Fashion-MNIST)")
          ->check(CLI::PositiveNumber),
      app.add_option("--classes", resnet.num_classes, "resnet18: classes")
          ->check(CLI::PositiveNumber),
      app.add_option("--image", request.model.image_size, "resnet18: image side in pixels")
          ->check(CLI::PositiveNumber),
      app.add_option("--layers", gpt.n_layer, "gpt: transformer blocks")
          ->check(CLI::PositiveNumber),
      app.add_option("--heads", gpt.n_head, "gpt: attention heads")->check(CLI::PositiveNumber),
      app.add_option("--embd", gpt.n_embd, "gpt: embedding width")->check(CLI::PositiveNumber),
      app.add_option("--block", gpt.block_size, "gpt: context length in tokens (each sample)")
          ->check(CLI::PositiveNumber),
      app.add_option("--vocab", gpt.vocab_size, "gpt: vocabulary size")->check(CLI::PositiveNumber),
      app.add_option("--dropout", gpt.dropout, "gpt: dropout")->check(CLI::Range(0.0, 0.999)),
      app.add_option("--bias", gpt.bias, "gpt: biases in the linear layers and norms")};
  app.add_option("--batch", request.global_batch,
                 "global batch: samples (images, or windows of --block tokens) a step over all "
                 "ranks")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--world,--nproc", request.world, "ranks (data-parallel processes or GPUs)")
      ->check(CLI::PositiveNumber);
  app.add_option("--precision", precision,
                 "fp32, or bf16 / fp16 autocast, each stage laid out as the apps lay it out (Note "
                 "[The planner's dry runs])")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--optimizer", optimizer,
                 "sgd, adam or adamw (default: sgd for resnet18, adamw for gpt, as the apps)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--momentum", momentum, "SGD's momentum (0: none, no state)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--memory", memory, "a rank's device memory: 2GiB, 512MiB, 80GB, ...")->required();
  app.add_option("--probe-batches", probes, "the dry run's two batches (default 2 4)")->expected(2);
  app.add_option("--threads", threads, "compute threads of the dry run (0: every core)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : kUsageError;
  }

  try {
    if (checkpoint.empty()) {
      LOOM_CHECK(!model_name.empty(), ValueError,
                 "give --model resnet18|gpt with its sizes, or --checkpoint PATH");
      request.model.kind = model_name == "gpt" ? loom::dist::PlanModel::Kind::kGPT
                                               : loom::dist::PlanModel::Kind::kResNet18;
    } else {
      LOOM_CHECK(model_name.empty(), ValueError, "give either --model or --checkpoint, not both");
      for (const CLI::Option* flag : model_flags)
        LOOM_CHECK(flag->count() == 0 || flag->get_name() == "--image", ValueError,
                   flag->get_name(), ": the checkpoint says the model's sizes; leave it out");
      const int64_t image = request.model.image_size;
      request.model = loom::dist::plan_model_from_checkpoint(checkpoint);
      request.model.image_size = image;
    }
    const bool is_gpt = request.model.kind == loom::dist::PlanModel::Kind::kGPT;
    request.precision = loom::dist::parse_precision(precision);
    request.optimizer = optimizer.empty() ? (is_gpt ? "adamw" : "sgd") : optimizer;
    request.momentum = momentum > 0;
    request.device_memory = loom::dist::parse_byte_size(memory);
    if (!probes.empty()) request.probe_batches = {probes[0], probes[1]};
    if (threads > 0) loom::set_num_threads(threads);
    const loom::dist::MemoryPlan plan = loom::dist::plan_memory(request);
    std::fputs(loom::dist::format_plan(plan).c_str(), stdout);
    return 0;
  } catch (const loom::InternalError& e) {  // a bug in loom, not the input
    std::fprintf(stderr, "loomplan: %s\n", e.what());
    return 1;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loomplan: %s\n", e.what());
    return kUsageError;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "loomplan: the dry run needs more host memory than there is (the model's "
                 "weights and gradients, and the activations at the probe batches)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loomplan: %s\n", e.what());
    return 1;
  }
}

// bench/train_step_bench.cpp — one training step of ResNet-18 (CIFAR stem, full width by
// default) at batch 64 on 2 threads, float32: zero_grad, forward, cross-entropy, backward and an
// SGD step (nesterov momentum 0.9, weight decay 5e-4), in images per second, beside PyTorch's
// same step measured in the same run by bench/train_step_torch.py. The two alternate step by
// step (the machine is shared: load falls on both alike); medians of the repetitions. The ratio
// is loom images/s over PyTorch images/s: above 1, loom is faster. With --device cuda both run
// on cuda:0, each step timed to the end of its GPU work (a device synchronisation).
// With --amp bf16|fp16 a second model of the same weights takes the same step in an autocast
// region (fp16 with a GradScaler), alternating with the float32 one, and the table adds the
// ratio of the two (above 1, mixed precision is faster), for loom and for PyTorch alike.
// With --channels-last both take the batch channels-last and store their models so (PyTorch's
// model.to(memory_format=torch.channels_last), its usual recipe, and loom's
// Module::to(MemoryFormat::kChannelsLast)), so that on a GPU both run NHWC convolutions.
// On a GPU loom also takes each step a second time with cuDNN's first-ranked algorithms whether
// deterministic or not (set_cudnn_deterministic(false), PyTorch's default; loom's default
// keeps to deterministic ones): the row "loom, any cuDNN algorithm".
// loom's ResNet applies each ReLU and residual add inside the batch norm before it (Note [Batch
// norm with ReLU]); --no-fusion runs them one by one, as torchvision and PyTorch eager do. On a
// GPU (on a CPU with --unfused-row) a second model of the same weights that runs them one by
// one takes each step too: the row "loom, ops one by one".
//
// --conv-algorithm picks loom's CPU convolutions (auto, benchmark, packed, im2col, winograd2,
// winograd4, direct: Conv2dAlgorithm); "benchmark" measures each layer's candidates in the warm-up
// step.
//
//   train_step_bench [--threads N (2)] [--batch B (64)] [--width W (64)] [--repeats R (7)]
//                    [--device cpu|cuda] [--amp off|bf16|fp16] [--channels-last] [--no-fusion]
//                    [--unfused-row] [--conv-algorithm A (auto)] [--no-torch] [--python PATH]
//                    [--script PATH]

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loom.h"
#include "machine.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "stats.h"
#include "tensor/accelerator.h"
#include "tensor/conv.h"
#include "torch_peer.h"

namespace {

using loom::bench::median;

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeats = 7;
  int64_t batch = 64, width = 64;
  bool with_torch = true, channels_last = false, fuse = true, unfused_row = false;
  std::string device_name = "cpu", amp = "off", conv_algorithm = "auto";
  std::string python = LOOM_TORCH_PYTHON;
  std::string script =
      (std::filesystem::path(__FILE__).parent_path() / "train_step_torch.py").string();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (arg == "--threads")
      threads = std::stoi(next());
    else if (arg == "--batch")
      batch = std::stoll(next());
    else if (arg == "--width")
      width = std::stoll(next());
    else if (arg == "--repeats")
      repeats = std::stoi(next());
    else if (arg == "--device")
      device_name = next();
    else if (arg == "--amp")
      amp = next();
    else if (arg == "--channels-last")
      channels_last = true;
    else if (arg == "--no-fusion")
      fuse = false;
    else if (arg == "--unfused-row")
      unfused_row = true;
    else if (arg == "--conv-algorithm")
      conv_algorithm = next();
    else if (arg == "--no-torch")
      with_torch = false;
    else if (arg == "--python")
      python = next();
    else if (arg == "--script")
      script = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--batch B] [--width W] [--repeats R] "
                   "[--device cpu|cuda] [--amp off|bf16|fp16] [--channels-last] [--no-fusion] "
                   "[--unfused-row] [--conv-algorithm A] [--no-torch] [--python PATH] "
                   "[--script PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  if (device_name != "cpu" && device_name != "cuda") {
    std::fprintf(stderr, "--device: cpu or cuda, not %s\n", device_name.c_str());
    return 2;
  }
  if (amp != "off" && amp != "bf16" && amp != "fp16") {
    std::fprintf(stderr, "--amp: off, bf16 or fp16, not %s\n", amp.c_str());
    return 2;
  }
  try {
    loom::kernels::set_conv2d_algorithm(loom::kernels::parse_conv2d_algorithm(conv_algorithm));
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "--conv-algorithm: %s\n", e.what());
    return 2;
  }
  const bool mixed = amp != "off";
  const loom::DType amp_dtype = amp == "fp16" ? loom::kFloat16 : loom::kBFloat16;
  const bool on_gpu = device_name == "cuda";
  if (on_gpu && loom::cuda_device_count() == 0) {
    std::fprintf(stderr, "--device cuda: no CUDA device visible%s\n",
                 loom::cuda_is_built() ? "" : " (loom was built without CUDA)");
    return 2;
  }
  const loom::Device device = on_gpu ? loom::Device{loom::DeviceType::CUDA, 0} : loom::kCPU;
  loom::set_num_threads(threads);
  loom::manual_seed(0);
  std::signal(SIGPIPE, SIG_IGN);

  loom::bench::TorchPeer torch;
  std::vector<std::string> peer_args = {"--threads", std::to_string(threads),
                                        "--batch",   std::to_string(batch),
                                        "--width",   std::to_string(width),
                                        "--device",  device_name,
                                        "--amp",     amp};
  if (channels_last) peer_args.push_back("--channels-last");
  const bool have_torch = with_torch && !python.empty() && torch.start(python, script, peer_args);
  if (with_torch && !have_torch)
    std::printf("PyTorch not measured: %s\n", torch.header().is_object()
                                                  ? torch.header().value("error", "?").c_str()
                                                  : "no Python with torch (pass --python)");

  // One model per precision, with the same initial weights.
  struct Trainer {
    std::shared_ptr<loom::nn::ResNet> model;
    std::unique_ptr<loom::optim::SGD> opt;
    loom::optim::GradScaler scaler;
  };
  auto make_trainer = [&](bool scaled, bool fused) {
    loom::manual_seed(0);
    Trainer t{loom::nn::resnet18(
                  {.width = width, .in_channels = 3, .num_classes = 10, .fuse_bn_relu = fused}),
              nullptr, loom::optim::GradScaler({.enabled = scaled})};
    t.model->to(device);
    if (channels_last) t.model->to(loom::MemoryFormat::kChannelsLast);
    t.model->train();
    t.opt = std::make_unique<loom::optim::SGD>(
        t.model->parameters(),
        loom::optim::SGDOptions{
            .lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
    return t;
  };
  Trainer fp32 = make_trainer(false, fuse);
  std::optional<Trainer> low;
  if (mixed) low.emplace(make_trainer(amp == "fp16", fuse));
  const bool with_unfused = (on_gpu || unfused_row) && fuse;
  std::optional<Trainer> fp32_ops, low_ops;  // the ops one by one
  if (with_unfused) fp32_ops.emplace(make_trainer(false, false));
  if (with_unfused && mixed) low_ops.emplace(make_trainer(amp == "fp16", false));
  const loom::Tensor x = loom::randn({batch, 3, 32, 32})
                             .to(device)
                             .contiguous(channels_last ? loom::MemoryFormat::kChannelsLast
                                                       : loom::MemoryFormat::kContiguous);
  const loom::Tensor y = loom::randint(0, 10, {batch}).to(device);
  auto loom_step = [&](Trainer& t, bool autocast) {
    const auto start = Clock::now();
    t.opt->zero_grad();
    loom::Tensor loss;
    {
      loom::autocast::Guard region(amp_dtype, autocast);
      loss = loom::cross_entropy(t.model->forward(x), y);
    }
    t.scaler.scale(loss).backward();
    t.scaler.step(*t.opt);
    t.scaler.update();
    if (on_gpu) loom::synchronize(loom::Device(loom::DeviceType::CUDA, 0));
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  // The same step with cuDNN's ranking as it is (non-deterministic algorithms allowed).
  auto loom_any_step = [&](Trainer& t, bool autocast) {
    loom::set_cudnn_deterministic(false);
    const double ms = loom_step(t, autocast);
    loom::set_cudnn_deterministic(true);
    return ms;
  };
  auto torch_step = [&](bool autocast) {
    return torch.request(autocast ? "step amp" : "step").value("ms", 0.0);
  };

  // Warm-up: caches, scratch memory, PyTorch's first calls, cuDNN's algorithm searches.
  for (int i = 0; i < (on_gpu ? 5 : 2); ++i) {
    loom_step(fp32, false);
    if (mixed) loom_step(*low, true);
    if (on_gpu) loom_any_step(fp32, false);
    if (on_gpu && mixed) loom_any_step(*low, true);
    if (fp32_ops) loom_step(*fp32_ops, false);
    if (low_ops) loom_step(*low_ops, true);
    if (have_torch) torch_step(false);
    if (have_torch && mixed) torch_step(true);
  }
  std::vector<double> loom_ms, loom_amp_ms, any_ms, any_amp_ms, ops_ms, ops_amp_ms, torch_ms,
      torch_amp_ms;
  for (int r = 0; r < repeats; ++r) {
    loom_ms.push_back(loom_step(fp32, false));
    if (mixed) loom_amp_ms.push_back(loom_step(*low, true));
    if (on_gpu) any_ms.push_back(loom_any_step(fp32, false));
    if (on_gpu && mixed) any_amp_ms.push_back(loom_any_step(*low, true));
    if (fp32_ops) ops_ms.push_back(loom_step(*fp32_ops, false));
    if (low_ops) ops_amp_ms.push_back(loom_step(*low_ops, true));
    if (have_torch) torch_ms.push_back(torch_step(false));
    if (have_torch && mixed) torch_amp_ms.push_back(torch_step(true));
  }

  const double loom_ips = batch / (median(loom_ms) / 1e3);
  loom::bench::print_machine();
  std::printf(
      "ResNet-18 (CIFAR stem, width %lld) training step, batch %lld, %s, float32%s%s%s; median "
      "of %d\n",
      static_cast<long long>(width), static_cast<long long>(batch),
      on_gpu ? "cuda:0" : (std::to_string(threads) + " threads").c_str(),
      channels_last ? ", channels-last" : "", fuse ? "" : ", loom unfused (--no-fusion)",
      on_gpu ? "" : (", loom's convolutions: " + conv_algorithm).c_str(), repeats);
  std::printf("| | step ms | images/s |\n|---|---|---|\n");
  std::printf("| loom | %.0f | %.1f |\n", median(loom_ms), loom_ips);
  if (on_gpu)
    std::printf("| loom, any cuDNN algorithm | %.0f | %.1f |\n", median(any_ms),
                batch / (median(any_ms) / 1e3));
  if (fp32_ops)
    std::printf("| loom, ops one by one | %.0f | %.1f |\n", median(ops_ms),
                batch / (median(ops_ms) / 1e3));
  if (have_torch) {
    const double torch_ips = batch / (median(torch_ms) / 1e3);
    std::printf("| PyTorch %s | %.0f | %.1f |\n", torch.header().value("torch", "?").c_str(),
                median(torch_ms), torch_ips);
    std::printf("loom / PyTorch images/s: %.2f\n", loom_ips / torch_ips);
  }
  if (mixed) {
    // A peer that cannot run this precision answers ms 0 (PyTorch 1.13 has no fp16 on CPUs).
    const bool torch_amp = have_torch && median(torch_amp_ms) > 0;
    std::printf("\nthe same step with --amp %s (median of %d, alternating with float32)\n",
                amp.c_str(), repeats);
    std::printf("| | float32 ms | %s ms | %s / float32 images/s |\n|---|---|---|---|\n",
                amp.c_str(), amp.c_str());
    std::printf("| loom | %.1f | %.1f | %.2f |\n", median(loom_ms), median(loom_amp_ms),
                median(loom_ms) / median(loom_amp_ms));
    if (on_gpu)
      std::printf("| loom, any cuDNN algorithm | %.1f | %.1f | %.2f |\n", median(any_ms),
                  median(any_amp_ms), median(any_ms) / median(any_amp_ms));
    if (low_ops)
      std::printf("| loom, ops one by one | %.1f | %.1f | %.2f |\n", median(ops_ms),
                  median(ops_amp_ms), median(ops_ms) / median(ops_amp_ms));
    if (torch_amp)
      std::printf("| PyTorch | %.1f | %.1f | %.2f |\n", median(torch_ms), median(torch_amp_ms),
                  median(torch_ms) / median(torch_amp_ms));
    else if (have_torch)
      std::printf("PyTorch %s: %s\n", amp.c_str(),
                  torch.request("step amp").value("error", "not measured").c_str());
  }
  return 0;
}

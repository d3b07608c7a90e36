// bench/gpt_step_bench.cpp — one GPT training step on 2 threads, float32: zero_grad, forward,
// cross-entropy over the vocabulary, backward, gradient clipping at 1.0 and AdamW (weight decay
// 0.1 on matrices and embeddings only, nanoGPT's groups), in tokens per second, beside PyTorch
// 2.x's same step measured in the same run by bench/gpt_step_torch.py (bench/torch_gpt.py's
// model: GPT-2's architecture with F.scaled_dot_product_attention, the head tied). The two
// alternate step by step (the machine is shared: load falls on both alike); medians of the
// repetitions. The ratio is loom tokens/s over PyTorch tokens/s: above 1, loom is faster. MFU
// is the model's FLOPs per second (nn::gpt_flops_per_token) over this machine's float32 FMA peak,
// measured by the same binary between the steps.
//
//   gpt_step_bench                      # the fortunes-char recipe's model and GPT-2 small
//   gpt_step_bench --model recipe|gpt2 [--threads N (2)] [--repeats R (15; 5 for gpt2)]
//                  [--batch B] [--block T] [--device cpu|cuda] [--no-torch] [--fused-adamw]
//                  [--python PATH]
// With --device cuda both run on cuda:0, each step timed to the end of its GPU work, and MFU is
// over the GPU's dense float32 peak (dense_peak_flops).
//
// PyTorch comes from the virtual environment bench/torch_venv.sh makes (PyTorch 2.x from PyPI;
// Debian's 1.13 multiplies matrices with a reference BLAS here and is no peer for speed).
// --fused-adamw gives PyTorch its fused AdamW (torch.optim.AdamW(fused=True)) instead of the
// default foreach one.

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "dist/train_options.h"
#include "loom.h"
#include "machine.h"
#include "nn/gpt.h"
#include "optim/clip.h"
#include "stats.h"
#include "tensor/accelerator.h"
#include "tensor/cpu_info.h"
#include "torch_peer.h"

namespace {

using loom::bench::median;
using Clock = std::chrono::steady_clock;

struct Workload {
  std::string name;
  loom::nn::GPTConfig config;
  int64_t batch;
  int repeats;
};

std::string repo_file(const char* relative) {
  return (std::filesystem::path(LOOM_SOURCE_DIR) / relative).string();
}

// The venv's python, as bench/torch_venv.sh --python prints it; "" when there is none.
std::string venv_python() {
  const std::string path = repo_file(".bench-venv/bin/python");
  return std::filesystem::exists(path) ? path : "";
}

void run(const Workload& w, int threads, bool with_torch, bool fused_adamw,
         const std::string& python, double peak, loom::Device device) {
  const loom::nn::GPTConfig& c = w.config;
  loom::manual_seed(0);
  auto model = std::make_shared<loom::nn::GPT>(c);
  model->to(device);
  model->train();
  std::vector<loom::Tensor> params = model->parameters();
  std::vector<bool> decay;
  for (const loom::Tensor& p : params) decay.push_back(p.dim() >= 2);
  loom::dist::TrainOptions t;
  t.optimizer = "adamw";
  t.beta1 = 0.9, t.beta2 = 0.99, t.weight_decay = 0.1;
  auto opt = loom::dist::make_optimizer(t, params, 1e-3, decay);
  const loom::Tensor x = loom::randint(0, c.vocab_size, {w.batch, c.block_size}).to(device);
  const loom::Tensor y = loom::randint(0, c.vocab_size, {w.batch, c.block_size}).to(device);
  auto loom_step = [&] {
    const auto start = Clock::now();
    opt->zero_grad();
    model->loss(x, y).backward();
    loom::optim::clip_grad_norm_(params, 1.0);
    opt->step();
    loom::synchronize(device);
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };

  loom::bench::TorchPeer torch;
  std::vector<std::string> args = {
      "--threads", std::to_string(threads),      "--vocab", std::to_string(c.vocab_size),
      "--block",   std::to_string(c.block_size), "--embd",  std::to_string(c.n_embd),
      "--layers",  std::to_string(c.n_layer),    "--heads", std::to_string(c.n_head),
      "--batch",   std::to_string(w.batch)};
  if (fused_adamw) args.push_back("--fused-adamw");
  if (device.is_cuda()) args.insert(args.end(), {"--device", "cuda"});
  const bool have_torch = with_torch && !python.empty() &&
                          torch.start(python, repo_file("bench/gpt_step_torch.py"), args);
  if (with_torch && !have_torch)
    std::printf("PyTorch not measured: %s\n", torch.header().is_object()
                                                  ? torch.header().value("error", "?").c_str()
                                                  : "no bench venv (run bench/torch_venv.sh)");

  loom_step();  // warm-up: the optimizer's state, scratch memory, cached blocks
  if (have_torch) torch.request("step");
  std::vector<double> loom_ms, torch_ms;
  for (int r = 0; r < w.repeats; ++r) {
    loom_ms.push_back(loom_step());
    if (have_torch) torch_ms.push_back(torch.request("step").value("ms", 0.0));
  }
  const double tokens = static_cast<double>(w.batch * c.block_size);
  const double flops_per_token = loom::nn::gpt_flops_per_token(c, c.block_size);
  const double loom_tps = tokens / (median(loom_ms) / 1e3);
  std::printf(
      "\n%s: %lld layers, %lld heads, %lld embd, vocabulary %lld, block %lld, batch %lld "
      "(%lld parameters); %s, float32; median of %d steps\n",
      w.name.c_str(), static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head),
      static_cast<long long>(c.n_embd), static_cast<long long>(c.vocab_size),
      static_cast<long long>(c.block_size), static_cast<long long>(w.batch),
      static_cast<long long>(model->num_parameters()),
      device.is_cuda() ? "cuda:0" : (std::to_string(threads) + " threads").c_str(), w.repeats);
  std::printf("| | step ms | tokens/s | MFU |\n|---|---|---|---|\n");
  auto mfu = [&](double tps) { return peak > 0 ? tps * flops_per_token / peak : 0.0; };
  std::printf("| loom | %.1f | %.0f | %.1f%% |\n", median(loom_ms), loom_tps, 100 * mfu(loom_tps));
  if (have_torch) {
    const double torch_tps = tokens / (median(torch_ms) / 1e3);
    std::printf("| PyTorch %s%s | %.1f | %.0f | %.1f%% |\n",
                torch.header().value("torch", "?").c_str(), fused_adamw ? ", fused AdamW" : "",
                median(torch_ms), torch_tps, 100 * mfu(torch_tps));
    std::printf("loom / PyTorch tokens/s: %.2f\n", loom_tps / torch_tps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeats = 0;
  int64_t batch = 0, block = 0;
  std::string device_name = "cpu";
  bool with_torch = true, fused_adamw = false;
  std::string model = "both", python = venv_python();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (arg == "--threads")
      threads = std::stoi(next());
    else if (arg == "--repeats")
      repeats = std::stoi(next());
    else if (arg == "--batch")
      batch = std::stoll(next());
    else if (arg == "--block")
      block = std::stoll(next());
    else if (arg == "--device")
      device_name = next();
    else if (arg == "--model")
      model = next();
    else if (arg == "--no-torch")
      with_torch = false;
    else if (arg == "--fused-adamw")
      fused_adamw = true;
    else if (arg == "--python")
      python = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--model recipe|gpt2|both] [--threads N] [--repeats R] [--batch B] "
                   "[--block T] [--device cpu|cuda] [--no-torch] [--fused-adamw] "
                   "[--python PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  if (model != "recipe" && model != "gpt2" && model != "both") {
    std::fprintf(stderr, "--model: recipe, gpt2 or both, not %s\n", model.c_str());
    return 2;
  }
  if (device_name != "cpu" && device_name != "cuda") {
    std::fprintf(stderr, "--device: cpu or cuda, not %s\n", device_name.c_str());
    return 2;
  }
  const bool on_gpu = device_name == "cuda";
  if (on_gpu && loom::cuda_device_count() == 0) {
    std::fprintf(stderr, "--device cuda: %s\n", loom::why_no_cuda_device().c_str());
    return 2;
  }
  const loom::Device device = on_gpu ? loom::Device{loom::DeviceType::CUDA, 0} : loom::kCPU;
  loom::set_num_threads(threads);
  std::signal(SIGPIPE, SIG_IGN);
  double peak = 0;  // FLOP/s
  if (on_gpu) {
    peak = loom::dense_peak_flops(device, loom::kFloat32);
    std::printf("cuda:0; dense float32 peak %.1f TFLOP/s\n", peak / 1e12);
  } else {
    peak = loom::fma_peak_gflops(threads) * 1e9;
    loom::bench::print_machine();
    std::printf("%s, %s; float32 FMA peak %.0f GFLOP/s on %d threads (measured)\n",
                loom::cpu_model_name().c_str(), loom::cpu_vector_isa().c_str(), peak / 1e9,
                threads);
  }
  // The fortunes-char recipe's model: the fortunes corpus holds 114 distinct bytes.
  Workload recipe{"fortunes-char",
                  {.vocab_size = 114,
                   .block_size = 64,
                   .n_embd = 128,
                   .n_layer = 4,
                   .n_head = 4,
                   .dropout = 0.0,
                   .bias = true},
                  12,
                  repeats > 0 ? repeats : 15};
  loom::nn::GPTConfig small = loom::nn::GPTConfig::gpt2_small();
  small.block_size = 256;
  Workload gpt2{"GPT-2 small (124M)", small, 2, repeats > 0 ? repeats : 5};
  for (Workload* w : {&recipe, &gpt2}) {
    if (batch > 0) w->batch = batch;
    if (block > 0) w->config.block_size = block;
  }
  if (model != "gpt2") run(recipe, threads, with_torch, fused_adamw, python, peak, device);
  if (model != "recipe") run(gpt2, threads, with_torch, fused_adamw, python, peak, device);
  return 0;
}

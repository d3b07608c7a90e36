// bench/conv_bench.cpp — conv2d on the ResNet-18 (CIFAR) layer shapes at batch 64, float32 or
// bfloat16: forward and backward (data + weight) times, GFLOP/s, and PyTorch's times for the same
// layers measured in the same run by bench/conv_torch.py, with the ratio loom / PyTorch per layer.
// With --dtype bf16 the input, weight and output gradient are bfloat16 tensors on both sides, as
// bf16 autocast hands them to a convolution (loom: Note [bf16 convolutions]; PyTorch: oneDNN).
// PyTorch runs as a co-process (--serve) and the two alternate repetition by repetition, so
// that load from other processes on the machine falls on both alike. Times are medians.
//
// --width W scales the channels as the apps' --width does (64 is ResNet-18's own; the main job
// runs 16), the stem's 3 input channels excepted.
//
//   conv_bench [--threads N (2)] [--repeats R (7)] [--batch B (64)] [--width W (64)] [--layer I]
//              [--algorithm auto|benchmark|packed|im2col|winograd2|winograd4|direct]
//              [--dtype float32|bf16] [--no-torch] [--python PATH] [--script PATH]

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom.h"
#include "machine.h"
#include "stats.h"
#include "tensor/conv.h"
#include "torch_peer.h"

namespace {

using loom::bench::median;
using loom::bench::timed_ms;

using loom::Tensor;
using loom::bench::TorchPeer;
using nlohmann::json;

struct Layer {
  int64_t c, hw, o, k, stride, pad;
};

// The convolutions of ResNet-18 on 32x32 CIFAR images, at width 64.
const std::vector<Layer> kLayers = {
    {3, 32, 64, 3, 1, 1},    {64, 32, 64, 3, 1, 1},   {64, 32, 128, 3, 2, 1},
    {64, 32, 128, 1, 2, 0},  {128, 16, 128, 3, 1, 1}, {128, 16, 256, 3, 2, 1},
    {128, 16, 256, 1, 2, 0}, {256, 8, 256, 3, 1, 1},  {256, 8, 512, 3, 2, 1},
    {256, 8, 512, 1, 2, 0},  {512, 4, 512, 3, 1, 1},
};

// A layer at another width: channels times width / 64, the image's 3 kept.
Layer at_width(const Layer& l, int64_t width) {
  Layer w = l;
  if (w.c != 3) w.c = std::max<int64_t>(1, l.c * width / 64);
  w.o = std::max<int64_t>(1, l.o * width / 64);
  return w;
}

std::string layer_name(const Layer& l) {
  return loom::detail::str(l.c, "->", l.o, " ", l.k, "x", l.k, l.stride > 1 ? " s2 " : " ", l.hw);
}

struct Times {
  double forward_ms = 0, backward_ms = 0;
};

}  // namespace

int main(int argc, char** argv) {
  loom::bench::wait_passively(argv);
  int threads = 2, repeats = 7, only = -1;
  int64_t batch = 64, width = 64;
  bool with_torch = true;
  std::string python = LOOM_TORCH_PYTHON, algorithm = "auto", dtype_name = "float32";
  std::string script = (std::filesystem::path(__FILE__).parent_path() / "conv_torch.py").string();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--threads")
      threads = std::max(1, std::stoi(next()));
    else if (arg == "--repeats")
      repeats = std::max(1, std::stoi(next()));
    else if (arg == "--batch")
      batch = std::max<int64_t>(1, std::stoll(next()));
    else if (arg == "--width")
      width = std::max<int64_t>(1, std::stoll(next()));
    else if (arg == "--layer")
      only = std::stoi(next());
    else if (arg == "--algorithm")
      algorithm = next();
    else if (arg == "--dtype")
      dtype_name = next();
    else if (arg == "--no-torch")
      with_torch = false;
    else if (arg == "--python")
      python = next();
    else if (arg == "--script")
      script = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--repeats R] [--batch B] [--width W] [--layer I] "
                   "[--algorithm auto|benchmark|packed|im2col|winograd2|winograd4|direct] "
                   "[--dtype float32|bf16] [--no-torch] [--python PATH] [--script PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    loom::kernels::set_conv2d_algorithm(loom::kernels::parse_conv2d_algorithm(algorithm));
  } catch (const loom::ValueError& e) {
    std::fprintf(stderr, "conv_bench: %s\n", e.what());
    return 2;
  }
  if (dtype_name != "float32" && dtype_name != "bf16") {
    std::fprintf(stderr, "conv_bench: --dtype float32 or bf16, not %s\n", dtype_name.c_str());
    return 2;
  }
  const loom::DType dtype = dtype_name == "bf16" ? loom::kBFloat16 : loom::kFloat32;
  loom::set_num_threads(threads);
  loom::manual_seed(0);
  std::signal(SIGPIPE, SIG_IGN);

  TorchPeer torch;
  const bool have_torch =
      with_torch && !python.empty() &&
      torch.start(python, script, {"--threads", std::to_string(threads), "--dtype", dtype_name});
  if (with_torch && !have_torch)
    std::printf("PyTorch not measured: %s\n", torch.header().is_object()
                                                  ? torch.header().value("error", "?").c_str()
                                                  : "no answer from conv_torch.py");

  std::vector<size_t> rows;
  std::vector<Times> loom_times, torch_times;
  std::vector<double> gflop;  // forward GFLOP per layer; the backward is twice that
  for (size_t i = 0; i < kLayers.size(); ++i) {
    if (only >= 0 && static_cast<size_t>(only) != i) continue;
    const Layer l = at_width(kLayers[i], width);
    const Tensor x = loom::randn({batch, l.c, l.hw, l.hw}).to(dtype);
    const Tensor w = loom::randn({l.o, l.c, l.k, l.k}).mul_(0.1).to(dtype);
    const loom::kernels::Conv2dOptions options{{l.stride, l.stride}, {l.pad, l.pad}, {1, 1}, 1};
    const Tensor dy =
        loom::randn(loom::kernels::conv2d_output_shape(x, w, Tensor(), options)).to(dtype);
    auto forward = [&] { loom::kernels::conv2d(x, w, Tensor(), options); };
    auto backward = [&] { loom::kernels::conv2d_backward(dy, x, w, options, {true, true, false}); };
    for (int r = 0; r < 2; ++r) forward(), backward();  // warm-up
    if (have_torch)
      torch.request(loom::detail::str("layer ", batch, ",", l.c, ",", l.hw, ",", l.hw, ",", l.o,
                                      ",", l.k, ",", l.stride, ",", l.pad));
    std::vector<double> fwd, bwd, pt_fwd, pt_bwd;
    for (int r = 0; r < repeats; ++r) {
      fwd.push_back(timed_ms(forward));
      if (have_torch) pt_fwd.push_back(torch.request("fwd").value("ms", 0.0));
      bwd.push_back(timed_ms(backward));
      if (have_torch) pt_bwd.push_back(torch.request("bwd").value("ms", 0.0));
    }
    rows.push_back(i);
    gflop.push_back(2.0 * static_cast<double>(dy.numel()) * static_cast<double>(l.c * l.k * l.k) *
                    1e-9);
    loom_times.push_back({median(fwd), median(bwd)});
    if (have_torch) torch_times.push_back({median(pt_fwd), median(pt_bwd)});
  }

  loom::bench::print_machine();
  std::printf("conv2d %s, batch %lld, %d threads, median of %d, algorithm %s", dtype_name.c_str(),
              static_cast<long long>(batch), threads, repeats, algorithm.c_str());
  if (have_torch)
    std::printf(
        "; PyTorch %s (%d threads, mkldnn %s)", torch.header()["torch"].get<std::string>().c_str(),
        torch.header()["threads"].get<int>(), torch.header()["mkldnn"].get<bool>() ? "on" : "off");
  std::printf("\n%-20s %8s %6s %8s %6s", "layer", "fwd ms", "GF/s", "bwd ms", "GF/s");
  if (have_torch)
    std::printf(" | %8s %6s %8s %6s | %6s %6s %6s", "pt fwd", "GF/s", "pt bwd", "GF/s", "fwd x",
                "bwd x", "both x");
  std::printf("\n");
  Times total, total_torch;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Times& t = loom_times[r];
    std::printf("%-20s %8.2f %6.1f %8.2f %6.1f",
                layer_name(at_width(kLayers[rows[r]], width)).c_str(), t.forward_ms,
                gflop[r] / t.forward_ms * 1e3, t.backward_ms, 2 * gflop[r] / t.backward_ms * 1e3);
    total.forward_ms += t.forward_ms, total.backward_ms += t.backward_ms;
    if (have_torch) {
      const Times& p = torch_times[r];
      std::printf(" | %8.2f %6.1f %8.2f %6.1f | %6.2f %6.2f %6.2f", p.forward_ms,
                  gflop[r] / p.forward_ms * 1e3, p.backward_ms, 2 * gflop[r] / p.backward_ms * 1e3,
                  t.forward_ms / p.forward_ms, t.backward_ms / p.backward_ms,
                  (t.forward_ms + t.backward_ms) / (p.forward_ms + p.backward_ms));
      total_torch.forward_ms += p.forward_ms, total_torch.backward_ms += p.backward_ms;
    }
    std::printf("\n");
  }
  std::printf("%-20s %8.2f %6s %8.2f %6s", "total", total.forward_ms, "", total.backward_ms, "");
  if (have_torch)
    std::printf(" | %8.2f %6s %8.2f %6s | %6.2f %6.2f %6.2f", total_torch.forward_ms, "",
                total_torch.backward_ms, "", total.forward_ms / total_torch.forward_ms,
                total.backward_ms / total_torch.backward_ms,
                (total.forward_ms + total.backward_ms) /
                    (total_torch.forward_ms + total_torch.backward_ms));
  std::printf("\n");
  if (have_torch) std::printf("x = loom time / PyTorch time: below 1 means loom is faster\n");
  return 0;
}

// bench/winograd_bench.cpp — Winograd convolution (tensor/cpu/winograd.h), F(2x2,3x3) and
// F(4x4,3x3), against loom's conv2d (GEMM on the patches) on the 3x3 stride-1 layers of
// ResNet-18 (CIFAR), float32: forward, backward-data and backward-weight times (medians of the
// repetitions; the three methods alternate within a repetition so that load from other processes
// falls on all alike) and the ratios conv2d time / Winograd time (above 1: Winograd is faster).
//
//   winograd_bench [--threads N (get_num_threads())] [--repeats R (5)] [--batch B (64)]
//                  [--layer I]

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "loom.h"
#include "machine.h"
#include "stats.h"
#include "tensor/conv.h"
#include "tensor/cpu/winograd.h"

namespace {

using loom::Tensor;
using loom::bench::median;
using loom::bench::timed_ms;
using loom::cpu::WinogradShape;
using loom::cpu::WinogradTile;

struct Layer {
  int64_t c, hw, k;
  const char* name;
};

// The 3x3 stride-1 convolutions of ResNet-18 on 32x32 CIFAR images (padding 1).
const std::vector<Layer> kLayers = {
    {3, 32, 64, "3->64 32x32"},    {64, 32, 64, "64->64 32x32"},  {128, 16, 128, "128->128 16x16"},
    {256, 8, 256, "256->256 8x8"}, {512, 4, 512, "512->512 4x4"},
};

enum Pass { kForward, kBackwardData, kBackwardWeight, kPasses };
const char* const kPassNames[kPasses] = {"forward", "backward-data", "backward-weight"};
enum Method { kConv2d, kF2x2, kF4x4, kMethods };

}  // namespace

int main(int argc, char** argv) {
  int threads = loom::get_num_threads(), repeats = 5, only = -1;
  int64_t batch = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 < argc && arg == "--threads")
      threads = std::max(1, std::stoi(argv[++i]));
    else if (i + 1 < argc && arg == "--repeats")
      repeats = std::max(1, std::stoi(argv[++i]));
    else if (i + 1 < argc && arg == "--batch")
      batch = std::max<int64_t>(1, std::stoll(argv[++i]));
    else if (i + 1 < argc && arg == "--layer")
      only = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--repeats R] [--batch B] [--layer I]\n",
                   argv[0]);
      return 2;
    }
  }
  loom::set_num_threads(threads);
  loom::manual_seed(0);

  loom::bench::print_machine();
  std::printf("3x3 stride-1 conv, float32, batch %lld, %d threads, median of %d (ms)\n",
              static_cast<long long>(batch), threads, repeats);
  std::printf("%-16s %-16s %9s %9s %9s %9s %9s\n", "layer", "pass", "conv2d", "F2x2", "F4x4",
              "x F2x2", "x F4x4");
  double totals[kPasses][kMethods] = {};
  for (size_t i = 0; i < kLayers.size(); ++i) {
    if (only >= 0 && static_cast<size_t>(only) != i) continue;
    const Layer& l = kLayers[i];
    const WinogradShape shape{
        .n = batch, .c = l.c, .h = l.hw, .w = l.hw, .k = l.k, .pad_h = 1, .pad_w = 1};
    const Tensor x = loom::randn({batch, l.c, l.hw, l.hw});
    const Tensor w = loom::randn({l.k, l.c, 3, 3}).mul_(0.1);
    const Tensor dy = loom::randn({batch, l.k, l.hw, l.hw});
    Tensor y = loom::empty(dy.sizes()), dx = loom::empty(x.sizes()), dw = loom::empty(w.sizes());
    loom::kernels::Conv2dOptions options;
    options.padding = {1, 1};

    auto run = [&](Pass pass, Method method) {
      if (method == kConv2d) {
        if (pass == kForward) loom::kernels::conv2d(x, w, Tensor(), options);
        if (pass == kBackwardData)
          loom::kernels::conv2d_backward(dy, x, w, options, {true, false, false});
        if (pass == kBackwardWeight)
          loom::kernels::conv2d_backward(dy, x, w, options, {false, true, false});
        return;
      }
      const WinogradTile tile = method == kF2x2 ? WinogradTile::kF2x2 : WinogradTile::kF4x4;
      if (pass == kForward)
        loom::cpu::winograd_conv2d(shape, tile, x.data_ptr<float>(), w.data_ptr<float>(),
                                   y.data_ptr<float>());
      if (pass == kBackwardData)
        loom::cpu::winograd_conv2d_backward_data(shape, tile, dy.data_ptr<float>(),
                                                 w.data_ptr<float>(), dx.data_ptr<float>());
      if (pass == kBackwardWeight)
        loom::cpu::winograd_conv2d_backward_weight(shape, tile, x.data_ptr<float>(),
                                                   dy.data_ptr<float>(), dw.data_ptr<float>());
    };

    std::vector<double> ms[kPasses][kMethods];
    for (int p = 0; p < kPasses; ++p)
      for (int m = 0; m < kMethods; ++m) run(Pass(p), Method(m));  // warm-up
    for (int r = 0; r < repeats; ++r)
      for (int p = 0; p < kPasses; ++p)
        for (int m = 0; m < kMethods; ++m)
          ms[p][m].push_back(timed_ms([&] { run(Pass(p), Method(m)); }));
    for (int p = 0; p < kPasses; ++p) {
      double t[kMethods];
      for (int m = 0; m < kMethods; ++m) totals[p][m] += t[m] = median(ms[p][m]);
      std::printf("%-16s %-16s %9.2f %9.2f %9.2f %9.2f %9.2f\n", l.name, kPassNames[p], t[kConv2d],
                  t[kF2x2], t[kF4x4], t[kConv2d] / t[kF2x2], t[kConv2d] / t[kF4x4]);
    }
  }
  for (int p = 0; p < kPasses; ++p) {
    const double* t = totals[p];
    std::printf("%-16s %-16s %9.2f %9.2f %9.2f %9.2f %9.2f\n", "total", kPassNames[p], t[kConv2d],
                t[kF2x2], t[kF4x4], t[kConv2d] / t[kF2x2], t[kConv2d] / t[kF4x4]);
  }
  std::printf("x = conv2d time / Winograd time: above 1 means Winograd is faster\n");
  return 0;
}

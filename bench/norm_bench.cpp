// bench/norm_bench.cpp — batch norm with its ReLU, and layer norm, against PyTorch: forward and
// backward times of the kernels a training step runs, on the main job's batch-norm shapes
// (ResNet-18, CIFAR form, at --width and --batch) and on GPT-2-sized layer-norm rows, with
// PyTorch's times for the same cases measured in the same run by bench/norm_torch.py (a
// co-process; the two alternate call by call). Times are medians.
//
// Each side runs its models' way: loom's batch norm applies the ReLU as it writes y and takes the
// ReLU's gradient inside its backward (Note [Batch norm with ReLU]); PyTorch runs batch_norm,
// then relu, and backward threshold_backward, then native_batch_norm_backward, as torchvision's
// ResNet does. The backward computes dx, dweight and dbias on both sides.
//
// The two sides alternate call by call, and each call takes a millisecond or so, so both wait
// passively unless OMP_WAIT_POLICY is set (wait_passively, bench/torch_peer.h).
//
// --dtype bf16 runs the batch-norm cases on bfloat16 x, dy and y with float32 parameters, as
// bf16 autocast does (Note [Batch norm on bfloat16]; PyTorch's CPU batch norm takes the same
// mixed dtypes). Layer norm, which autocast runs in float32, is left out there.
//
//   norm_bench [--threads N (2)] [--repeats R (9)] [--batch B (128)] [--width W (16)]
//              [--channels-last] [--dtype float32|bf16] [--no-torch] [--python PATH]
//              [--script PATH]

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "loom.h"
#include "machine.h"
#include "stats.h"
#include "tensor/norm.h"
#include "torch_peer.h"

namespace {

using loom::Tensor;
using loom::bench::median;
using loom::bench::timed_ms;
using loom::bench::TorchPeer;

// One case: its name, the peer's request that sets it up, and loom's two passes.
struct Case {
  std::string name, request;
  double megabytes;  // one activation
  std::function<void()> forward, backward;
};

// relu(batch_norm(x)) on [n, c, hw, hw] and its backward, as ResNet-18's blocks run it; x, dy and
// y of `dtype`, the parameters float32.
Case batch_norm_case(int64_t n, int64_t c, int64_t hw, bool channels_last, loom::DType dtype) {
  const loom::MemoryFormat format =
      channels_last ? loom::MemoryFormat::kChannelsLast : loom::MemoryFormat::kContiguous;
  const Tensor x = loom::randn({n, c, hw, hw}).to(dtype).contiguous(format);
  const Tensor dy = loom::randn({n, c, hw, hw}).to(dtype).contiguous(format);
  const Tensor weight = loom::randn({c}), bias = loom::randn({c});
  loom::kernels::BatchNormEpilogue relu;
  relu.relu = true;
  auto state = std::make_shared<std::pair<Tensor, loom::kernels::BatchNormStats>>(
      loom::kernels::batch_norm_forward_train(x, weight, bias, 1e-5, relu));
  Case k;
  k.name = loom::detail::str("bn+relu [", n, ",", c, ",", hw, ",", hw, "]");
  k.request = loom::detail::str("bn ", n, ",", c, ",", hw, ",", hw, ",", channels_last ? 1 : 0, ",",
                                dtype == loom::kBFloat16 ? "bf16" : "float32");
  k.megabytes = static_cast<double>(x.nbytes()) * 1e-6;
  k.forward = [=] {
    *state = loom::kernels::batch_norm_forward_train(x, weight, bias, 1e-5, relu);
  };
  k.backward = [=] {
    loom::kernels::batch_norm_backward(dy, x, state->second.mean, state->second.invstd, weight,
                                       /*training=*/true, {true, true, true}, state->first);
  };
  return k;
}

// layer_norm over the last dim of [m, d] and its backward.
Case layer_norm_case(int64_t m, int64_t d) {
  const Tensor x = loom::randn({m, d}), dy = loom::randn({m, d});
  const Tensor weight = loom::randn({d}), bias = loom::randn({d});
  auto state = std::make_shared<loom::kernels::LayerNormForward>(
      loom::kernels::layer_norm_forward(x, d, weight, bias, 1e-5));
  Case k;
  k.name = loom::detail::str("layer_norm [", m, ",", d, "]");
  k.request = loom::detail::str("ln ", m, ",", d);
  k.megabytes = static_cast<double>(x.numel()) * 4e-6;
  k.forward = [=] { *state = loom::kernels::layer_norm_forward(x, d, weight, bias, 1e-5); };
  k.backward = [=] {
    loom::kernels::layer_norm_backward(dy, x, state->mean, state->rstd, weight, d,
                                       {true, true, true});
  };
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  loom::bench::wait_passively(argv);
  int threads = 2, repeats = 9;
  int64_t batch = 128, width = 16;
  bool channels_last = false, with_torch = true;
  loom::DType dtype = loom::kFloat32;
  std::string python = LOOM_TORCH_PYTHON;
  std::string script = (std::filesystem::path(__FILE__).parent_path() / "norm_torch.py").string();
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
    else if (arg == "--channels-last")
      channels_last = true;
    else if (arg == "--dtype") {
      const std::string name = next();
      if (name != "float32" && name != "bf16") {
        std::fprintf(stderr, "--dtype takes float32 or bf16; got %s\n", name.c_str());
        return 2;
      }
      dtype = name == "bf16" ? loom::kBFloat16 : loom::kFloat32;
    } else if (arg == "--no-torch")
      with_torch = false;
    else if (arg == "--python")
      python = next();
    else if (arg == "--script")
      script = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--repeats R] [--batch B] [--width W] "
                   "[--channels-last] [--dtype float32|bf16] [--no-torch] [--python PATH] "
                   "[--script PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  loom::set_num_threads(threads);
  loom::manual_seed(0);
  std::signal(SIGPIPE, SIG_IGN);

  TorchPeer torch;
  const bool have_torch = with_torch && !python.empty() &&
                          torch.start(python, script, {"--threads", std::to_string(threads)});
  if (with_torch && !have_torch)
    std::printf("PyTorch not measured: %s\n", torch.header().is_object()
                                                  ? torch.header().value("error", "?").c_str()
                                                  : "no answer from norm_torch.py");

  // ResNet-18's four stages on 32 x 32 images, then GPT-2 small's rows (8 x 1024 tokens, 768)
  // and a narrower model's (16 x 256 tokens, 256).
  std::vector<Case> cases;
  for (int64_t stage = 0; stage < 4; ++stage)
    cases.push_back(batch_norm_case(batch, width << stage, 32 >> stage, channels_last, dtype));
  if (dtype == loom::kFloat32) {
    cases.push_back(layer_norm_case(8 * 1024, 768));
    cases.push_back(layer_norm_case(16 * 256, 256));
  }

  loom::bench::print_machine();
  std::printf("%s, %d threads, median of %d, OMP_WAIT_POLICY=%s",
              dtype == loom::kBFloat16 ? "bf16 batch norm (float32 parameters)" : "float32",
              threads, repeats, std::getenv("OMP_WAIT_POLICY"));
  if (have_torch)
    std::printf("; PyTorch %s (%d threads)", torch.header()["torch"].get<std::string>().c_str(),
                torch.header()["threads"].get<int>());
  std::printf("%s\n", channels_last ? "; batch norm in channels-last" : "");
  std::printf("%-28s %7s %8s %8s", "case", "MB", "fwd ms", "bwd ms");
  if (have_torch) std::printf(" | %8s %8s | %6s %6s", "pt fwd", "pt bwd", "fwd x", "bwd x");
  std::printf("\n");
  for (Case& k : cases) {
    for (int r = 0; r < 2; ++r) k.forward(), k.backward();  // warm-up
    if (have_torch) torch.request(k.request);
    std::vector<double> fwd, bwd, pt_fwd, pt_bwd;
    for (int r = 0; r < repeats; ++r) {
      fwd.push_back(timed_ms(k.forward));
      if (have_torch) pt_fwd.push_back(torch.request("fwd").value("ms", 0.0));
      bwd.push_back(timed_ms(k.backward));
      if (have_torch) pt_bwd.push_back(torch.request("bwd").value("ms", 0.0));
    }
    std::printf("%-28s %7.1f %8.3f %8.3f", k.name.c_str(), k.megabytes, median(fwd), median(bwd));
    if (have_torch)
      std::printf(" | %8.3f %8.3f | %6.2f %6.2f", median(pt_fwd), median(pt_bwd),
                  median(fwd) / median(pt_fwd), median(bwd) / median(pt_bwd));
    std::printf("\n");
  }
  if (have_torch) std::printf("x = loom time / PyTorch time: below 1 means loom is faster\n");
  return 0;
}

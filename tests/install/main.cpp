// An embedder's program: trains y = 3x - 1 with a few gradient steps through the installed loom,
// then moves a ResNet's weights through a safetensors file and back.
#include <loom/loom.h>

#include <cmath>
#include <cstdio>

int main() {
  loom::manual_seed(0);
  loom::Tensor x = loom::linspace(-1, 1, 32).reshape({32, 1});
  loom::Tensor y = x * 3.0 - 1.0;
  loom::Tensor w = loom::zeros({1, 1}).requires_grad_();
  loom::Tensor b = loom::zeros({1}).requires_grad_();
  for (int step = 0; step < 200; ++step) {
    loom::Tensor loss = loom::mean(loom::pow(loom::linear(x, w, b) - y, 2.0));
    loss.backward();
    loom::NoGradGuard no_grad;
    w.sub_(w.grad(), 0.5);
    b.sub_(b.grad(), 0.5);
    w.grad().zero_();
    b.grad().zero_();
  }
  const double wv = w.item(), bv = b.item();
  std::printf("w=%.4f b=%.4f\n", wv, bv);
  if (!(std::fabs(wv - 3.0) < 1e-3 && std::fabs(bv + 1.0) < 1e-3)) return 1;

  // The other half of an embedder's job: a model with PyTorch's key names, its weights through
  // a safetensors file and back.
  auto net = loom::nn::resnet18({.width = 4, .num_classes = 3});
  net->eval();
  const loom::Tensor image = loom::randn({1, 3, 32, 32});
  loom::NoGradGuard no_grad;
  const loom::Tensor before = net->forward(image);
  loom::save_safetensors("loom_install_check.safetensors", net->state_dict());
  auto copy = loom::nn::resnet18({.width = 4, .num_classes = 3});
  copy->eval();
  copy->load_state_dict(loom::load_safetensors("loom_install_check.safetensors").tensors);
  std::remove("loom_install_check.safetensors");
  const double diff = loom::max(loom::abs(copy->forward(image) - before)).item();
  std::printf("resnet18 round trip: max difference %g\n", diff);
  return diff == 0.0 ? 0 : 1;
}

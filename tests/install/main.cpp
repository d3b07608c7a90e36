// An embedder's program: trains y = 3x - 1 with a few gradient steps through the installed loom.
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
  return std::fabs(wv - 3.0) < 1e-3 && std::fabs(bv + 1.0) < 1e-3 ? 0 : 1;
}

// optim/adam.h — Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay),
// with optional AMSGrad: the single-tensor algorithms of torch.optim.Adam / AdamW 1.13, same
// numbers step by step.
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace loom::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // L2: wd * p added to the gradient
  bool amsgrad = false;
  // Per parameter, whether weight_decay applies to it; empty: to every one. PyTorch says this
  // with two parameter groups (nanoGPT's configure_optimizers: decay on matrices and embeddings,
  // none on biases and LayerNorm weights). ValueError when its length is not the parameters'.
  std::vector<bool> decay = {};
};

// AdamW's options: the same fields, weight decay on by default (decoupled: p *= 1 - lr * wd).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  std::vector<bool> decay = {};  // as AdamOptions::decay
};

// Per parameter p with gradient g, at its step t (counted from 1):
//   Adam:  g = g + weight_decay * p            AdamW:  p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   v_max = max(v_max, v) and v = v_max        (amsgrad)
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State: exp_avg (m), exp_avg_sq (v), max_exp_avg_sq (amsgrad), and the step count t.
class AdamBase : public Optimizer {
 public:
  void step() override;
  void load_state(const SafetensorsFile& file, const std::string& prefix) override;
  AdamOptions options() const;                                 // .lr is the current lr()
  double momentum() const override { return options_.beta1; }  // what one-cycle cycles
  void set_momentum(double beta1) override;                    // ValueError outside [0, 1)

 protected:
  AdamBase(std::string name, std::vector<Tensor> params, AdamOptions options, bool decoupled);
  std::vector<std::string> buffer_names() const override;
  Metadata hyper_parameters() const override;

 private:
  AdamOptions options_;
  bool decoupled_;  // AdamW
};

class Adam : public AdamBase {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
};

class AdamW : public AdamBase {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
};

}  // namespace loom::optim

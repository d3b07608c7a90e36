// autograd/gradcheck.h — checks a backward against central differences, in float64.
// For every output element j and input element i it compares the analytical Jacobian entry
// (from backward with a one-hot gradient on j) with (f(x + eps e_i) - f(x - eps e_i)) / 2 eps,
// and passes when |analytical - numerical| <= atol + rtol |numerical| everywhere.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, both values
  explicit operator bool() const { return ok; }
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

// inputs: float64 tensors; those with requires_grad() are checked. f must be deterministic.
GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          GradcheckOptions options = {});

}  // namespace loom::autograd

namespace loom {
using autograd::gradcheck;
}

// autograd/gradcheck.cpp — the Jacobian, analytical (one backward per output element) against
// numerical (two forwards per input element). Meant for small tensors in tests.

#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/graph.h"
#include "tensor/copy.h"

namespace loom::autograd {

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          GradcheckOptions options) {
  for (const Tensor& in : inputs) {
    LOOM_CHECK(!in.defined() || !in.requires_grad() || in.dtype() == kFloat64, DTypeError,
               "gradcheck: inputs that require grad must be float64; got ", in.dtype(),
               " shape=", in.sizes());
  }
  // Analytical: row j of the Jacobian is the gradient of output element j.
  Tensor out = f(inputs);
  LOOM_CHECK(out.dtype() == kFloat64, DTypeError, "gradcheck: output must be float64; got ",
             out.dtype());
  const int64_t n_out = out.numel();
  std::vector<std::vector<double>> analytical(inputs.size());  // [input][j * n_in + i]
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].defined() && inputs[k].requires_grad())
      analytical[k].assign(n_out * inputs[k].numel(), 0.0);
  for (int64_t j = 0; j < n_out; ++j) {
    for (const Tensor& in : inputs)
      if (in.defined() && in.requires_grad()) const_cast<Tensor&>(in).set_grad(Tensor());
    Tensor seed = zeros(out.sizes(), kFloat64);
    seed.data_ptr<double>()[j] = 1.0;
    Tensor y = f(inputs);
    if (!y.requires_grad()) continue;  // constant output: analytical stays zero
    y.backward(seed);
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (analytical[k].empty()) continue;
      Tensor g = inputs[k].grad();
      if (!g.defined()) continue;
      std::vector<double> gv = g.to_vector<double>();
      for (size_t i = 0; i < gv.size(); ++i) analytical[k][j * gv.size() + i] = gv[i];
    }
  }
  for (const Tensor& in : inputs)
    if (in.defined() && in.requires_grad()) const_cast<Tensor&>(in).set_grad(Tensor());

  // Numerical: perturb each input element both ways (without recording a graph).
  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (analytical[k].empty()) continue;
    const Tensor& in = inputs[k];
    LOOM_CHECK(in.is_contiguous(), ValueError, "gradcheck: inputs must be contiguous");
    double* data = in.data_ptr<double>();
    const int64_t n_in = in.numel();
    for (int64_t i = 0; i < n_in; ++i) {
      const double saved = data[i];
      data[i] = saved + options.eps;
      const std::vector<double> plus = kernels::clone(f(inputs)).to_vector<double>();
      data[i] = saved - options.eps;
      const std::vector<double> minus = kernels::clone(f(inputs)).to_vector<double>();
      data[i] = saved;
      for (int64_t j = 0; j < n_out; ++j) {
        const double numerical = (plus[j] - minus[j]) / (2 * options.eps);
        const double a = analytical[k][j * n_in + i];
        if (!(std::fabs(a - numerical) <= options.atol + options.rtol * std::fabs(numerical))) {
          std::ostringstream os;
          os << "gradcheck: input " << k << " (shape=" << detail::str(in.sizes()) << ") element "
             << i << ", output element " << j << ": analytical " << a << " vs numerical "
             << numerical;
          return {false, os.str()};
        }
      }
    }
  }
  return {true, ""};
}

}  // namespace loom::autograd

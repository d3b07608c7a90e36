// tensor/optim.cpp — the front of the fused optimizer updates (tensor/optim.h): the checks that
// every tensor of a list shares the first parameter's device and dtype, its shape and a dense
// layout, then the one device switch to tensor/cpu/optim.cpp or the CUDA backend
// (tensor/cuda_backend.h).

#include "tensor/optim.h"

#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/cpu/optim.h"
#include "tensor/cuda_backend.h"

namespace loom::kernels {

namespace {

// a and b of one shape lay out their elements in the same order (strides may differ only in
// dims of size 1, which no element steps through).
bool stored_alike(const Tensor& a, const Tensor& b) {
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

// `t` (an entry's parameter, gradient or buffer; undefined ones are skipped) agrees with the
// list's first parameter in device and dtype, and with its entry's parameter in shape and
// layout.
void check_member(const char* op, const char* what, const Tensor& t, const Tensor& param,
                  const Tensor& first) {
  if (!t.defined()) return;
  LOOM_CHECK(t.device() == first.device(), DeviceError, op, ": expected every tensor on ",
             first.device(), "; got ", what, " on ", t.device(), " (shape=", t.sizes(), ")");
  LOOM_CHECK(t.dtype() == first.dtype(), DTypeError, op, ": expected every tensor in ",
             first.dtype(), "; got ", what, " in ", t.dtype(), " (shape=", t.sizes(), ")");
  LOOM_CHECK(t.sizes() == param.sizes(), ShapeError, op, ": ", what,
             " does not match its parameter; got ", what, "=", t.sizes(), " param=", param.sizes());
  LOOM_CHECK(is_dense(t) && stored_alike(t, param), ValueError, op, ": expected ", what,
             " dense and stored as its parameter; got strides ", t.strides(), " against ",
             param.strides(), " (shape=", t.sizes(), ")");
}

void check_floating(const char* op, const Tensor& first) {
  LOOM_CHECK(first.dtype() == kFloat32 || first.dtype() == kFloat64, DTypeError, op,
             ": updates float32 and float64 parameters; got ", first.dtype(),
             " (shape=", first.sizes(), ")");
}

}  // namespace

void sgd_update(std::span<const SgdTensors> list, const SgdStep& s) {
  if (list.empty()) return;
  const char* op = "sgd_update";
  const Tensor& first = list.front().param;
  check_floating(op, first);
  for (const SgdTensors& e : list) {
    check_member(op, "param", e.param, e.param, first);
    check_member(op, "grad", e.grad, e.param, first);
    check_member(op, "momentum_buffer", e.buffer, e.param, first);
  }
  if (first.is_cuda()) return cuda_backend().sgd_update(list, s);
  cpu::sgd_update(list, s);
}

void adam_update(std::span<const AdamTensors> list, const AdamStep& s) {
  if (list.empty()) return;
  const char* op = "adam_update";
  const Tensor& first = list.front().param;
  check_floating(op, first);
  for (const AdamTensors& e : list) {
    check_member(op, "param", e.param, e.param, first);
    check_member(op, "grad", e.grad, e.param, first);
    check_member(op, "exp_avg", e.exp_avg, e.param, first);
    check_member(op, "exp_avg_sq", e.exp_avg_sq, e.param, first);
    check_member(op, "max_exp_avg_sq", e.max_exp_avg_sq, e.param, first);
  }
  if (first.is_cuda()) return cuda_backend().adam_update(list, s);
  cpu::adam_update(list, s);
}

void unscale_and_check_(std::span<const Tensor> grads, double inv_scale, const Tensor& found_inf) {
  if (grads.empty()) return;
  const char* op = "unscale_and_check_";
  const Tensor& first = grads.front();
  check_floating(op, first);
  for (const Tensor& g : grads) check_member(op, "grad", g, g, first);
  LOOM_CHECK(found_inf.defined() && found_inf.numel() == 1 && found_inf.dtype() == kInt32 &&
                 found_inf.device() == first.device(),
             ValueError, op, ": expected found_inf as int32 [1] on ", first.device(), "; got ",
             found_inf.defined() ? detail::str(found_inf.dtype(), " ", found_inf.sizes(), " on ",
                                               found_inf.device())
                                 : std::string("an undefined tensor"));
  if (first.is_cuda()) return cuda_backend().unscale_and_check_(grads, inv_scale, found_inf);
  cpu::unscale_and_check_(grads, inv_scale, found_inf);
}

}  // namespace loom::kernels

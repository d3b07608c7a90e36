// autograd/function.h — how a differentiable op records itself. The forward computes with
// kernels (no gradients), then calls record() with its inputs, the tensors its backward needs,
// and the backward as a lambda written right below the forward:
//
//   Tensor out = kernels::matmul(a, b);
//   return record("matmul", out, {a, b}, /*save=*/{a, b},
//                 [](const Grads& dout, Saved& s, Grads& g) {
//                   if (s.needs_grad(0)) g[0] = kernels::matmul(dout[0], s[1], false, true);
//                   if (s.needs_grad(1)) g[1] = kernels::matmul(s[0], dout[0], true, false);
//                 });
//
// record() does nothing when grad mode is off or no input requires grad. Gradients for inputs
// that were broadcast may keep the broadcast shape: the engine reduces them to the input's shape
// (autograd/engine.cpp, the one place that does).
#pragma once

#include <functional>
#include <initializer_list>

#include "autograd/graph.h"

namespace loom::autograd {

using Grads = std::vector<Tensor>;

// The tensors a backward needs, saved as detached aliases (no reference cycle through an
// output's grad_fn) with the storage version at save time. Reading one whose storage was since
// written in place raises AutogradError naming the op; reading after release raises too.
class Saved {
 public:
  Saved(std::string op, std::vector<Tensor> tensors, std::vector<bool> needs_grad);
  const Tensor& operator[](size_t i);
  size_t size() const { return tensors_.size(); }
  bool needs_grad(size_t input) const { return input < needs_grad_.size() && needs_grad_[input]; }
  void release();

 private:
  std::string op_;
  std::vector<Tensor> tensors_;
  std::vector<uint64_t> versions_;
  std::vector<bool> needs_grad_;
  bool released_ = false;
};

using BackwardFn = std::function<void(const Grads& dout, Saved& saved, Grads& dinputs)>;

// The node record() creates: runs the lambda, then checks the gradients' shapes.
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, std::vector<Edge> next_edges, std::vector<TensorMeta> outputs,
               Saved saved, BackwardFn fn);
  std::vector<Tensor> apply(std::vector<Tensor> grads) override;
  void release() override;

 private:
  Saved saved_;
  BackwardFn fn_;
  bool released_ = false;
};

// True when grad mode is on and some input requires grad: record() would create a node.
bool any_requires_grad(std::initializer_list<Tensor> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Attaches the backward to `out` (when any input requires grad) and returns it.
Tensor record(const char* name, Tensor out, const std::vector<Tensor>& inputs,
              std::vector<Tensor> save, BackwardFn fn);
// The same for an op with several outputs (split, max with indices, ...). Outputs of integer
// dtype never require grad.
std::vector<Tensor> record_multi(const char* name, std::vector<Tensor> outs,
                                 const std::vector<Tensor>& inputs, std::vector<Tensor> save,
                                 BackwardFn fn);

// For differentiable views: like record(), and marks the output as a view so that an in-place
// change of it under grad mode is refused rather than silently lost for its base.
Tensor record_view(const char* name, Tensor out, const Tensor& input, BackwardFn fn);
// The same for an op whose several outputs are views of one input (split, chunk).
std::vector<Tensor> record_views(const char* name, std::vector<Tensor> outs, const Tensor& input,
                                 BackwardFn fn);

// Before an in-place op writes `self`: refuses a leaf that requires grad (under grad mode) and
// a view of a tensor that requires grad. See Note [In-place ops and autograd].
void check_inplace(const Tensor& self, const char* op);
// After computing `result` out of place for an in-place op on `self` that needs a graph: copies
// the values into self and moves self's history onto result's node.
void rebase_history(const Tensor& self, const Tensor& result);

}  // namespace loom::autograd

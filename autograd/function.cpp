// autograd/function.cpp — record(): how forward ops attach their backward; saved tensors with
// version checks; in-place ops under autograd.

#include "autograd/function.h"

#include "tensor/copy.h"
#include "tensor/view.h"

namespace loom::autograd {

// ---------------------------------------------------------------- Saved

Saved::Saved(std::string op, std::vector<Tensor> tensors, std::vector<bool> needs_grad)
    : op_(std::move(op)), needs_grad_(std::move(needs_grad)) {
  tensors_.reserve(tensors.size());
  versions_.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    tensors_.push_back(t.defined() ? kernels::alias(t) : Tensor());
    versions_.push_back(t.defined() ? t.version() : 0);
  }
}

const Tensor& Saved::operator[](size_t i) {
  LOOM_CHECK(!released_, AutogradError, "backward: trying to backward through the graph of ", op_,
             " a second time (its saved tensors were freed); pass retain_graph=true to "
             "the first backward to keep them");
  LOOM_ASSERT(i < tensors_.size(), op_, ": saved tensor ", i, " of ", tensors_.size());
  const Tensor& t = tensors_[i];
  LOOM_CHECK(!t.defined() || t.version() == versions_[i], AutogradError,
             "backward: a tensor of shape=", t.sizes(), " saved by ", op_,
             " has been modified by an in-place operation (version ", t.version(), ", expected ",
             versions_[i], ")");
  return t;
}

void Saved::release() {
  tensors_.clear();
  released_ = true;
}

// ---------------------------------------------------------------- FunctionNode

FunctionNode::FunctionNode(std::string name, std::vector<Edge> next_edges,
                           std::vector<TensorMeta> outputs, Saved saved, BackwardFn fn)
    : Node(std::move(name), std::move(next_edges), std::move(outputs)),
      saved_(std::move(saved)),
      fn_(std::move(fn)) {}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor> grads) {
  LOOM_CHECK(!released_, AutogradError, "backward: trying to backward through the graph of ",
             name(),
             " a second time (it was freed by the first backward); pass "
             "retain_graph=true to the first backward to keep it");
  Grads dinputs(next_edges().size());
  fn_(grads, saved_, dinputs);
  for (size_t i = 0; i < dinputs.size(); ++i) {
    if (!next_edges()[i].valid()) dinputs[i] = Tensor();  // nobody wants it
  }
  return dinputs;
}

void FunctionNode::release() {
  saved_.release();
  fn_ = nullptr;  // also frees whatever the lambda captured
  released_ = true;
}

// ---------------------------------------------------------------- record

static bool requires_grad_of(const Tensor& t) { return t.defined() && t.requires_grad(); }

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (requires_grad_of(t)) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (requires_grad_of(t)) return true;
  return false;
}

std::vector<Tensor> record_multi(const char* name, std::vector<Tensor> outs,
                                 const std::vector<Tensor>& inputs, std::vector<Tensor> save,
                                 BackwardFn fn) {
  if (!any_requires_grad(inputs)) return outs;
  std::vector<Edge> edges;
  std::vector<bool> needs;
  edges.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    edges.push_back(requires_grad_of(in) ? gradient_edge(in) : Edge{});
    needs.push_back(edges.back().valid());
  }
  std::vector<TensorMeta> metas;
  for (const Tensor& o : outs) metas.push_back(tensor_meta(o));
  auto node =
      std::make_shared<FunctionNode>(name, std::move(edges), std::move(metas),
                                     Saved(name, std::move(save), std::move(needs)), std::move(fn));
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!is_floating(outs[k].dtype())) continue;  // indices and masks carry no gradient
    // A fresh impl for the output, so an output that aliases an input (a view) gets its own
    // autograd slot rather than overwriting the input's.
    Tensor out = outs[k].unsafe_impl()->autograd ? kernels::alias(outs[k]) : outs[k];
    AutogradMeta& m = meta(out);
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(k);
    outs[k] = out;
  }
  return outs;
}

Tensor record(const char* name, Tensor out, const std::vector<Tensor>& inputs,
              std::vector<Tensor> save, BackwardFn fn) {
  if (!any_requires_grad(inputs)) return out;
  return record_multi(name, {std::move(out)}, inputs, std::move(save), std::move(fn))[0];
}

std::vector<Tensor> record_views(const char* name, std::vector<Tensor> outs, const Tensor& input,
                                 BackwardFn fn) {
  if (!any_requires_grad({input})) return outs;
  outs = record_multi(name, std::move(outs), {input}, {}, std::move(fn));
  for (const Tensor& out : outs) {
    AutogradMeta* m = meta_or_null(out);
    if (m && m->grad_fn) m->is_view = true;
  }
  return outs;
}

Tensor record_view(const char* name, Tensor out, const Tensor& input, BackwardFn fn) {
  if (!any_requires_grad({input})) return out;  // views are hot: no vector when nothing records
  return record_views(name, {std::move(out)}, input, std::move(fn))[0];
}

// Note [In-place ops and autograd]
// An in-place op under grad mode on a tensor that takes part in the graph is computed out of
// place, recorded as usual, and the result is copied into the tensor, whose history then
// points at the new node (rebase_history). The copy bumps the storage version, so a backward
// that saved the old values notices. Two cases are refused with AutogradError: a leaf that
// requires grad (its value is what the gradient is for; use NoGradGuard, as optimizers do), and
// a view of a tensor that requires grad (its base would not learn of the change).
void check_inplace(const Tensor& self, const char* op) {
  if (!grad_enabled()) return;
  AutogradMeta* m = meta_or_null(self);
  if (!m) return;
  LOOM_CHECK(!(m->requires_grad && !m->grad_fn), AutogradError, op,
             ": a leaf tensor that requires grad (shape=", self.sizes(),
             ") is used in an in-place operation; wrap the update in NoGradGuard");
  LOOM_CHECK(!m->is_view, AutogradError, op, ": in-place change of a view (shape=", self.sizes(),
             ") of a tensor that requires grad is not supported; clone() it first");
}

void rebase_history(const Tensor& self, const Tensor& result) {
  kernels::copy_(self, result);
  AutogradMeta* from = meta_or_null(result);
  if (!from || !from->grad_fn) return;
  AutogradMeta& m = meta(self);
  m.grad_fn = from->grad_fn;
  m.output_nr = from->output_nr;
}

}  // namespace loom::autograd

// autograd/engine.cpp — nodes, tensor autograd state, grad mode, leaf accumulation and the
// backward engine.
//
// Note [The backward engine]
// 1. From the roots, walk the graph once to count, for every node, how many edges lead into it
//    (its dependencies).
// 2. Seed the roots' gradients. A node is ready when all its dependencies have delivered; ready
//    nodes run newest first (highest sequence number), as in PyTorch.
// 3. Running a node: gradients that never arrived become zeros; retained non-leaf grads are
//    stored; the node's backward runs; without retain_graph its saved tensors are freed at once
//    (the graph is freed as it goes). Each gradient it returns is reduced to the shape of the
//    input it belongs to (the one place where broadcast gradients are summed back; see
//    reduce_to_input) and added into the next node's buffer.
// 4. Leaves are reached through AccumulateGrad nodes, which add into .grad and then fire the
//    leaf's post-accumulate hooks (the DDP reducer's entry point).

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "autograd/function.h"
#include "autograd/graph.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/memory_limit.h"
#include "tensor/reduce.h"
#include "tensor/view.h"

namespace loom::autograd {

// ---------------------------------------------------------------- nodes and tensor state

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
thread_local bool grad_mode = true;
// The callbacks of the backward pass running on this thread (null when none runs).
thread_local std::vector<std::function<void()>>* final_callbacks = nullptr;
}  // namespace

bool backward_running() { return final_callbacks != nullptr; }

void queue_callback(std::function<void()> fn) {
  LOOM_CHECK(final_callbacks != nullptr, AutogradError,
             "queue_callback: no backward pass is running on this thread");
  final_callbacks->push_back(std::move(fn));
}

Node::Node(std::string name, std::vector<Edge> next_edges, std::vector<TensorMeta> outputs)
    : name_(std::move(name)),
      sequence_nr_(next_sequence_nr.fetch_add(1)),
      next_edges_(std::move(next_edges)),
      outputs_(std::move(outputs)) {}

bool grad_enabled() { return grad_mode; }
void set_grad_enabled(bool enabled) { grad_mode = enabled; }

AutogradMeta& meta(const Tensor& t) {
  TensorImpl* impl = t.unsafe_impl();
  LOOM_CHECK(impl != nullptr, ValueError, "autograd: use of an undefined tensor");
  if (!impl->autograd) impl->autograd = std::make_shared<AutogradMeta>();
  return *impl->autograd;
}

AutogradMeta* meta_or_null(const Tensor& t) {
  TensorImpl* impl = t.unsafe_impl();
  return impl ? impl->autograd.get() : nullptr;
}

TensorMeta tensor_meta(const Tensor& t) { return {t.sizes(), t.dtype(), t.device()}; }

// Adds incoming gradients into a leaf's .grad, then fires its post-accumulate hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf)
      : Node("AccumulateGrad", {}, {tensor_meta(leaf)}), leaf_(leaf.impl_ptr()) {}

  std::vector<Tensor> apply(std::vector<Tensor> grads) override {
    Tensor leaf(leaf_);
    AutogradMeta& m = meta(leaf);
    Tensor& incoming = grads[0];
    if (!m.grad.defined()) {
      // .grad is dense in the leaf's memory format (PyTorch's layout contract: a channels-last
      // leaf gets a channels-last gradient). Keep the incoming gradient when it already is and
      // nothing else can see it (no other handle, no other view of its storage, e.g. the
      // caller's own gradient tensor passed through); copy otherwise.
      const MemoryFormat format = suggest_memory_format(leaf);
      const bool owned = has_memory_format(incoming, format) &&
                         incoming.impl_ptr().use_count() == 1 &&
                         incoming.storage().use_count() == 1 &&
                         incoming.numel() * static_cast<int64_t>(incoming.itemsize()) ==
                             static_cast<int64_t>(incoming.storage()->nbytes);
      if (owned) {
        m.grad = kernels::alias(incoming);
      } else {
        m.grad = empty(incoming.sizes(), incoming.dtype(), incoming.device(), format);
        kernels::copy_(m.grad, incoming);
      }
    } else {
      // In place: .grad may be a view into a DDP bucket, which must see the sum.
      kernels::add_(m.grad, incoming);
    }
    for (auto& [id, hook] : m.post_accumulate_hooks) hook(leaf);
    return {};
  }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta_or_null(t);
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  std::shared_ptr<Node> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

// ---------------------------------------------------------------- the engine

namespace {

// The one place where a gradient is made to match the tensor it belongs to: a gradient that
// kept a broadcast shape is summed over the broadcast dims (16-bit ones in float32, as the
// float32 class of Note [Autocast policy] sums); its dtype is converted.
Tensor reduce_to_input(Tensor grad, const TensorMeta& input, const std::string& node_name) {
  if (grad.sizes() != input.shape) {
    LOOM_CHECK(shape_numel(input.shape) == 0 ||
                   broadcast_shapes(input.shape, grad.sizes(), "backward") == grad.sizes(),
               InternalError, "backward: ", node_name,
               " returned a gradient of shape=", grad.sizes(),
               " for an input of shape=", input.shape);
    grad = kernels::sum_to(kernels::widened(grad), input.shape);  // a 16-bit sum in float32
  }
  if (grad.dtype() != input.dtype) grad = kernels::to_dtype(grad, input.dtype);
  return grad;
}

// The sum of two gradients of one tensor (16-bit ones add in float and round once, Note
// [16-bit arithmetic]).
Tensor accumulate(const Tensor& a, const Tensor& b) { return kernels::add(a, b); }

struct NewestFirst {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph) {
  LOOM_CHECK(roots.size() == grad_roots.size(), ValueError, "backward: ", roots.size(),
             " tensors but ", grad_roots.size(), " gradients");
  NoGradGuard no_grad;  // backward computes with kernels; nothing it does is recorded
  // Callbacks belong to the outermost pass: a nested one (a checkpointed segment recomputed,
  // Note [Activation checkpointing]) runs inside it, and a hook that queues "after backward"
  // during the nested pass means the end of the whole backward.
  std::vector<std::function<void()>> callbacks;
  const bool outermost = final_callbacks == nullptr;
  struct CallbackScope {  // this pass's callback list while it runs
    std::vector<std::function<void()>>* saved;
    CallbackScope(std::vector<std::function<void()>>* mine, bool outermost)
        : saved(final_callbacks) {
      if (outermost) final_callbacks = mine;
    }
    ~CallbackScope() { final_callbacks = saved; }
  } callback_scope(&callbacks, outermost);

  // Seed: one gradient per root, into the root's edge.
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::vector<std::shared_ptr<Node>> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    LOOM_CHECK(
        root.requires_grad(), AutogradError,
        "backward: the tensor does not require grad and has no grad_fn; got shape=", root.sizes());
    Tensor seed = grad_roots[i];
    if (!seed.defined()) {
      LOOM_CHECK(root.numel() == 1, AutogradError,
                 "backward: grad can be implicitly created only for scalar outputs; got shape=",
                 root.sizes(), " (pass a gradient of the same shape)");
      seed = ones(root.sizes(), root.dtype(), root.device());
    }
    LOOM_CHECK(seed.sizes() == root.sizes(), ShapeError, "backward: gradient shape=", seed.sizes(),
               " does not match tensor shape=", root.sizes());
    if (seed.dtype() != root.dtype()) seed = kernels::to_dtype(seed, root.dtype());  // as PyTorch
    Edge edge = gradient_edge(root);
    auto& buffer = buffers[edge.node.get()];
    buffer.resize(edge.node->outputs().size());
    Tensor& slot = buffer[edge.input_nr];
    slot = slot.defined() ? accumulate(slot, seed) : seed;
    root_nodes.push_back(edge.node);
  }

  // Count dependencies: edges into each node from nodes reachable from the roots.
  std::unordered_map<Node*, int> dependencies;
  {
    std::vector<Node*> stack;
    std::unordered_map<Node*, bool> seen;
    for (auto& n : root_nodes)
      if (!seen[n.get()]) {
        seen[n.get()] = true;
        stack.push_back(n.get());
      }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges()) {
        if (!e.valid()) continue;
        ++dependencies[e.node.get()];
        if (!seen[e.node.get()]) {
          seen[e.node.get()] = true;
          stack.push_back(e.node.get());
        }
      }
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, NewestFirst> ready;
  {
    std::unordered_map<Node*, bool> queued;
    for (auto& n : root_nodes)
      if (dependencies[n.get()] == 0 && !queued[n.get()]) {
        queued[n.get()] = true;
        ready.push(n.get());
      }
  }

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    const AllocationLabel label("in the backward of ", node->name().c_str());
    std::vector<Tensor> grads = std::move(buffers[node]);
    buffers.erase(node);
    grads.resize(node->outputs().size());
    const auto& edges = node->next_edges();
    if (std::none_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); })) {
      // Nothing flowed into this node (every path to it carried no gradient): skip it, so a
      // leaf that received nothing keeps .grad untouched and fires no hook.
      if (!retain_graph) node->release();
      for (const Edge& e : edges)
        if (e.valid() && --dependencies[e.node.get()] == 0) ready.push(e.node.get());
      continue;
    }
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) {
        const TensorMeta& m = node->outputs()[k];
        grads[k] = zeros(m.shape, is_floating(m.dtype) ? m.dtype : kFloat32, m.device);
      }
    }
    for (auto& [k, weak] : node->retained) {
      if (auto impl = weak.lock()) {
        AutogradMeta& m = meta(Tensor(impl));
        m.grad = m.grad.defined() ? accumulate(m.grad, grads[k]) : kernels::clone(grads[k]);
      }
    }
    std::vector<Tensor> next_grads = node->apply(std::move(grads));
    if (!retain_graph) node->release();

    LOOM_ASSERT(next_grads.size() == edges.size() || edges.empty(), "backward: ", node->name(),
                " returned ", next_grads.size(), " gradients for ", edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      Node* next = e.node.get();
      if (next_grads[i].defined()) {
        Tensor g =
            reduce_to_input(std::move(next_grads[i]), next->outputs()[e.input_nr], node->name());
        auto& buffer = buffers[next];
        buffer.resize(next->outputs().size());
        Tensor& slot = buffer[e.input_nr];
        slot = slot.defined() ? accumulate(slot, g) : std::move(g);
      }
      if (--dependencies[next] == 0) ready.push(next);
    }
  }
  for (size_t i = 0; i < callbacks.size(); ++i) {  // a callback may queue another (only the
                                                   // outermost pass has any)
    std::function<void()> fn = std::move(callbacks[i]);
    fn();
  }
}

}  // namespace loom::autograd

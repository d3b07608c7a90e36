// autograd/graph.h — the backward graph: nodes, edges, the autograd state a tensor carries,
// and grad mode. A differentiable op records one Node per call (see autograd/function.h); the
// engine (autograd/engine.cpp) walks the nodes from the loss back to the leaves.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

class Node;

// Where a gradient goes: input `input_nr` of `node` (that is, output input_nr of the forward
// op whose backward `node` is). An edge with no node leads nowhere (an input without grad).
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// What a node needs to know about each of its forward outputs: to make a zero gradient when
// nothing flowed back into one, and to reduce a broadcast gradient to its shape.
struct TensorMeta {
  Shape shape;
  DType dtype = kFloat32;
  Device device;
};

class Node {
 public:
  Node(std::string name, std::vector<Edge> next_edges, std::vector<TensorMeta> outputs);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grads: one per forward output (zeros where nothing flowed). Returns one gradient per next
  // edge (undefined where the edge leads nowhere or the input gets no gradient).
  virtual std::vector<Tensor> apply(std::vector<Tensor> grads) = 0;
  // Frees saved tensors once backward has used them (unless retain_graph).
  virtual void release() {}

  const std::string& name() const { return name_; }
  // Creation order; the engine runs ready nodes newest first, the order PyTorch uses, so
  // gradients reach the leaves in roughly reverse registration order (what DDP buckets expect).
  uint64_t sequence_nr() const { return sequence_nr_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  const std::vector<TensorMeta>& outputs() const { return outputs_; }

  // Non-leaf tensors that asked for retain_grad(): output index -> the tensor (weakly held).
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained;

 private:
  std::string name_;
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
  std::vector<TensorMeta> outputs_;
};

// The autograd slot of a TensorImpl. Created lazily: plain tensors have none.
struct AutogradMeta {
  bool requires_grad = false;  // set on leaves by requires_grad_()
  Tensor grad;
  std::shared_ptr<Node> grad_fn;         // null for leaves
  uint32_t output_nr = 0;                // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;  // leaves: the AccumulateGrad node, created on use
  bool is_view = false;  // a view of a tensor that requires grad (in-place on it is refused)
  std::vector<std::pair<int, PostAccumulateHook>> post_accumulate_hooks;
  int next_hook_id = 0;
};

// The slot of t, created when absent.
AutogradMeta& meta(const Tensor& t);
// The slot of t, or null.
AutogradMeta* meta_or_null(const Tensor& t);

// The edge a gradient for t should follow: its grad_fn, or its leaf accumulator, or nothing.
Edge gradient_edge(const Tensor& t);

TensorMeta tensor_meta(const Tensor& t);

// Grad mode: when off, ops record nothing (inference, optimizer steps, backward itself).
bool grad_enabled();
void set_grad_enabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

class EnableGradGuard {
 public:
  explicit EnableGradGuard(bool enabled = true) : previous_(grad_enabled()) {
    set_grad_enabled(enabled);
  }
  ~EnableGradGuard() { set_grad_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// Runs backward from `roots`, seeding each with the matching gradient (undefined: ones, allowed
// only for one-element roots). Gradients accumulate into the .grad of the leaves reached.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph = false);

// Runs `fn` once the backward pass now running on this thread has processed its whole graph,
// just before backward() returns (callbacks in the order queued; one that throws ends backward
// with its exception). For hooks that must act after the last gradient arrived: the DDP reducer
// waits for its buckets here. During a nested backward (a checkpointed segment's recomputation)
// it is the outermost pass's end. AutogradError when no backward is running.
void queue_callback(std::function<void()> fn);
// True while a backward pass runs on this thread (a checkpointed segment's recomputation runs
// its forward then).
bool backward_running();

}  // namespace loom::autograd

namespace loom {
using autograd::EnableGradGuard;
using autograd::NoGradGuard;
}  // namespace loom

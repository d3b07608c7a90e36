// autograd/checkpoint.h — activation checkpointing: a segment of the forward pass that keeps
// only its inputs and recomputes the rest during backward, trading one more forward of the
// segment for its activations (PyTorch's torch.utils.checkpoint, the reentrant variant).
//
// Note [Activation checkpointing]
// 1. Forward: fn runs under no-grad on detached inputs, so none of its intermediate tensors is
//    kept; one node ("checkpoint") is recorded whose inputs are the segment's inputs. The random
//    generator's state and the autocast region are noted.
// 2. Backward, when the engine reaches that node: fn runs again on fresh leaves holding the same
//    inputs, with grad on, the noted generator state (the same dropout masks) and the noted
//    autocast region, so every recomputed tensor equals the first one to the bit. Then a nested
//    backward runs from the recomputed outputs with the incoming gradients: the parameters fn
//    uses get their gradients accumulated into .grad as in a pass without checkpointing (their
//    post-accumulate hooks fire, so DDP's reducer sees them as usual), and the leaves' gradients
//    are the node's gradients for the inputs.
// 3. Callbacks that hooks queue during the nested backward (DDP's end-of-backward wait) run
//    when the outer backward ends, not the nested one (autograd::queue_callback).
// Gradients are the same to the bit as without checkpointing when each input's gradient is a
// sum of at most two parts inside the segment (a Transformer block: the residual and the
// branch), since two floats add the same in either order. Modules that change state in forward
// (BatchNorm's running statistics) change it twice; keep them out of checkpointed segments.
// When no input requires grad, the node still hangs on a zero-size leaf of its own, so that the
// parameters inside the segment get their gradients.
#pragma once

#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

using SegmentFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Runs fn(inputs) under Note [Activation checkpointing]: outside grad mode it is just fn(inputs).
// The outputs must be floating-point tensors; fn must be deterministic given the generator state.
std::vector<Tensor> checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs);
// One input, one output.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

}  // namespace loom::autograd

namespace loom {
using autograd::checkpoint;
}

// autograd/autocast.h — automatic mixed precision: inside an autocast region the matrix
// products run in float16 or bfloat16, the elementwise ops and batch norm keep their inputs'
// dtype (on GPUs; the CPU widens them), and sums, losses and normalisations over many
// elements run in float32, while the parameters stay float32 (the master weights). The ops'
// entries in autograd/autocast_ops.cpp ask this header how to cast their inputs; the casts are
// recorded like any op, so gradients flow back through them in the parameter's dtype.
//
//   {
//     loom::autocast::Guard amp(loom::kBFloat16);
//     loss = loom::cross_entropy(model->forward(x), y);  // convs in bf16, the loss in float32
//   }
//   loss.backward();  // parameters' gradients arrive in float32
//
// Note [Autocast policy]
//   Every differentiable op belongs to one of three classes. The table is the whole policy, and
//   autograd/autocast_ops.cpp applies it, in one place: there each op's entry (the function
//   callers call) casts its operands by its class's rule, grouped as in the table, and calls
//   the op's body (autograd/ops/bodies.h), which computes in the dtypes it is given.
//
//   | class          | ops                                                | inside a region     |
//   |----------------|----------------------------------------------------|---------------------|
//   | low precision  | matmul, bmm, addmm, linear, conv2d,                | float32 inputs are  |
//   |                | scaled_dot_product_attention (a float mask too)    |                     |
//   |                |                                                    | cast to the region's|
//   |                |                                                    | dtype; the output   |
//   |                |                                                    | is 16-bit           |
//   | float32        | pow, exp, log, sqrt, rsqrt, reductions (sum, mean, | 16-bit inputs are   |
//   |                | var, std, amax, amin, max, min, argmax, argmin,    | widened to float32; |
//   |                | logsumexp), softmax, log_softmax, cross_entropy,   | the output is       |
//   |                | nll_loss, mse_loss, layer_norm, pooling (max, avg, | float32             |
//   |                | adaptive avg), dropout, gather, index_select,      |                     |
//   |                | scatter_add (their backwards add), cat and stack   |                     |
//   |                | when their inputs' dtypes differ                   |                     |
//   | as is          | the other elementwise ops (add, sub, mul, div,     | run in their inputs'|
//   |                | neg, abs, relu, gelu, tanh, sigmoid, clamp,        | dtype (promoted     |
//   |                | maximum, minimum, where, comparisons, the scalar   | when they differ),  |
//   |                | operators), batch_norm and SyncBatchNorm (float32  | a 16-bit one        |
//   |                | parameters and statistics), views (view, reshape,  | computed in float   |
//   |                | permute, ...), clone, contiguous, to, cat and      |                     |
//   |                | stack of one dtype                                 |                     |
//
//   On the CPU the arithmetic of the "as is" class (its elementwise ops, batch_norm of a
//   float16 x, and SyncBatchNorm) is widened like the float32 class; the comparisons, views and
//   copies, which compute nothing, are not. The CPU has no 16-bit arithmetic to gain from 16-bit
//   activations (its 16-bit products widen to float32 too, Note [16-bit products on the CPU]),
//   and an op that widens its operands into float32 copies pays a widening and a rounding pass.
//   batch_norm of a bfloat16 x is the exception: its CPU loops read and write bfloat16 as it is
//   (Note [Batch norm on bfloat16] in tensor/cpu/norm.cpp), so, as on a GPU, the activations
//   between two convolutions stay bfloat16 and move half the bytes, with no casts around the
//   convolutions; with it the bf16 ResNet-18 step took 0.94 of its time (docs/decisions.md,
//   Mixed precision, has the measurements). A GPU reads half the bytes for every op of the
//   class, which is the point of it.
//   batch_norm also widens x where a parameter or statistic is 16-bit; SyncBatchNorm (in dist/,
//   above autograd, so its rule is the named function sync_batch_norm_input below) refuses
//   16-bit ones. cat and stack widen the 16-bit operands of mixed dtypes; the join then
//   promotes the rest as outside a region (float32 with float64 gives float64).
//
//   embedding and one_hot take no 16-bit input (an index, and a float32 weight).
//   float64 tensors are never cast (as in PyTorch): a region changes only float32 and 16-bit
//   operands. Outside a region nothing is cast: the float32 class raises DTypeError for 16-bit
//   inputs, and the "as is" class computes them as inside one.
//
//   Why this split. A product's accuracy depends on its accumulator, not on its operands: the
//   16-bit products accumulate in float32 (tensor cores on GPUs; on CPUs without 16-bit dot
//   products, Note [16-bit products on the CPU] in tensor/linalg.cpp). Sums of many terms
//   (reductions, softmax's normaliser, a layer norm's variance, a loss) lose digits in 16 bits
//   and float16 overflows at 65504, so they run in float32, as do exp, log and pow, whose
//   results leave float16's range easily. An elementwise op computes each element in float and
//   rounds it once (Note [16-bit arithmetic] in tensor/cuda/float16.h), so running it on 16-bit
//   storage loses nothing the next product would not round away anyway; batch norm sums its
//   statistics in double whatever x's dtype. Keeping these ops 16-bit is what PyTorch's CUDA
//   table does, and it matters: between two convolutions of a ResNet, batch norm, ReLU and the
//   residual add then read and write 2-byte activations, with no cast kernels between them.
//   A float32 class of these ops would move about three times the bytes (a widening cast, the
//   float32 op, a narrowing cast for the next convolution), a cost the GPU cannot hide.

// Note [The cast cache]
//   A parameter used by several products in one region (a tied embedding, a weight used in a
//   loop, the same model run twice) is cast once: casts of leaf tensors that require grad are
//   kept until the outermost region ends, keyed by the parameter and checked against its
//   version, so an in-place update inside the region is never served stale. Activations are
//   not cached: each is used once. The cached cast is a node of the graph, so its gradient,
//   summed over every use, reaches the parameter in float32. A convolution's weight is cast
//   straight into its input's memory format (keyed by it too): for a channels-last input the
//   16-bit weight is then already in the KRSC order that cuDNN's NHWC kernels read, so neither
//   the forward nor the backward-data call copies it again.
#pragma once

#include <cstddef>

#include "tensor/tensor.h"

namespace loom::autocast {

// Enters a region (dtype float16 or bfloat16; ValueError otherwise) or, with enabled = false, a
// region where nothing is cast. Regions nest; the previous state returns when the guard dies,
// and the cast cache is cleared when the outermost region ends.
class Guard {
 public:
  explicit Guard(DType dtype = kBFloat16, bool enabled = true);
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  bool previous_enabled_;
  DType previous_dtype_;
};

bool is_enabled();
DType dtype();  // the region's low-precision dtype (bfloat16 outside any region)
// Casts kept by the cache now (Note [The cast cache]); for tests and reports.
size_t cached_casts();

// For the low-precision class: true when a region is active and some defined operand is float32
// or of the other 16-bit type; to_low casts such an operand to the region's dtype (others are
// returned as they are).
bool needs_low(std::initializer_list<Tensor> operands);
Tensor to_low(const Tensor& x);
// The same, stored in `format`: conv2d casts its weight into its input's format (for a
// channels-last input the KRSC order cuDNN's NHWC kernels read) in the one cast kernel.
Tensor to_low(const Tensor& x, MemoryFormat format);

// For the float32 class: true when a region is active and some defined operand is 16-bit;
// to_float32 widens such an operand (others are returned as they are).
bool needs_float32(std::initializer_list<Tensor> operands);
// For the "as is" class: true when a region is active and some defined operand is a 16-bit CPU
// tensor; the op then widens its operands with to_float32, as the float32 class (Note [Autocast
// policy], "On the CPU").
bool widens_on_cpu(std::initializer_list<Tensor> operands);
Tensor to_float32(const Tensor& x);

// SyncBatchNorm's x (dist/sync_batchnorm.cpp) as its forward takes it: batch_norm's rule for x,
// widened in a region where it is a 16-bit CPU tensor (Note [Autocast policy]). Defined with the
// other ops' rules in autograd/autocast_ops.cpp.
Tensor sync_batch_norm_input(const Tensor& x);

}  // namespace loom::autocast

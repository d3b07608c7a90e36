// dist/zero.h — ZeRO stages 1 and 2 on top of DDP's reducer: ZeroRedundancyOptimizer, which
// keeps and updates only this rank's shard of the optimizer state (and, in stage 2, of the
// gradients), then all-gathers the updated parameters. Stage 3, the parameters sharded too, is
// FullyShardedDataParallel.
//
// Note [ZeRO stages]
// Psi parameters, N ranks, K bytes of optimizer state a parameter (Adam: m and v, K = 8 in
// float32; with 16-bit training also a float32 master copy, K = 12). The ZeRO paper's three
// partitions, and each rank's bytes of model states (weights + gradients + optimizer state):
//
//                                        float32                  16-bit + float32 master
//   DDP                                  (4 + 4 + 8) Psi = 16 Psi  (2 + 2 + K) Psi = 16 Psi
//   stage 1, P_os: optimizer state       8 Psi + 8 Psi / N         4 Psi + K Psi / N
//   stage 2, P_os+g: + gradients         4 Psi + 12 Psi / N        2 Psi + (2 + K) Psi / N
//   stage 3, P_os+g+p: + parameters      16 Psi / N                16 Psi / N
//
// The layout is the reducer's (Note [The bucketed reducer]): each bucket is one flat buffer,
// padded to a multiple of N, and rank r owns piece r of every bucket, numel / N elements. So
// that the pieces are the parameters' own memory, ZeroRedundancyOptimizer moves every parameter
// into a flat buffer laid out as its bucket's gradients are (each parameter a view of it, as
// FSDP's flat parameters; Tensor::set_data keeps the parameter's identity).
// One step, per rank:
//   1. backward: each bucket is reduce-scattered as soon as it is full (the overlap of DDP, at
//      half the bytes of an allreduce): rank r receives piece r of the gradients' sum;
//   2. step: the wrapped optimizer updates the pieces of the parameters this rank owns, with
//      its state for those pieces only (K Psi / N bytes): any optimizer whose update is
//      elementwise (SGD, Adam, AdamW) gives exactly the update of the whole parameter;
//   3. each bucket's parameters are all-gathered in place: every rank has every weight again.
// Traffic per step (Note [Bytes moved]): a reduce-scatter and an all-gather of Psi elements,
// 2 (N-1)/N Psi each rank, the bytes of DDP's allreduce. Stage 1 keeps the full gradient
// buffers (4 Psi) and reduces into piece r of them; stage 2 frees each bucket's buffer once its
// reduce-scatter completed and keeps only the pieces (4 Psi / N), and the parameters' .grad stay
// undefined after backward. Unlike PyTorch's ZeroRedundancyOptimizer, which partitions whole
// parameters (balanced by bytes only approximately) and broadcasts them from their owners
// (an allreduce and a broadcast a step, 1.5 times DDP's bytes), the pieces cut across
// parameters, as DeepSpeed's and FSDP's flat partitions do: they balance exactly (up to N - 1
// elements of padding a bucket).
//
// Note [ZeRO with a 16-bit model]
// A model whose parameters are bfloat16 or float16 (gpt_train and resnet18_cifar convert it so
// with --zero 1 or 2 --amp bf16) keeps 16-bit flat buffers and buckets: its gradients are
// reduce-scattered in 16 bits. Each piece then gets a float32 master copy, and the wrapped
// optimizer updates the masters: at the step each master's gradient is its run of the shard
// widened, and after the update the master is rounded into the 16-bit piece, which the
// all-gather spreads. Per rank that is the ZeRO paper's 16-bit column: 2 Psi of weights, 2 Psi
// (stage 1) or 2 Psi / N (stage 2) of gradients, 12 Psi / N of optimizer state (the masters and
// Adam's m and v). params() are the masters, so checkpoints keep float32 weights; a GradScaler
// would unscale the masters' gradients before the step widens them: bfloat16 needs none.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "optim/optimizer.h"

namespace loom::dist {

struct ZeroOptions {
  int stage = 1;  // 1: optimizer state sharded; 2: and gradients (Note [ZeRO stages])
};

// One run of a parameter's elements that this rank updates: elements [param_offset,
// param_offset + numel) of parameter `param` (in memory order), which lie at `shard_offset` in
// the shard of bucket `bucket`.
struct ShardPiece {
  size_t param = 0;
  size_t bucket = 0;
  int64_t param_offset = 0, shard_offset = 0, numel = 0;
};

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  // Builds the optimizer of this rank's pieces: 1-D float tensors, leaves that require grad;
  // param_index[k] is the parameter (an index into ddp.reducer().params()) piece k belongs to,
  // so that per-parameter options (weight decay on the matrices only) carry over.
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(
      std::vector<Tensor> pieces, const std::vector<size_t>& param_index)>;

  // Shards ddp's gradients (Reducer::shard_gradients) and moves its parameters into flat
  // buffers. Call before the first backward. ValueError for a stage other than 1 or 2, a model
  // whose ranks differ (verified when ddp was made) or an empty factory.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, Factory make, ZeroOptions options = {});

  // Steps 2 and 3 of Note [ZeRO stages]; the inner optimizer runs at this optimizer's lr.
  void step() override;
  // The model's gradients (what backward accumulates into); the pieces' are overwritten by the
  // next backward's reduce-scatter.
  void zero_grad(bool set_to_none = true) override;
  // clip_grad_norm_ over the whole model: each rank's pieces hold disjoint parts of the averaged
  // gradient, so the squares are summed over ranks (an allreduce of one float64). Returns the
  // total norm before clipping, as optim::clip_grad_norm_.
  double clip_grad_norm_(double max_norm);

  int stage() const { return options_.stage; }
  Reducer& reducer() { return reducer_; }
  optim::Optimizer& inner() { return *inner_; }
  const optim::Optimizer& inner() const { return *inner_; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  // Elements of the parameters this rank updates (its pieces; padding excluded).
  int64_t shard_numel() const;
  // Note [ZeRO with a 16-bit model]: whether the pieces have float32 masters, and their bytes.
  bool has_master_copy() const { return !runs_.empty(); }
  int64_t master_bytes() const;
  // Per bucket: elements, padding and this rank's piece; the pieces of each parameter.
  std::string plan() const;

  double momentum() const override { return inner_->momentum(); }
  void set_momentum(double momentum) override { inner_->set_momentum(momentum); }
  // A rank's own state alone cannot make a checkpoint: NotImplementedError pointing to
  // save_sharded_checkpoint (dist/sharded_checkpoint.h), which every rank calls.
  void save_state(NamedTensors& tensors, optim::Metadata& meta,
                  const std::string& prefix) const override;
  void load_state(const SafetensorsFile& file, const std::string& prefix) override;

 protected:
  std::vector<std::string> buffer_names() const override { return {}; }
  optim::Metadata hyper_parameters() const override { return {}; }

 private:
  struct Sharding {  // what the constructor sets up before the base class sees the pieces
    std::vector<Tensor> flat_params, piece_tensors;
    std::vector<Tensor> runs;  // a 16-bit model's pieces, whose masters piece_tensors are
    std::vector<ShardPiece> pieces;
  };
  static Sharding shard_model(DistributedDataParallel& ddp, const ZeroOptions& options);
  void attach_shard_grads();  // each piece's .grad: its run of its bucket's gradient shard
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, Factory make, ZeroOptions options,
                          Sharding sharding);

  Reducer& reducer_;
  ZeroOptions options_;
  std::vector<Tensor> flat_params_;  // per bucket: the parameters' memory
  std::vector<Tensor> runs_;         // a 16-bit model's pieces (params() are their masters)
  std::vector<ShardPiece> pieces_;
  std::unique_ptr<optim::Optimizer> inner_;
};

}  // namespace loom::dist

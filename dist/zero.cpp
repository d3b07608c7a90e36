// dist/zero.cpp — ZeroRedundancyOptimizer (Note [ZeRO stages], zero.h): the parameters moved
// into flat buffers laid out as their buckets, this rank's pieces of them, the step and the
// all-gather.
#include "dist/zero.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "autograd/graph.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/reduce.h"
#include "tensor/view.h"

namespace loom::dist {

namespace k = kernels;

ZeroRedundancyOptimizer::Sharding ZeroRedundancyOptimizer::shard_model(DistributedDataParallel& ddp,
                                                                       const ZeroOptions& options) {
  LOOM_CHECK(options.stage == 1 || options.stage == 2, ValueError,
             "ZeroRedundancyOptimizer: stage must be 1 (optimizer state sharded) or 2 (and "
             "gradients); got ",
             options.stage, ". Stage 3 shards the parameters too: FullyShardedDataParallel");
  Reducer& reducer = ddp.reducer();
  reducer.shard_gradients(options.stage);
  NoGradGuard no_grad;
  const int64_t world = reducer.group().size();
  const int64_t rank = reducer.group().rank();
  const std::vector<Tensor>& params = reducer.params();
  Sharding s;
  for (size_t b = 0; b < reducer.buckets().size(); ++b) {
    const Bucket& bucket = reducer.buckets()[b];
    const Tensor& first = params[bucket.params.front()];
    Tensor flat = zeros({bucket.numel}, bucket.dtype, first.device());
    const int64_t piece = bucket.numel / world, lo = rank * piece, hi = lo + piece;
    for (size_t pos = 0; pos < bucket.params.size(); ++pos) {
      const size_t i = bucket.params[pos];
      Tensor p = params[i];
      // The parameter's memory becomes its place in the flat buffer, stored as its gradient's
      // view in the bucket is (the same bytes in the same order).
      Tensor home =
          k::as_strided(flat, p.sizes(), format_strides(p.sizes(), suggest_memory_format(p)),
                        flat.offset() + bucket.offsets[pos]);
      k::copy_(home, p);
      p.set_data(home);
      // This rank's run of it, if any.
      const int64_t begin = bucket.offsets[pos], end = begin + p.numel();
      const int64_t from = std::max(begin, lo), to = std::min(end, hi);
      if (from >= to) continue;
      Tensor run = k::narrow(flat, 0, from, to - from);
      if (is_16bit_float(run.dtype())) {  // Note [ZeRO with a 16-bit model]
        s.runs.push_back(run);
        run = k::to_dtype(run, kFloat32);
      }
      run.requires_grad_(true);
      s.piece_tensors.push_back(run);
      s.pieces.push_back({.param = i,
                          .bucket = b,
                          .param_offset = from - begin,
                          .shard_offset = from - lo,
                          .numel = to - from});
    }
    s.flat_params.push_back(flat);
  }
  return s;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp, Factory make,
                                                 ZeroOptions options)
    : ZeroRedundancyOptimizer(ddp, std::move(make), options, shard_model(ddp, options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp, Factory make,
                                                 ZeroOptions options, Sharding sharding)
    : Optimizer("ZeroRedundancyOptimizer", sharding.piece_tensors, 0.0),
      reducer_(ddp.reducer()),
      options_(options),
      flat_params_(std::move(sharding.flat_params)),
      runs_(std::move(sharding.runs)),
      pieces_(std::move(sharding.pieces)) {
  LOOM_CHECK(static_cast<bool>(make), ValueError,
             "ZeroRedundancyOptimizer: the optimizer factory is empty");
  std::vector<size_t> owners;
  for (const ShardPiece& piece : pieces_) owners.push_back(piece.param);
  inner_ = make(params(), owners);
  LOOM_CHECK(inner_ != nullptr, ValueError, "ZeroRedundancyOptimizer: the factory returned null");
  LOOM_CHECK(inner_->params().size() == params().size(), ValueError,
             "ZeroRedundancyOptimizer: the factory's optimizer holds ", inner_->params().size(),
             " tensors; it must hold the ", params().size(), " pieces it was given");
  set_lr(inner_->lr());
  // The pieces' gradients are views of the reducer's shards for good, so that whatever reads
  // params()' gradients between backward and step (GradScaler::unscale_) sees them. Masters get
  // theirs after a backward (Note [ZeRO with a 16-bit model]).
  if (!has_master_copy()) attach_shard_grads();
}

void ZeroRedundancyOptimizer::attach_shard_grads() {
  NoGradGuard no_grad;
  const std::vector<Tensor>& runs = params();
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const ShardPiece& piece = pieces_[k];
    Tensor run = runs[k];
    const Tensor shard_run =
        k::narrow(reducer_.buckets()[piece.bucket].shard, 0, piece.shard_offset, piece.numel);
    // A master's gradient: the run widened, once per backward (clipping scales it in place).
    if (has_master_copy()) {
      if (!run.grad().defined() && shard_run.defined())
        run.set_grad(k::to_dtype(shard_run, kFloat32));
      continue;
    }
    run.set_grad(shard_run);
  }
}

void ZeroRedundancyOptimizer::step() {
  NoGradGuard no_grad;
  // Step 2: this rank's pieces, their gradients the reducer's averaged shard.
  attach_shard_grads();  // in case something dropped them
  inner_->set_lr(lr());
  inner_->step();
  // Note [ZeRO with a 16-bit model]: the masters rounded into the pieces; their gradients,
  // widened copies, go (the next backward's are widened anew).
  for (size_t k = 0; k < runs_.size(); ++k) {
    k::copy_(runs_[k], params()[k]);
    Tensor master = params()[k];
    master.set_grad(Tensor());
  }
  // Step 3: every rank's pieces to every rank, in place; all launched, then waited for.
  ProcessGroup& group = reducer_.group();
  std::vector<std::shared_ptr<Work>> works;
  for (const Tensor& flat : flat_params_) {
    const int64_t piece = flat.numel() / group.size();
    works.push_back(
        group.allgather_into_tensor(flat, k::narrow(flat, 0, group.rank() * piece, piece)));
  }
  for (auto& work : works) work->wait();
  for (const Tensor& flat : flat_params_) flat.bump_version();
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  if (has_master_copy())  // widened copies of the last backward's: dropped either way
    for (Tensor master : params()) master.set_grad(Tensor());
  for (Tensor p : reducer_.params()) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      k::fill_(g, 0.0);
  }
}

double ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm) {
  LOOM_CHECK(std::isfinite(max_norm) && max_norm > 0, ValueError,
             "ZeroRedundancyOptimizer::clip_grad_norm_: max_norm must be positive; got ", max_norm);
  NoGradGuard no_grad;
  attach_shard_grads();
  std::vector<Tensor> grads;
  for (const Tensor& run : params()) grads.push_back(run.grad());
  double local = 0;
  for (const Tensor& g : grads) {
    const double n = k::sum(k::mul(k::to_dtype(g, kFloat64), k::to_dtype(g, kFloat64))).item();
    local += n;
  }
  ProcessGroup& group = reducer_.group();
  const Device device = flat_params_.empty() ? kCPU : flat_params_.front().device();
  Tensor squares = full({1}, local, kFloat64, device);
  group.allreduce(squares, ReduceOp::Sum)->wait();
  const double total = std::sqrt(squares.item());
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1)
    for (Tensor& g : grads) k::mul_scalar_(g, coefficient);
  return total;
}

int64_t ZeroRedundancyOptimizer::master_bytes() const {
  int64_t bytes = 0;
  if (has_master_copy())
    for (const Tensor& master : params()) bytes += static_cast<int64_t>(master.nbytes());
  return bytes;
}

int64_t ZeroRedundancyOptimizer::shard_numel() const {
  int64_t n = 0;
  for (const ShardPiece& piece : pieces_) n += piece.numel;
  return n;
}

std::string ZeroRedundancyOptimizer::plan() const {
  std::ostringstream out;
  const ProcessGroup& group = reducer_.group();
  int64_t total = 0;
  for (const Tensor& flat : flat_params_) total += flat.numel();
  char line[240];
  std::snprintf(
      line, sizeof line,
      "ZeRO-%d: %zu buckets, %lld elements with padding; rank %d of %d updates %lld "
      "of them in %zu pieces, with %s%s\n",
      options_.stage, flat_params_.size(), static_cast<long long>(total), group.rank(),
      group.size(), static_cast<long long>(shard_numel()), pieces_.size(), inner_->name().c_str(),
      has_master_copy()
          ? detail::str(" over float32 masters of ", runs_.front().dtype(), " pieces").c_str()
          : "");
  out << line;
  const std::vector<std::string>& names = reducer_.names();
  for (size_t b = 0; b < flat_params_.size(); ++b) {
    const int64_t piece = flat_params_[b].numel() / group.size();
    std::snprintf(line, sizeof line, "  bucket %zu: %lld elements, piece %lld .. %lld\n", b,
                  static_cast<long long>(flat_params_[b].numel()),
                  static_cast<long long>(group.rank() * piece),
                  static_cast<long long>((group.rank() + 1) * piece));
    out << line;
    for (const ShardPiece& p : pieces_) {
      if (p.bucket != b) continue;
      std::snprintf(line, sizeof line, "    %-40s elements %lld .. %lld\n", names[p.param].c_str(),
                    static_cast<long long>(p.param_offset),
                    static_cast<long long>(p.param_offset + p.numel));
      out << line;
    }
  }
  return out.str();
}

void ZeroRedundancyOptimizer::save_state(NamedTensors&, optim::Metadata&,
                                         const std::string&) const {
  throw NotImplementedError(
      "ZeroRedundancyOptimizer: its optimizer state is sharded across the ranks: save it with "
      "save_sharded_checkpoint (dist/sharded_checkpoint.h), which every rank calls");
}

void ZeroRedundancyOptimizer::load_state(const SafetensorsFile&, const std::string&) {
  throw NotImplementedError(
      "ZeroRedundancyOptimizer: its optimizer state is sharded across the ranks: load it with "
      "load_sharded_checkpoint (dist/sharded_checkpoint.h), which every rank calls");
}

}  // namespace loom::dist

// dist/fsdp.cpp — FullyShardedDataParallel (Note [FSDP units], fsdp.h): units and their flat
// shards, the gathers around forward and backward, the reduce-scatters of the gradients.
#include "dist/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "autograd/function.h"
#include "autograd/graph.h"
#include "dist/ddp.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/reduce.h"
#include "tensor/storage.h"
#include "tensor/view.h"

namespace loom::dist {

namespace k = kernels;

bool transformer_block_or_resnet_stage(const std::string& name, const nn::Module& module) {
  if (module.type_name() == "GPT2Block") return true;
  const std::string leaf = name.substr(name.rfind('.') + 1);
  return module.type_name() == "Sequential" && leaf.size() == 6 && leaf.starts_with("layer") &&
         leaf[5] >= '1' && leaf[5] <= '4';
}

namespace {

// A parameter's place in a flat buffer, stored as the parameter is (dense, row-major or
// channels-last), as the reducer's bucket views.
Tensor home_in(const Tensor& flat, const Tensor& p, int64_t offset) {
  return k::as_strided(flat, p.sizes(), format_strides(p.sizes(), suggest_memory_format(p)),
                       flat.offset() + offset);
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(nn::ModulePtr module,
                                                   std::shared_ptr<ProcessGroup> group,
                                                   FSDPOptions options)
    : nn::Module("FullyShardedDataParallel"),
      module_(register_module("module", std::move(module))),
      group_(std::move(group)),
      options_(std::move(options)) {
  LOOM_CHECK(group_ != nullptr, ValueError, "FullyShardedDataParallel: the process group is null");
  LOOM_CHECK(static_cast<bool>(options_.units), ValueError,
             "FullyShardedDataParallel: the unit policy is empty");
  NoGradGuard no_grad;
  // Every replica is the same model and starts from rank 0's state.
  const NamedTensors state = module_->state_dict();
  verify_replicas(*group_, state);
  std::vector<Tensor> tensors;
  for (const auto& [name, t] : state) tensors.push_back(t);
  if (group_->size() > 1) broadcast_coalesced(*group_, tensors, 0);

  // Units: the modules the policy picks (none inside another), then the root.
  std::vector<std::pair<std::string, nn::Module*>> picked;
  for (const auto& [name, m] : module_->named_modules()) {
    if (name.empty() || !options_.units(name, *m)) continue;
    for (const auto& [outer, unused] : picked)
      LOOM_CHECK(!name.starts_with(outer + "."), ValueError, "FullyShardedDataParallel: the unit ",
                 name, " lies inside the unit ", outer, "; units cannot nest");
    picked.emplace_back(name, m.get());
  }
  const NamedTensors named = module_->named_parameters();
  for (const auto& [name, p] : named)
    if (p.requires_grad()) {
      params_.push_back(p);
      names_.push_back(name);
    }
  units_.resize(picked.size() + 1);
  where_.assign(params_.size(), {0, 0});
  for (size_t u = 0; u < picked.size(); ++u) {
    units_[u].name = picked[u].first;
    units_[u].module = picked[u].second;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    size_t u = picked.size();  // the root unless a unit holds it
    for (size_t v = 0; v < picked.size(); ++v)
      if (names_[i].starts_with(picked[v].first + ".")) u = v;
    where_[i] = {u, units_[u].params.size()};
    units_[u].params.push_back(i);
  }
  for (size_t u = 0; u < picked.size(); ++u)
    LOOM_CHECK(!units_[u].params.empty(), ValueError, "FullyShardedDataParallel: the unit ",
               units_[u].name, " holds no parameter that requires grad");
  LOOM_CHECK(!picked.empty(), ValueError,
             "FullyShardedDataParallel: the unit policy picked no module of ", module_->type_name(),
             "; give FSDPOptions::units a policy that names its blocks");

  // Flat buffers, shards, pieces (Note [FSDP units], step 1).
  const int64_t world = group_->size(), rank = group_->rank();
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (unit.params.empty()) continue;  // a root without parameters
    int64_t numel = 0;
    for (size_t i : unit.params) {
      unit.offsets.push_back(numel);
      numel += params_[i].numel();
    }
    unit.numel = (numel + world - 1) / world * world;
    const Tensor& first = params_[unit.params.front()];
    LOOM_CHECK(is_floating(first.dtype()), DTypeError, "FullyShardedDataParallel: parameter ",
               names_[unit.params.front()], " is ", first.dtype());
    // The parameters' values in their own dtype first: the shard keeps them unrounded.
    Tensor master = zeros({unit.numel}, first.dtype(), first.device());
    for (size_t pos = 0; pos < unit.params.size(); ++pos) {
      const Tensor& p = params_[unit.params[pos]];
      LOOM_CHECK(p.dtype() == first.dtype(), DTypeError, "FullyShardedDataParallel: unit ",
                 unit.name.empty() ? "(root)" : unit.name, " mixes ", first.dtype(), " and ",
                 p.dtype(), " parameters (", names_[unit.params[pos]], ")");
      k::copy_(home_in(master, p, unit.offsets[pos]), p);
    }
    const DType gathered = options_.param_dtype.value_or(first.dtype());
    unit.full = gathered == first.dtype() ? master : k::to_dtype(master, gathered);
    for (size_t pos = 0; pos < unit.params.size(); ++pos) {
      Tensor p = params_[unit.params[pos]];
      p.set_data(home_in(unit.full, p, unit.offsets[pos]));
    }
    const int64_t piece = unit.numel / world, lo = rank * piece, hi = lo + piece;
    unit.shard = k::clone(k::narrow(master, 0, lo, piece));
    unit.shard_grad = zeros({piece}, master.dtype(), master.device());  // `first` is 16-bit now
    for (size_t pos = 0; pos < unit.params.size(); ++pos) {
      const size_t i = unit.params[pos];
      const int64_t begin = unit.offsets[pos], end = begin + params_[i].numel();
      const int64_t from = std::max(begin, lo), to = std::min(end, hi);
      if (from >= to) continue;
      Tensor run = k::narrow(unit.shard, 0, from - lo, to - from);
      run.requires_grad_(true);
      piece_tensors_.push_back(run);
      pieces_.push_back({.param = i,
                         .bucket = u,
                         .param_offset = from - begin,
                         .shard_offset = from - lo,
                         .numel = to - from});
    }
    release_storage(*unit.full.storage());
  }
  attach_shard_grads();

  // Hooks: around each unit's forward, and on every parameter's gradient.
  for (size_t u = 0; u + 1 < units_.size(); ++u) {
    nn::Module& m = *units_[u].module;
    units_[u].hook_handles.push_back(
        m.register_forward_pre_hook([this, u](nn::Module&, const Tensor&) {
          gather(u, /*wait=*/true);
          // The next unit in forward order, unless this is a recomputation in backward
          // (step 5), after which the previous unit comes.
          if (options_.prefetch && u + 2 < units_.size() && !autograd::backward_running())
            gather(u + 1, /*wait=*/false);
        }));
    units_[u].hook_handles.push_back(
        m.register_forward_hook([this, u](nn::Module&, const Tensor&, const Tensor& output) {
          Tensor out = attach_pre_backward(output, u);
          // Step 5: a recomputation keeps it; so does a forward inside summon_full_params.
          if (!autograd::backward_running() && summoned_ == 0) release(u);
          return out;
        }));
  }
  for (size_t i = 0; i < params_.size(); ++i)
    param_hooks_.push_back(
        params_[i].register_post_accumulate_grad_hook([this, i](Tensor&) { on_gradient(i); }));
}

double FSDPTimeline::overlap() const {
  double total = 0, hidden = 0;
  for (const Event& e : events) {
    if (!e.what.starts_with("reduce_scatter")) continue;
    const double span = std::max(0.0, e.completed - e.launched);
    total += span;
    hidden += std::clamp(backward_end - e.launched, 0.0, span);
  }
  return total > 0 ? hidden / total : 0.0;
}

namespace {

// Destructors wait for the collectives still writing into memory they free. One that fails (a
// peer gone) writes no more, and the job is already ending with an error of its own: the
// failure is printed, not thrown (a destructor that throws ends the process).
void settle(const std::shared_ptr<Work>& work, const char* where) noexcept {
  if (!work) return;
  try {
    work->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", where, e.what());
  }
}

}  // namespace

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].remove_post_accumulate_grad_hook(param_hooks_[i]);
  for (Unit& unit : units_) {
    for (int h : unit.hook_handles) unit.module->remove_hook(h);
    settle(unit.gather, "~FullyShardedDataParallel");
    settle(unit.reduce, "~FullyShardedDataParallel");
  }
}

// ------------------------------------------------------------------ gathers and releases

void FullyShardedDataParallel::gather(size_t u, bool wait) {
  Unit& unit = units_[u];
  if (unit.params.empty()) return;
  if (!unit.gathered) {
    NoGradGuard no_grad;
    restore_storage(*unit.full.storage());
    // Note [FSDP mixed precision]: the master shard narrowed for the wire.
    if (unit.full.dtype() != unit.shard.dtype())
      unit.shard_low = k::to_dtype(unit.shard, unit.full.dtype());
    unit.gather = group_->allgather_into_tensor(
        unit.full, unit.shard_low.defined() ? unit.shard_low : unit.shard);
    unit.gathered = true;
    if (recording_) {
      unit.gather_event = timeline_.events.size();
      timeline_.events.push_back({"allgather " + (unit.name.empty() ? "(root)" : unit.name),
                                  steady_seconds() - timeline_.start, 0});
    }
  }
  if (wait && unit.gather) settle_gather(unit);
}

void FullyShardedDataParallel::settle_gather(Unit& unit) {
  unit.gather->wait();
  if (recording_ && unit.gather_event < timeline_.events.size()) {
    const double done = unit.gather->finished_at();
    timeline_.events[unit.gather_event].completed =
        (done > 0 ? done : steady_seconds()) - timeline_.start;
  }
  unit.gather.reset();
  unit.shard_low = Tensor();
}

void FullyShardedDataParallel::release(size_t u) {
  Unit& unit = units_[u];
  if (!unit.gathered) return;
  if (unit.gather) settle_gather(unit);  // a prefetch nobody waited for
  release_storage(*unit.full.storage());
  unit.gathered = false;
}

// ------------------------------------------------------------------ forward

Tensor FullyShardedDataParallel::attach_pre_backward(const Tensor& output, size_t u) {
  if (!autograd::grad_enabled() || !output.requires_grad()) return output;
  // The identity: its backward runs when the unit's output gradient arrives (step 3).
  return autograd::record(
      "fsdp_pre_backward", output, {output}, {},
      [this, u](const autograd::Grads& dout, autograd::Saved&, autograd::Grads& dinputs) {
        pre_backward(u);
        dinputs[0] = dout[0];
      });
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  const size_t root = units_.size() - 1;
  const bool training_step = autograd::grad_enabled();
  if (options_.broadcast_buffers && group_->size() > 1 && is_training())
    broadcast_coalesced(*group_, module_->buffers(), 0);
  if (training_step) {
    timeline_ = FSDPTimeline();
    timeline_.start = steady_seconds();
    recording_ = true;
    expecting_backward_ = true;
    callback_queued_ = false;
    for (Unit& unit : units_) unit.pending = unit.params.size();
  }
  gather(root, /*wait=*/false);
  if (options_.prefetch) gather(0, /*wait=*/false);
  gather(root, /*wait=*/true);
  Tensor output = (*module_)(input);
  if (training_step && output.requires_grad()) return attach_pre_backward(output, root);
  if (summoned_ == 0) release(root);
  return output;
}

// ------------------------------------------------------------------ backward

void FullyShardedDataParallel::pre_backward(size_t u) {
  if (!callback_queued_) {
    callback_queued_ = true;
    // Gradients accumulate into the shards unless the optimizer dropped them (zero_grad).
    accumulating_ = !piece_tensors_.empty() && piece_tensors_.front().grad().defined();
    timeline_.backward_start = steady_seconds() - timeline_.start;
    autograd::queue_callback([this] { finalize(); });
  }
  gather(u, /*wait=*/true);
  const size_t root = units_.size() - 1;
  // The unit before it in forward order comes next in backward.
  const size_t previous = u == root ? units_.size() - 2 : u - 1;
  if (options_.prefetch && u != 0 && previous < root) gather(previous, /*wait=*/false);
}

void FullyShardedDataParallel::on_gradient(size_t i) {
  if (!expecting_backward_) return;
  NoGradGuard no_grad;
  const auto [u, pos] = where_[i];
  Unit& unit = units_[u];
  if (!unit.grad_full.defined())
    unit.grad_full = zeros({unit.numel}, unit.full.dtype(), unit.full.device());
  Tensor p = params_[i];
  if (Tensor g = p.grad(); g.defined()) k::copy_(home_in(unit.grad_full, p, unit.offsets[pos]), g);
  p.set_grad(Tensor());  // no full gradient stays behind
  if (--unit.pending == 0) reduce_unit(u);
}

void FullyShardedDataParallel::reduce_unit(size_t u) {
  Unit& unit = units_[u];
  if (!unit.grad_full.defined())
    unit.grad_full = zeros({unit.numel}, unit.full.dtype(), unit.full.device());
  unit.reduce_event = timeline_.events.size();
  timeline_.events.push_back({"reduce_scatter " + (unit.name.empty() ? "(root)" : unit.name),
                              steady_seconds() - timeline_.start, 0});
  // Straight into the gradient shard, unless it accumulates or is wider (mixed precision).
  const bool direct = !accumulating_ && unit.grad_full.dtype() == unit.shard_grad.dtype();
  unit.reduced =
      direct ? unit.shard_grad
             : empty(unit.shard_grad.sizes(), unit.grad_full.dtype(), unit.shard_grad.device());
  unit.reduce = group_->reduce_scatter_tensor(unit.reduced, unit.grad_full, ReduceOp::Sum);
  // Every backward op that reads this unit's weights has run: they can go.
  if (u + 1 < units_.size()) release(u);
}

void FullyShardedDataParallel::finalize() {
  expecting_backward_ = false;
  // Backward's computation ends here; the waits below are what it did not hide (as the
  // reducer's timeline counts them).
  timeline_.backward_end = steady_seconds() - timeline_.start;
  NoGradGuard no_grad;
  // Parameters that received no gradient count as zero, in unit order on every rank.
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].params.empty() && units_[u].pending > 0) {
      units_[u].pending = 0;
      reduce_unit(u);
    }
  const double average = 1.0 / group_->size();
  for (Unit& unit : units_) {
    if (!unit.reduce) continue;
    unit.reduce->wait();
    const double done = unit.reduce->finished_at();
    unit.reduce.reset();
    // The average in the shard's dtype (Note [FSDP mixed precision]).
    const Tensor reduced = k::to_dtype(unit.reduced, unit.shard_grad.dtype());
    k::mul_scalar_(reduced, average);
    if (!reduced.is_same(unit.shard_grad)) {
      if (accumulating_)
        k::add_(unit.shard_grad, reduced);
      else
        k::copy_(unit.shard_grad, reduced);
    }
    unit.reduced = Tensor();
    unit.grad_full = Tensor();
    if (unit.reduce_event < timeline_.events.size())
      timeline_.events[unit.reduce_event].completed =
          (done > 0 ? done : steady_seconds()) - timeline_.start;
  }
  for (size_t u = 0; u < units_.size(); ++u) release(u);
  recording_ = false;
  attach_shard_grads();  // the optimizer's zero_grad may have dropped them
}

void FullyShardedDataParallel::attach_shard_grads() {
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const ShardPiece& piece = pieces_[k];
    piece_tensors_[k].set_grad(
        k::narrow(units_[piece.bucket].shard_grad, 0, piece.shard_offset, piece.numel));
  }
}

// ------------------------------------------------------------------ the rest

double FullyShardedDataParallel::clip_grad_norm_(double max_norm) {
  LOOM_CHECK(std::isfinite(max_norm) && max_norm > 0, ValueError,
             "FullyShardedDataParallel::clip_grad_norm_: max_norm must be positive; got ",
             max_norm);
  NoGradGuard no_grad;
  double local = 0;
  for (const Tensor& run : piece_tensors_) {
    const Tensor g = k::to_dtype(run.grad(), kFloat64);
    local += k::sum(k::mul(g, g)).item();
  }
  Tensor squares = full({1}, local, kFloat64, params_.front().device());
  group_->allreduce(squares, ReduceOp::Sum)->wait();
  const double total = std::sqrt(squares.item());
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1)
    for (const Tensor& run : piece_tensors_) k::mul_scalar_(run.grad(), coefficient);
  return total;
}

FullyShardedDataParallel::FullParams::FullParams(FullyShardedDataParallel& fsdp) : fsdp_(fsdp) {
  for (size_t u = 0; u < fsdp_.units_.size(); ++u) fsdp_.gather(u, /*wait=*/false);
  for (size_t u = 0; u < fsdp_.units_.size(); ++u) fsdp_.gather(u, /*wait=*/true);
  if (fsdp_.summoned_++ == 0)
    for (Unit& unit : fsdp_.units_)
      if (unit.full.defined()) unit.gathered_version = unit.full.version();
}

FullyShardedDataParallel::FullParams::~FullParams() {
  // The constructor waited for every gather: no collective is left to fail here.
  if (--fsdp_.summoned_ > 0) return;  // an outer guard still needs them
  try {
    fsdp_.write_back_shards();
    for (size_t u = 0; u < fsdp_.units_.size(); ++u) fsdp_.release(u);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "~FullParams: %s\n", e.what());
  }
}

void FullyShardedDataParallel::write_back_shards() {
  NoGradGuard no_grad;
  const int64_t rank = group_->rank();
  for (Unit& unit : units_) {
    // An unwritten unit keeps its master shard as it is (Note [FSDP mixed precision]).
    if (!unit.gathered || unit.full.version() == unit.gathered_version) continue;
    const int64_t piece = unit.shard.numel();
    k::copy_(unit.shard, k::narrow(unit.full, 0, rank * piece, piece));
  }
}

int64_t FullyShardedDataParallel::parameter_shard_bytes() const {
  int64_t bytes = 0;
  for (const Unit& unit : units_)
    if (unit.shard.defined()) bytes += static_cast<int64_t>(unit.shard.nbytes());
  return bytes;
}

int64_t FullyShardedDataParallel::gradient_shard_bytes() const {
  int64_t bytes = 0;
  for (const Unit& unit : units_)
    if (unit.shard_grad.defined()) bytes += static_cast<int64_t>(unit.shard_grad.nbytes());
  return bytes;
}

std::vector<int64_t> FullyShardedDataParallel::unit_numels() const {
  std::vector<int64_t> numels;
  for (const Unit& unit : units_) numels.push_back(unit.numel);
  return numels;
}

std::string FullyShardedDataParallel::plan() const {
  std::ostringstream out;
  char line[240];
  const std::string mixed =
      options_.param_dtype ? detail::str("; gathered and reduced in ", *options_.param_dtype,
                                         ", master shards in ", units_.back().shard_grad.dtype())
                           : "";
  std::snprintf(line, sizeof line,
                "FSDP (ZeRO-3): %zu units on %d ranks; rank %d keeps piece %d of each%s\n",
                units_.size(), group_->size(), group_->rank(), group_->rank(), mixed.c_str());
  out << line;
  for (const Unit& unit : units_) {
    if (unit.params.empty()) continue;
    std::snprintf(line, sizeof line, "  %-24s %3zu parameters %10lld elements, shard %lld\n",
                  unit.name.empty() ? "(root)" : unit.name.c_str(), unit.params.size(),
                  static_cast<long long>(unit.numel),
                  static_cast<long long>(unit.numel / group_->size()));
    out << line;
  }
  return out.str();
}

}  // namespace loom::dist

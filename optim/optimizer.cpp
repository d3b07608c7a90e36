// optim/optimizer.cpp — what every optimizer shares: parameter checks, zero_grad, the learning
// rate, lazily created per-parameter state and its checkpoint form (Note [Optimizer state in
// checkpoints] in optim/optimizer.h).

#include "optim/optimizer.h"

#include <charconv>
#include <cmath>
#include <utility>

#include "autograd/graph.h"
#include "tensor/checks.h"
#include "tensor/copy.h"
#include "tensor/memory_limit.h"

namespace loom::optim {

namespace k = loom::kernels;

namespace {

// t stored as parameter p's update is (Note [Update layouts]): p's own dense order, or row-major.
Tensor in_update_layout(const Tensor& t, const Tensor& p) {
  return k::is_dense(p) ? k::dense_like(t, p) : k::contiguous(t);
}

}  // namespace

std::string format_double(double value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  LOOM_ASSERT(ec == std::errc(), "format_double: buffer too small");
  return std::string(buffer, end);
}

double parse_double(const std::string& text, const std::string& what) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  LOOM_CHECK(ec == std::errc() && ptr == end && !text.empty(), ValueError, what,
             ": expected a number; got \"", text, "\"");
  return value;
}

Optimizer::Optimizer(std::string name, std::vector<Tensor> params, double lr)
    : name_(std::move(name)), params_(std::move(params)), lr_(0) {
  LOOM_CHECK(!params_.empty(), ValueError, name_, ": got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    LOOM_CHECK(p.defined(), ValueError, name_, ": parameter ", i, " is an undefined tensor");
    LOOM_CHECK(p.requires_grad(), ValueError, name_, ": parameter ", i, " (shape=", p.sizes(),
               ") does not require grad");
    LOOM_CHECK(p.is_leaf(), ValueError, name_, ": parameter ", i, " (shape=", p.sizes(),
               ") is not a leaf: optimize the tensors you created, not results of ops");
    LOOM_CHECK(p.dtype() == kFloat32 || p.dtype() == kFloat64, DTypeError, name_, ": parameter ", i,
               " (shape=", p.sizes(), ") is ", p.dtype(), "; expected float32 or float64");
    for (size_t j = 0; j < i; ++j)
      LOOM_CHECK(!p.is_same(params_[j]), ValueError, name_, ": parameter ", i,
                 " (shape=", p.sizes(), ") is the same tensor as parameter ", j);
  }
  set_lr(lr);
  state_.resize(params_.size());
}

void Optimizer::set_lr(double lr) {
  LOOM_CHECK(std::isfinite(lr) && lr >= 0, ValueError, name_,
             ": invalid learning rate (expected a finite lr >= 0); got lr=", lr);
  lr_ = lr;
}

int64_t Optimizer::param_steps(size_t i) const {
  LOOM_CHECK(i < params_.size(), IndexError, name_, ": parameter index ", i, " out of range for ",
             params_.size(), " parameters");
  return state_[i].steps;
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const ParamState& state : state_)
    for (const Tensor& buffer : state.buffers) bytes += static_cast<int64_t>(buffer.nbytes());
  return bytes;
}

void Optimizer::zero_grad(bool set_to_none) {
  autograd::NoGradGuard no_grad;
  for (Tensor p : params_) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      k::fill_(g, 0.0);
  }
}

Tensor Optimizer::update_grad(size_t i) const {
  const Tensor& p = params_[i];
  const Tensor g = p.grad();
  if (!g.defined()) return g;
  LOOM_CHECK(g.device() == p.device(), DeviceError, name_, ": gradient of parameter ", i, " is on ",
             g.device(), " but the parameter is on ", p.device());
  LOOM_CHECK(g.sizes() == p.sizes(), ShapeError, name_, ": gradient of parameter ", i,
             " has shape=", g.sizes(), " but the parameter has shape=", p.sizes());
  LOOM_CHECK(g.dtype() == p.dtype(), DTypeError, name_, ": gradient of parameter ", i, " is ",
             g.dtype(), " but the parameter is ", p.dtype());
  return in_update_layout(g, p);
}

std::vector<Tensor> Optimizer::update_grads() const {
  std::vector<Tensor> grads;
  grads.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) grads.push_back(update_grad(i));
  return grads;
}

Tensor Optimizer::update_target(size_t i) const {
  const Tensor& p = params_[i];
  return in_update_layout(p, p);
}

void Optimizer::finish_update(size_t i, const Tensor& target) const {
  const Tensor& p = params_[i];
  if (target.is_same(p))
    p.bump_version();
  else
    k::copy_(p, target);  // bumps the version
}

Optimizer::ParamState& Optimizer::state_for(size_t i) {
  ParamState& state = state_[i];
  if (!state.initialized) {
    const AllocationLabel label("for the optimizer state of ", name_.c_str());
    const Tensor& p = params_[i];
    state.buffers.clear();
    for (size_t b = 0; b < buffer_names().size(); ++b) {
      Tensor buffer = empty(p.sizes(), p.dtype(), p.device(), suggest_memory_format(p));
      k::fill_(buffer, 0.0);
      state.buffers.push_back(std::move(buffer));
    }
    state.steps = 0;
    state.initialized = true;
  }
  for (Tensor& buffer : state.buffers) buffer = in_update_layout(buffer, params_[i]);
  return state;
}

// ---------------------------------------------------------------- checkpoints

void Optimizer::save_state(NamedTensors& tensors, Metadata& meta, const std::string& prefix) const {
  meta[prefix + "optimizer"] = name_;
  meta[prefix + "num_params"] = std::to_string(params_.size());
  meta[prefix + "lr"] = format_double(lr_);
  for (const auto& [key, value] : hyper_parameters()) meta[prefix + key] = value;
  // The buffers go in as they are (no copy): write the file before the next step.
  const std::vector<std::string> names = buffer_names();
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& state = state_[i];
    if (!state.initialized) continue;
    const std::string base = prefix + "state." + std::to_string(i) + ".";
    for (size_t b = 0; b < names.size(); ++b)
      tensors.emplace_back(base + names[b], state.buffers[b]);
    tensors.emplace_back(base + "step", scalar_tensor(static_cast<double>(state.steps), kInt64));
  }
}

std::string Optimizer::read_meta(const SafetensorsFile& file, const std::string& prefix,
                                 const std::string& key) const {
  const auto it = file.metadata.find(prefix + key);
  LOOM_CHECK(it != file.metadata.end(), ValueError, name_, ": load_state: the checkpoint has no ",
             prefix + key, " in its metadata");
  return it->second;
}

double Optimizer::read_double(const SafetensorsFile& file, const std::string& prefix,
                              const std::string& key) const {
  return parse_double(read_meta(file, prefix, key), name_ + ": load_state: " + prefix + key);
}

bool Optimizer::read_bool(const SafetensorsFile& file, const std::string& prefix,
                          const std::string& key) const {
  const std::string text = read_meta(file, prefix, key);
  LOOM_CHECK(text == "true" || text == "false", ValueError, name_, ": load_state: ", prefix + key,
             ": expected true or false; got \"", text, "\"");
  return text == "true";
}

void Optimizer::check_kind(const SafetensorsFile& file, const std::string& prefix) const {
  const std::string kind = read_meta(file, prefix, "optimizer");
  LOOM_CHECK(kind == name_, ValueError, name_, ": load_state: ", prefix,
             "optimizer holds the state of ", kind, ", not ", name_);
  const double count = read_double(file, prefix, "num_params");
  LOOM_CHECK(count == static_cast<double>(params_.size()), ValueError, name_,
             ": load_state: the checkpoint has ", prefix, "num_params=", count,
             " but this optimizer has ", params_.size(), " parameters");
}

std::vector<Optimizer::ParamState> Optimizer::read_state(
    const SafetensorsFile& file, const std::string& prefix,
    const std::vector<std::string>& names) const {
  std::vector<ParamState> states(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const std::string base = prefix + "state." + std::to_string(i) + ".";
    std::vector<std::string> keys;
    for (const std::string& name : names) keys.push_back(base + name);
    keys.push_back(base + "step");
    bool any = false;
    for (const std::string& key : keys) any = any || file.contains(key);
    if (!any) continue;  // this parameter had no step yet
    ParamState& state = states[i];
    for (const std::string& key : keys)
      LOOM_CHECK(file.contains(key), ValueError, name_,
                 ": load_state: the checkpoint has state for parameter ", i, " but no ", key);
    for (const std::string& name : names) {
      const Tensor& t = file.at(base + name);
      LOOM_CHECK(t.sizes() == p.sizes(), ValueError, name_, ": load_state: ", base + name,
                 " has shape=", t.sizes(), " but parameter ", i, " has shape=", p.sizes());
      LOOM_CHECK(is_floating(t.dtype()), DTypeError, name_, ": load_state: ", base + name, " is ",
                 t.dtype(), "; expected a floating-point tensor");
      Tensor buffer = k::to_device(k::to_dtype(t, p.dtype()), p.device());
      state.buffers.push_back(buffer.is_same(t) ? k::clone(buffer) : k::contiguous(buffer));
    }
    {
      const Tensor& t = file.at(base + "step");
      LOOM_CHECK(t.numel() == 1, ValueError, name_, ": load_state: ", base + "step",
                 " has shape=", t.sizes(), "; expected one element");
      const double steps = t.item<double>();
      LOOM_CHECK(steps >= 1 && steps == std::floor(steps) && steps < 9.0e15, ValueError, name_,
                 ": load_state: ", base + "step", " holds ", steps,
                 "; expected a whole number >= 1");
      state.steps = static_cast<int64_t>(steps);
    }
    state.initialized = true;
  }
  return states;
}

void Optimizer::commit_state(std::vector<ParamState> state, double lr) {
  LOOM_ASSERT(state.size() == params_.size());
  set_lr(lr);
  state_ = std::move(state);
}

double Optimizer::momentum() const {
  throw NotImplementedError(detail::str(name_, ": this optimizer has no momentum to cycle"));
}

void Optimizer::set_momentum(double) {
  throw NotImplementedError(detail::str(name_, ": this optimizer has no momentum to cycle"));
}

}  // namespace loom::optim

// nn/module.cpp — registration, traversal, conversion and state of nn::Module.

#include "nn/module.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "autograd/graph.h"
#include "tensor/copy.h"
#include "tensor/memory_limit.h"

namespace loom::nn {

namespace k = kernels;

Tensor Module::operator()(const Tensor& input) {
  // What an OutOfMemoryError says was running (Note [Allocation labels]).
  const AllocationLabel label("in the forward of ", type_name_.c_str());
  if (forward_pre_hooks_.empty() && forward_hooks_.empty()) return forward(input);
  // Copies: a hook may register or remove hooks.
  const auto pre_hooks = forward_pre_hooks_;
  for (const auto& [handle, hook] : pre_hooks) hook(*this, input);
  Tensor output = forward(input);
  const auto hooks = forward_hooks_;
  for (const auto& [handle, hook] : hooks) output = hook(*this, input, output);
  return output;
}

int Module::register_forward_pre_hook(ForwardPreHook hook) {
  LOOM_CHECK(static_cast<bool>(hook), ValueError, type_name_,
             ": register_forward_pre_hook: the hook is empty");
  forward_pre_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

int Module::register_forward_hook(ForwardHook hook) {
  LOOM_CHECK(static_cast<bool>(hook), ValueError, type_name_,
             ": register_forward_hook: the hook is empty");
  forward_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

void Module::remove_hook(int handle) {
  std::erase_if(forward_pre_hooks_, [handle](const auto& h) { return h.first == handle; });
  std::erase_if(forward_hooks_, [handle](const auto& h) { return h.first == handle; });
}

Tensor Module::forward(const Tensor&) {
  throw NotImplementedError(
      detail::str(type_name_, ": forward(Tensor) is not defined for this module"));
}

// ------------------------------------------------------------------ registration

void Module::check_new_name(const std::string& name) const {
  LOOM_CHECK(!name.empty() && name.find('.') == std::string::npos, ValueError, type_name_,
             ": a parameter, buffer or child name must be non-empty and contain no '.'; got '",
             name, "'");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  LOOM_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), ValueError, type_name_,
             ": the name '", name, "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name);
  if (!value.defined()) return value;
  LOOM_CHECK(!requires_grad || is_floating(value.dtype()), DTypeError, type_name_, ": parameter '",
             name, "' must be floating point to require grad; got ", value.dtype());
  if (requires_grad) value.requires_grad_(true);
  parameters_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  if (value.defined()) buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, ModulePtr module) {
  check_new_name(name);
  LOOM_CHECK(module != nullptr, ValueError, type_name_, ": child '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

// ------------------------------------------------------------------ traversal

void Module::collect(NamedTensors& out, const std::string& prefix, bool params, bool buffers,
                     bool recurse) const {
  if (params)
    for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  if (buffers)
    for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : children_)
    child->collect(out, prefix + name + ".", params, buffers, true);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect(out, "", true, false, recurse);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect(out, "", false, true, recurse);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

NamedModules Module::named_modules() {
  NamedModules out;
  // The root has no shared_ptr of its own here: an aliasing pointer that owns nothing.
  out.emplace_back("", ModulePtr(ModulePtr(), this));
  for (const auto& [name, child] : children_) {
    out.emplace_back(name, child);
    for (auto& [sub, m] : child->named_modules())
      if (!sub.empty()) out.emplace_back(name + "." + sub, m);
  }
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

// ------------------------------------------------------------------ modes and conversions

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : children_) child->apply(fn);
  fn(*this);
}

void Module::convert(const std::function<Tensor(const Tensor&)>& fn) {
  autograd::NoGradGuard no_grad;
  for (auto& [name, t] : parameters_) {
    t.set_data(fn(t));
    // The gradient is replaced, not changed in place: it may be a view others hold and rely on
    // (a DDP bucket's, which must stay in its bucket).
    if (Tensor g = t.grad(); g.defined()) t.set_grad(fn(g));
  }
  for (auto& [name, t] : buffers_) t.set_data(fn(t));
  for (auto& [name, child] : children_) child->convert(fn);
}

void Module::to(Device device) {
  convert([&](const Tensor& t) { return t.device() == device ? t : k::to_device(t, device); });
}

void Module::to(DType dtype) {
  convert([&](const Tensor& t) {
    return !is_floating(t.dtype()) || t.dtype() == dtype ? t : k::to_dtype(t, dtype);
  });
}

void Module::to(MemoryFormat format) {
  convert([&](const Tensor& t) { return t.dim() == 4 ? k::contiguous(t, format) : t; });
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      k::fill_(g, 0.0);
  }
}

// ------------------------------------------------------------------ state

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect(out, "", true, true, true);
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  const NamedTensors own = state_dict();
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) given[name] = &t;

  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, t] : own) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    if (it->second->sizes() != t.sizes())
      mismatched.push_back(
          detail::str(name, ": checkpoint ", it->second->sizes(), ", model ", t.sizes()));
  }
  for (const auto& [name, t] : state)
    if (std::none_of(own.begin(), own.end(), [&](const auto& e) { return e.first == name; }))
      unexpected.push_back(name);

  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::ostringstream msg;
    msg << "load_state_dict: the state does not fit this " << type_name_ << ".";
    auto list = [&](const char* what, const std::vector<std::string>& names) {
      if (names.empty()) return;
      msg << "\n  " << what << " (" << names.size() << "):";
      for (const auto& n : names) msg << "\n    " << n;
    };
    list("missing keys", missing);
    list("unexpected keys", unexpected);
    list("shape mismatches", mismatched);
    throw ValueError(msg.str());
  }

  autograd::NoGradGuard no_grad;
  for (const auto& [name, t] : own) {
    auto it = given.find(name);
    if (it == given.end()) continue;
    k::copy_(t, *it->second);
    t.bump_version();
  }
}

// ------------------------------------------------------------------ printing

void Module::repr_into(std::string& out, int indent) const {
  out.append(type_name_).append("(").append(extra_repr());
  if (children_.empty()) {
    out += ")";
    return;
  }
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  for (const auto& [name, child] : children_) {
    out.append("\n").append(pad).append("(").append(name).append("): ");
    child->repr_into(out, indent + 2);
  }
  out.append("\n").append(static_cast<size_t>(indent), ' ').append(")");
}

std::string Module::repr() const {
  std::string out;
  repr_into(out, 0);
  return out;
}

}  // namespace loom::nn

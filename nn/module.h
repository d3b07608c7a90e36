// nn/module.h — nn::Module, the base of every layer and model: named parameters, buffers and
// children in registration order, train/eval, to(device, dtype or memory format), zero_grad,
// apply, and state_dict / load_state_dict with PyTorch's key names ("layer1.0.conv1.weight",
// "bn1.running_mean", "bn1.num_batches_tracked").
//
// Note [Module state and key order]
// A module's state is its own parameters, then its own buffers, then each child's state under
// "<child name>.", recursively; this is the order PyTorch's state_dict() uses, so a file written
// by either side lists the same keys in the same order. Layers keep their tensors as members
// (Linear::weight, ...) that share their TensorImpl with the registered entry: to() changes a
// parameter's or buffer's data in place (Tensor::set_data), so those members, and an
// optimizer's parameter list, keep pointing at the live tensors. A gradient is replaced by its
// converted copy instead (set_grad): a DDP bucket view must keep its storage.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace loom::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;
using NamedModules = std::vector<std::pair<std::string, ModulePtr>>;

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // "Conv2d", "ResNet", ...: the class name PyTorch prints.
  const std::string& type_name() const { return type_name_; }

  // Single-input forward, which Sequential chains. Modules with other signatures (losses)
  // define their own and leave this one to raise NotImplementedError.
  virtual Tensor forward(const Tensor& input);
  // forward with the hooks around it, as PyTorch's __call__: the forward pre-hooks, forward,
  // then the forward hooks, each in the order registered; a forward hook may replace the
  // output. Containers and models call their children through it (Sequential, ResNet's stages,
  // GPT's blocks), so that a wrapper can see a child's call: FullyShardedDataParallel gathers a
  // unit's parameters in its pre-hook and frees them in its hook.
  Tensor operator()(const Tensor& input);
  using ForwardPreHook = std::function<void(Module& module, const Tensor& input)>;
  using ForwardHook =
      std::function<Tensor(Module& module, const Tensor& input, const Tensor& output)>;
  int register_forward_pre_hook(ForwardPreHook hook);  // returns a handle for remove_hook
  int register_forward_hook(ForwardHook hook);
  void remove_hook(int handle);

  // --- what the module holds ---
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  const NamedModules& named_children() const { return children_; }
  // This module ("") and every descendant, depth first, parents before children.
  NamedModules named_modules();
  int64_t num_parameters() const;  // elements over all parameters

  // --- modes and conversions ---
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter, buffer and gradient to the device (in place, see the Note).
  void to(Device device);
  // Converts floating-point parameters, buffers and gradients (integer buffers such as
  // num_batches_tracked keep their dtype, as in PyTorch).
  void to(DType dtype);
  // Stores every 4-D parameter, buffer and gradient in `format` (the others are left as they
  // are), as PyTorch's module.to(memory_format=...). With kChannelsLast a convolution's weight
  // is in the order cuDNN's NHWC kernels read ([O, kh, kw, C] in memory), so a channels-last
  // network converts no weight per step; its gradients follow (AccumulateGrad, DDP's bucket
  // views) and the optimizers update it where it lies (Note [Update layouts], optim/optimizer.h).
  // As in PyTorch, convert before wrapping the model in DDP: DDP lays its buckets out as the
  // parameters are when it is built (converted later, the gradients are still averaged, through
  // a copy into the old layout each step).
  void to(MemoryFormat format);
  void zero_grad(bool set_to_none = true);
  // fn on every module, children first, then this one (PyTorch's order).
  void apply(const std::function<void(Module&)>& fn);

  // --- state (Note [Module state and key order]) ---
  NamedTensors state_dict() const;
  // Copies each tensor of `state` into the parameter or buffer of that name (converting dtype
  // and device). Strict: one ValueError listing every missing key, unexpected key and shape
  // mismatch. Non-strict: loads the keys that match and ignores the rest (shape mismatches
  // still raise).
  void load_state_dict(const NamedTensors& state, bool strict = true);

  // PyTorch's printed form: "Conv2d(3, 64, kernel_size=(3, 3), ...)" with children indented.
  std::string repr() const;
  virtual std::string extra_repr() const { return ""; }

 protected:
  // For modules that change role in place (BatchNorm2d becoming SyncBatchNorm).
  void set_type_name(std::string name) { type_name_ = std::move(name); }
  // Registration, in the order that defines key order. Names must be unique and non-empty and
  // contain no '.' (ValueError). An undefined tensor registers an absent entry (bias=False):
  // it is listed nowhere, as in PyTorch.
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

 private:
  void check_new_name(const std::string& name) const;
  void add_child(const std::string& name, ModulePtr module);
  void collect(NamedTensors& out, const std::string& prefix, bool params, bool buffers,
               bool recurse) const;
  void convert(const std::function<Tensor(const Tensor&)>& fn);
  void repr_into(std::string& out, int indent) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<int, ForwardPreHook>> forward_pre_hooks_;
  std::vector<std::pair<int, ForwardHook>> forward_hooks_;
  int next_hook_ = 0;
  NamedTensors parameters_, buffers_;
  NamedModules children_;
};

// Modules are shared (a model holds its layers, a trainer holds the model): make_shared for
// every module type, as LibTorch's holders do.
template <typename M, typename... Args>
std::shared_ptr<M> make(Args&&... args) {
  return std::make_shared<M>(std::forward<Args>(args)...);
}

}  // namespace loom::nn

// optim/optimizer.h — the base of loom's optimizers: the parameters, the learning rate that the
// schedules of optim/schedule.h drive, zero_grad, and the per-parameter state with its
// checkpoint form (the save_state/load_state convention of the trainer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace loom::optim {

using Metadata = std::map<std::string, std::string>;

// Note [Optimizer state in checkpoints]
// save_state appends, under `prefix`:
//   metadata  <prefix>optimizer    the class ("SGD", "Adam", "AdamW"); load_state refuses another
//             <prefix>num_params   how many parameters; load_state refuses another count
//             <prefix>lr and the class's hyper-parameters (numbers written to round-trip)
//   tensors   <prefix>state.<i>.<buffer>  each buffer of parameter i, shaped like it
//             <prefix>state.<i>.step      [] int64, the steps parameter i took
// A parameter that never had a gradient has no state and no keys, as in PyTorch's state_dict.
// load_state restores the hyper-parameters too (PyTorch's load_state_dict restores the param
// groups), checks every key, shape and count before it changes anything, and converts the
// buffers to the parameter's dtype. The tensors save_state appends are the live buffers, not
// copies: write the file before the next step.
class Optimizer {
 public:
  // params: leaf tensors that require grad, float32 or float64, each given once.
  Optimizer(std::string name, std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (the others are skipped and keep their
  // state), in place, under NoGradGuard.
  virtual void step() = 0;
  // set_to_none: drop the gradients (the default, as in PyTorch 2); otherwise zero them in place.
  virtual void zero_grad(bool set_to_none = true);

  double lr() const { return lr_; }
  void set_lr(double lr);  // ValueError when negative or not finite
  const std::vector<Tensor>& params() const { return params_; }
  const std::string& name() const { return name_; }
  // The number of steps parameter i has taken with a gradient (0 before its first).
  int64_t param_steps(size_t i) const;
  // The bytes the state buffers hold (SGD's momentum, Adam's moments), for memory reports.
  virtual int64_t state_bytes() const;
  // The momentum a one-cycle schedule cycles (PyTorch's cycle_momentum): SGD's momentum, Adam's
  // beta1. The base class has none (NotImplementedError).
  virtual double momentum() const;
  virtual void set_momentum(double momentum);

  virtual void save_state(NamedTensors& tensors, Metadata& meta, const std::string& prefix) const;
  virtual void load_state(const SafetensorsFile& file, const std::string& prefix) = 0;

 protected:
  // What an optimizer keeps for one parameter; `initialized` once it took its first step.
  struct ParamState {
    bool initialized = false;
    int64_t steps = 0;
    std::vector<Tensor> buffers;  // named by buffer_names(), shaped like the parameter
  };

  // The names of the buffers each parameter keeps under the current hyper-parameters.
  virtual std::vector<std::string> buffer_names() const = 0;
  // The class's hyper-parameters, lr excluded, as metadata values.
  virtual Metadata hyper_parameters() const = 0;

  // Note [Update layouts]
  // An update reads and writes a parameter, its gradient and its state buffers as flat arrays,
  // so all of them must hold their elements in one dense order. That order is the parameter's
  // own when the parameter is dense, row-major or channels-last (a model after
  // to(MemoryFormat::kChannelsLast), whose convolutions then return channels-last gradients): it
  // is updated where it lies, and a gradient or buffer in the other order is copied into it (a
  // buffer once, where it is kept). A parameter that is not dense (a strided view) is updated
  // through a row-major copy, which finish_update writes back.

  // The gradient of parameter i for an update: undefined when it has none; checked against the
  // parameter (shape, dtype, device) and stored in the update's layout (Note [Update layouts]).
  Tensor update_grad(size_t i) const;
  // update_grad of every parameter, all checked before a step changes any state: the CUDA
  // parameters are updated after the loop that creates their state (Note [Tensor lists]), so a
  // bad gradient found later in that loop would leave them counted as stepped but not updated.
  std::vector<Tensor> update_grads() const;
  // The storage an update of parameter i writes: the parameter itself when dense, a row-major
  // copy otherwise, which finish_update copies back. finish_update also bumps the parameter's
  // version (autograd sees the in-place change).
  Tensor update_target(size_t i) const;
  void finish_update(size_t i, const Tensor& target) const;
  // State of parameter i, creating its zero buffers on first use; its buffers are in the
  // update's layout (a buffer loaded from a checkpoint, or kept from before the parameter
  // changed its format, is converted here once).
  ParamState& state_for(size_t i);

  // For load_state: the file's metadata value at prefix+key (ValueError naming it if absent),
  // parsed as a number or a boolean.
  std::string read_meta(const SafetensorsFile& file, const std::string& prefix,
                        const std::string& key) const;
  double read_double(const SafetensorsFile& file, const std::string& prefix,
                     const std::string& key) const;
  bool read_bool(const SafetensorsFile& file, const std::string& prefix,
                 const std::string& key) const;
  // Checks the class (<prefix>optimizer) and the parameter count; load_state calls it first.
  void check_kind(const SafetensorsFile& file, const std::string& prefix) const;
  // Reads every parameter's state for the given buffer names without changing this optimizer;
  // the caller commits it with commit_state once everything read back.
  std::vector<ParamState> read_state(const SafetensorsFile& file, const std::string& prefix,
                                     const std::vector<std::string>& names) const;
  void commit_state(std::vector<ParamState> state, double lr);

  std::vector<ParamState> state_;

 private:
  std::string name_;
  std::vector<Tensor> params_;
  double lr_;
};

// Numbers in checkpoint metadata: the shortest text that reads back to the same double.
std::string format_double(double value);
// Parses all of `text` as a double; ValueError naming `what` otherwise.
double parse_double(const std::string& text, const std::string& what);

// Calls fn(std::span<const Item>) once per run of `items` that share key(item), after a stable
// sort by key: a fused update takes one list per device and dtype (tensor/optim.h), and the
// parameters keep their order within each.
template <typename Item, typename Key, typename Fn>
void for_each_group(std::vector<Item>& items, Key key, Fn fn) {
  std::stable_sort(items.begin(), items.end(),
                   [&](const Item& a, const Item& b) { return key(a) < key(b); });
  for (auto lo = items.begin(); lo != items.end();) {
    const auto hi =
        std::find_if(lo, items.end(), [&](const Item& x) { return key(x) != key(*lo); });
    fn(std::span<const Item>(lo, hi));
    lo = hi;
  }
}
// The group of a tensor for a fused update (tensor/optim.h): its device and dtype.
inline std::tuple<int, int, int> device_and_dtype(const Tensor& t) {
  return {static_cast<int>(t.device().type), t.device().index, static_cast<int>(t.dtype())};
}

}  // namespace loom::optim

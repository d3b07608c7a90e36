// dist/data_parallel.cpp — DataParallel (Note [DataParallel], data_parallel.h).

#include "dist/data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <thread>

#include "autograd/autocast.h"
#include "autograd/graph.h"
#include "autograd/ops/index.h"
#include "autograd/ops/view.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/parallel.h"

namespace loom::dist {

namespace k = kernels;

namespace {

std::vector<Tensor> trained(nn::Module& m) {
  std::vector<Tensor> out;
  for (auto& [name, p] : m.named_parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

int64_t row_bytes(const Tensor& t) {
  return t.size(0) == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / t.size(0);
}

// The device a module's state lies on (the CPU for a module without state).
Device device_of(const nn::ModulePtr& module) {
  LOOM_CHECK(module != nullptr, ValueError, "DataParallel: the module is null");
  const NamedTensors state = module->state_dict();
  return state.empty() ? kCPU : state.front().second.device();
}

}  // namespace

std::string DataParallelReport::describe() const {
  char line[400];
  std::snprintf(line, sizeof line,
                "DataParallel's last step through device 0 (Note [DataParallel]): weights out "
                "%.2f MiB, inputs out %.3f MiB, outputs in %.3f MiB, gradients in %.2f MiB; "
                "device 0 held %.2f MiB of inputs and outputs, each other replica %.2f MiB\n",
                broadcast_bytes / 1048576.0, scatter_bytes / 1048576.0, gather_bytes / 1048576.0,
                reduce_bytes / 1048576.0, device0_activation_bytes / 1048576.0,
                other_activation_bytes / 1048576.0);
  return line;
}

std::vector<Device> data_parallel_devices(Device device, int count) {
  std::vector<Device> ids;
  for (int i = 0; i < count; ++i)
    ids.push_back(device.is_cuda() ? Device(DeviceType::CUDA, i) : device);
  return ids;
}

DataParallel::DataParallel(nn::ModulePtr module, int devices,
                           std::function<nn::ModulePtr()> make_replica)
    : DataParallel(
          module, std::vector<Device>(static_cast<size_t>(std::max(devices, 0)), device_of(module)),
          std::move(make_replica)) {}

DataParallel::DataParallel(nn::ModulePtr module, std::vector<Device> device_ids,
                           std::function<nn::ModulePtr()> make_replica)
    : nn::Module("DataParallel"),
      module_(register_module("module", std::move(module))),
      devices_(std::move(device_ids)) {
  LOOM_CHECK(module_ != nullptr, ValueError, "DataParallel: the module is null");
  const int devices = static_cast<int>(devices_.size());
  LOOM_CHECK(devices >= 1, ValueError, "DataParallel: expected at least 1 device; got ", devices);
  LOOM_CHECK(devices == 1 || make_replica != nullptr, ValueError, "DataParallel: ", devices,
             " devices need a factory of replicas; got none");
  LOOM_CHECK(device_of(module_) == devices_[0], ValueError, "DataParallel: the module is on ",
             device_of(module_), ", the first device is ", devices_[0]);
  replicas_.push_back(module_);
  const NamedTensors reference = module_->state_dict();
  for (int d = 1; d < devices; ++d) {
    nn::ModulePtr replica = make_replica();
    LOOM_CHECK(replica != nullptr, ValueError, "DataParallel: the factory made a null replica");
    const NamedTensors state = replica->state_dict();
    LOOM_CHECK(state.size() == reference.size(), ValueError, "DataParallel: replica ", d, " has ",
               state.size(), " tensors of state, the module ", reference.size());
    for (size_t i = 0; i < state.size(); ++i) {
      const auto& [name, t] = state[i];
      const auto& [ref_name, ref] = reference[i];
      LOOM_CHECK(name == ref_name && t.sizes() == ref.sizes() && t.dtype() == ref.dtype(),
                 ValueError, "DataParallel: replica ", d, "'s ", name, " (", t.dtype(), " ",
                 t.sizes(), ") differs from the module's ", ref_name, " (", ref.dtype(), " ",
                 ref.sizes(), ")");
    }
    replica->to(devices_[static_cast<size_t>(d)]);
    replicas_.push_back(std::move(replica));
  }
  for (const nn::ModulePtr& r : replicas_) params_.push_back(trained(*r));
  // The replicas' gradients arrive during backward; the first of them queues the reduction.
  for (size_t d = 1; d < replicas_.size(); ++d)
    for (const Tensor& p : params_[d])
      hooks_.emplace_back(p, p.register_post_accumulate_grad_hook([this](Tensor&) {
        if (reduction_queued_) return;
        reduction_queued_ = true;
        autograd::queue_callback([this] { reduce_gradients(); });
      }));
}

DataParallel::~DataParallel() {
  for (auto& [p, handle] : hooks_) p.remove_post_accumulate_grad_hook(handle);
}

Tensor DataParallel::forward(const Tensor& input) {
  LOOM_CHECK(input.defined() && input.dim() >= 1, ShapeError,
             "DataParallel: expected an input with a batch dimension; got sizes ",
             input.defined() ? input.sizes() : Shape{});
  const int64_t batch = input.size(0), devices = static_cast<int64_t>(replicas_.size());
  if (devices == 1 || batch <= 1) {
    active_ = 1;
    report_ = {.devices = 1};
    return module_->forward(input);
  }
  // 2. Chunks as torch.chunk cuts them: ceil(B / D) each, the last shorter, maybe fewer.
  const int64_t chunk = (batch + devices - 1) / devices;
  active_ = static_cast<int>((batch + chunk - 1) / chunk);
  report_ = {.devices = active_};
  // 1. The weights and buffers, to the replicas that run, and every submodule's mode (a model
  // may train with its batch norms in eval mode, --freeze-bn).
  {
    NoGradGuard no_grad;
    const NamedTensors state = module_->state_dict();
    const nn::NamedModules modes = module_->named_modules();
    for (int d = 1; d < active_; ++d) {
      // Parents before children: train(on) sets a subtree, which its children then correct.
      const nn::NamedModules theirs = replicas_[static_cast<size_t>(d)]->named_modules();
      for (size_t i = 0; i < modes.size(); ++i)
        theirs[i].second->train(modes[i].second->is_training());
    }
    for (int d = 1; d < active_; ++d) {
      const NamedTensors theirs = replicas_[static_cast<size_t>(d)]->state_dict();
      for (size_t i = 0; i < state.size(); ++i) {
        k::copy_(theirs[i].second, state[i].second);
        report_.broadcast_bytes += static_cast<int64_t>(state[i].second.nbytes());
      }
    }
  }
  // 3. Each replica on its thread, in the caller's grad mode and autocast region.
  std::vector<Tensor> outputs(static_cast<size_t>(active_));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(active_));
  const bool grad = autograd::grad_enabled();
  const bool autocast_on = autocast::is_enabled();
  const DType autocast_dtype = autocast::dtype();
  const int threads = std::max(1, get_num_threads() / active_);
  auto run = [&](int d) {
    try {
      autograd::set_grad_enabled(grad);
      std::optional<autocast::Guard> region;
      if (autocast_on) region.emplace(autocast_dtype, true);
      const int64_t begin = d * chunk, rows = std::min(chunk, batch - begin);
      const Device device = devices_[static_cast<size_t>(d)];
      Tensor part = input.narrow(0, begin, rows);
      if (part.device() != device) part = loom::to(part, device);
      Tensor out = replicas_[static_cast<size_t>(d)]->forward(part);
      // Back to device 0, differentiably: backward sends each replica its rows.
      if (out.device() != devices_[0]) out = loom::to(out, devices_[0]);
      outputs[static_cast<size_t>(d)] = out;
    } catch (...) {
      errors[static_cast<size_t>(d)] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  for (int d = 1; d < active_; ++d)
    workers.emplace_back([&run, d, threads] {
      set_num_threads(threads);
      run(d);
    });
  const int caller_threads = get_num_threads();
  set_num_threads(threads);
  run(0);
  set_num_threads(caller_threads);
  for (std::thread& w : workers) w.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  for (int d = 1; d < active_; ++d) {
    const Tensor& out = outputs[static_cast<size_t>(d)];
    report_.scatter_bytes += std::min(chunk, batch - d * chunk) * row_bytes(input);
    report_.gather_bytes += static_cast<int64_t>(out.nbytes());
  }
  // 4. Gathered on device 0.
  Tensor gathered = cat(outputs, 0);
  report_.device0_activation_bytes =
      static_cast<int64_t>(input.nbytes()) + static_cast<int64_t>(gathered.nbytes());
  report_.other_activation_bytes =
      chunk * row_bytes(input) + static_cast<int64_t>(outputs[0].nbytes());
  return gathered;
}

void DataParallel::reduce_gradients() {
  NoGradGuard no_grad;
  reduction_queued_ = false;
  const std::vector<Tensor>& mine = params_[0];
  for (size_t j = 0; j < mine.size(); ++j) {
    Tensor master = mine[j];
    for (size_t d = 1; d < replicas_.size(); ++d) {
      Tensor p = params_[d][j];
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      report_.reduce_bytes += static_cast<int64_t>(g.nbytes());
      const bool here = g.device() == master.device();
      if (master.grad().defined())
        k::add_(master.grad(), here ? g : k::to_device(g, master.device()));
      else
        master.set_grad(here ? k::clone(g) : k::to_device(g, master.device()));
      p.set_grad(Tensor());  // released until the next backward
    }
  }
}

}  // namespace loom::dist

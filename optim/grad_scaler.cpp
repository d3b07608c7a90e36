// optim/grad_scaler.cpp — GradScaler (Note [Dynamic loss scaling]). Unscaling is one fused pass
// over each gradient that divides it and checks the result. On CUDA the gradients of a device
// go in tensor lists (a few launches for all of them), whose checks set one flag there, read
// back once: a run waits for the GPU once per device per iteration, not once per parameter.

#include "optim/grad_scaler.h"

#include <atomic>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "autograd/graph.h"
#include "autograd/ops/elementwise.h"
#include "tensor/accelerator.h"
#include "tensor/copy.h"
#include "tensor/optim.h"

namespace loom::optim {

namespace {

namespace k = loom::kernels;

// `where` opens the messages; the fields are named `prefix` + their name (the constructor's
// options, or the checkpoint keys load_state read them from).
void validate(const GradScalerOptions& o, const std::string& where, const std::string& prefix,
              const std::string& scale_name) {
  LOOM_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, ValueError, where,
             ": expected a finite ", prefix, scale_name, " > 0; got ", prefix, scale_name, "=",
             o.init_scale);
  LOOM_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1, ValueError, where,
             ": expected ", prefix, "growth_factor > 1; got ", prefix,
             "growth_factor=", o.growth_factor);
  LOOM_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, ValueError, where, ": expected ", prefix,
             "backoff_factor in (0, 1); got ", prefix, "backoff_factor=", o.backoff_factor);
  LOOM_CHECK(o.growth_interval >= 1, ValueError, where, ": expected ", prefix,
             "growth_interval >= 1; got ", prefix, "growth_interval=", o.growth_interval);
}

// The scale grows only while a float32 loss times the scale can stay finite (PyTorch keeps the
// scale in a float32 tensor and refuses a growth that would make it inf).
constexpr double kMaxScale = std::numeric_limits<float>::max();

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  validate(options_, "GradScaler", "", "init_scale");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  LOOM_CHECK(loss.defined(), ValueError, "GradScaler: scale: the loss is an undefined tensor");
  return loss * scale_;  // backward: dloss = S dout, so every gradient comes out times S
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled) return;
  // The found-inf read below must not throw an earlier op's deferred check (Note [Deferred device
  // checks]) with the gradients unscaled and the record not saying so.
  DeferredChecksHold hold;
  OptimizerRecord& record = records_[&optimizer];
  LOOM_CHECK(!record.unscaled, ValueError, "GradScaler: unscale_ was already called for this ",
             optimizer.name(), " optimizer since the last update() (step() calls it when it was ",
             "not)");
  // Each gradient g becomes g / S in place, checked as it is written. A gradient is often a
  // view into a DDP bucket: a dense one (row-major or channels-last) is unscaled where it lies,
  // any other through a contiguous copy written back.
  const double inv_scale = 1.0 / scale_;
  bool local_found_inf = false;
  std::vector<std::pair<Device, Tensor>> device_flags;  // int32 [1] on each device: 1 = inf
  {
    autograd::NoGradGuard no_grad;
    // The gradients are unscaled together after the loop, one list per device and dtype (on
    // CUDA a few launches); (g, grad) pairs where g is a contiguous copy are written back after.
    std::vector<Tensor> dense;
    std::vector<std::pair<Tensor, Tensor>> to_finish;
    for (const Tensor& param : optimizer.params()) {
      const Tensor grad = param.grad();
      if (!grad.defined() || grad.numel() == 0) continue;
      const Tensor g = k::is_dense(grad) ? grad : k::contiguous(grad);
      dense.push_back(g);
      to_finish.emplace_back(g, grad);
    }
    for_each_group(dense, device_and_dtype, [&](std::span<const Tensor> list) {
      const Device device = list.front().device();
      auto it = device_flags.begin();
      while (it != device_flags.end() && !(it->first == device)) ++it;
      if (it == device_flags.end())
        it = device_flags.insert(it, {device, zeros({1}, kInt32, device)});
      k::unscale_and_check_(list, inv_scale, it->second);
    });
    for (const auto& [g, grad] : to_finish) {
      if (!g.is_same(grad))
        k::copy_(grad, g);  // bumps grad's version
      else
        grad.bump_version();
    }
  }
  for (const auto& [device, flag] : device_flags)
    if (flag.item() != 0.0) local_found_inf = true;
  record.found_inf = agree_ ? agree_(local_found_inf) : local_found_inf;
  record.unscaled = true;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  OptimizerRecord& record = records_[&optimizer];
  LOOM_CHECK(!record.stepped, ValueError, "GradScaler: step was already called for this ",
             optimizer.name(), " optimizer since the last update()");
  if (!record.unscaled) unscale_(optimizer);
  record.stepped = true;
  if (record.found_inf) return false;  // the gradients overflowed: skip (update() backs off)
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool unscaled = false, found_inf = false;
  for (const auto& [optimizer, record] : records_) {
    unscaled = unscaled || record.unscaled;
    found_inf = found_inf || record.found_inf;
  }
  LOOM_CHECK(unscaled, ValueError,
             "GradScaler: update: no optimizer was unscaled (by unscale_ or step) since the last "
             "update()");
  records_.clear();
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    if (grown <= kMaxScale) scale_ = grown;
    growth_tracker_ = 0;
  }
}

double GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0; }

void GradScaler::set_found_inf_agreement(std::function<bool(bool)> agree) {
  agree_ = std::move(agree);
}

void GradScaler::save_state(NamedTensors& /*tensors*/, Metadata& meta,
                            const std::string& prefix) const {
  meta[prefix + "scale"] = format_double(scale_);
  meta[prefix + "growth_tracker"] = std::to_string(growth_tracker_);
  meta[prefix + "growth_factor"] = format_double(options_.growth_factor);
  meta[prefix + "backoff_factor"] = format_double(options_.backoff_factor);
  meta[prefix + "growth_interval"] = std::to_string(options_.growth_interval);
  meta[prefix + "enabled"] = options_.enabled ? "true" : "false";
}

void GradScaler::load_state(const SafetensorsFile& file, const std::string& prefix) {
  const std::string where = "GradScaler: load_state";
  auto read = [&](const std::string& key) {
    const auto it = file.metadata.find(prefix + key);
    LOOM_CHECK(it != file.metadata.end(), ValueError, where, ": the checkpoint has no ",
               prefix + key, " in its metadata");
    return it->second;
  };
  auto read_int = [&](const std::string& key) {
    const std::string text = read(key);
    int64_t value = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    LOOM_CHECK(ec == std::errc() && ptr == end && !text.empty(), ValueError, where, ": ",
               prefix + key, ": expected an integer; got \"", text, "\"");
    return value;
  };
  GradScalerOptions loaded = options_;
  loaded.init_scale = parse_double(read("scale"), where + ": " + prefix + "scale");
  loaded.growth_factor =
      parse_double(read("growth_factor"), where + ": " + prefix + "growth_factor");
  loaded.backoff_factor =
      parse_double(read("backoff_factor"), where + ": " + prefix + "backoff_factor");
  loaded.growth_interval = read_int("growth_interval");
  const int64_t tracker = read_int("growth_tracker");
  const std::string enabled = read("enabled");
  LOOM_CHECK(enabled == "true" || enabled == "false", ValueError, where, ": ", prefix,
             "enabled: expected true or false; got \"", enabled, "\"");
  validate(loaded, where, prefix, "scale");
  LOOM_CHECK(tracker >= 0 && tracker < loaded.growth_interval, ValueError, where, ": ", prefix,
             "growth_tracker holds ", tracker, "; expected 0 <= it < ", prefix,
             "growth_interval=", loaded.growth_interval);
  // Everything read back: commit.
  scale_ = loaded.init_scale;
  growth_tracker_ = tracker;
  options_.growth_factor = loaded.growth_factor;
  options_.backoff_factor = loaded.backoff_factor;
  options_.growth_interval = loaded.growth_interval;
  records_.clear();
}

}  // namespace loom::optim

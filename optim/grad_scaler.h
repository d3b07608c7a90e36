// optim/grad_scaler.h — dynamic loss scaling for mixed-precision training, as
// torch.cuda.amp.GradScaler: scale the loss before backward, unscale the gradients before the
// optimizer uses them, skip the steps whose gradients overflowed and adapt the scale.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "optim/optimizer.h"

namespace loom::optim {

// Note [Dynamic loss scaling]
// float16 keeps 5 exponent bits: its smallest subnormal is 2^-24 (about 6e-8) and its largest
// value 65504. Gradients of a well-trained network are often far smaller than the loss, and in
// float16 the ones below 2^-24 flush to zero: the update they carried is lost. Multiplying the
// loss by a scale S multiplies every gradient of the backward by S (the chain rule is linear),
// which shifts the small ones back into float16's range; the optimizer then takes g / S, in
// float32, as the gradient. A power-of-two S changes only exponents, so scaling and unscaling
// are exact (no rounding) as long as nothing overflows or flushes to zero.
// S cannot be known in advance, so it is found on the way:
//   - an inf or NaN in the unscaled gradients means S was too large (something overflowed):
//     the step is skipped (its gradients are garbage) and S *= backoff_factor (halved);
//   - after growth_interval clean steps in a row S *= growth_factor (doubled), to try the
//     largest scale that does not overflow: the higher S, the fewer gradients flush to zero.
// A skipped step costs one batch; growth is rare (every 2000 steps by default), so at most about
// one step in 2000 is lost once the scale has settled.
// unscale_ must come before anything that reads the gradients' magnitude — clip_grad_norm_ above
// all: clipping scaled gradients would compare S * |g| with max_norm, clip by the wrong factor
// (and by a different one at each change of S). So the loop is:
//     Tensor loss = ...;  scaler.scale(loss).backward();
//     scaler.unscale_(optimizer);                       // only when clipping (or inspecting)
//     clip_grad_norm_(optimizer.params(), max_norm);
//     scaler.step(optimizer);                           // unscales if not done yet; may skip
//     scaler.update();
//     optimizer.zero_grad();
// With several optimizers, unscale_/step each of them, then update() once.
struct GradScalerOptions {
  double init_scale = 65536.0;     // 2^16
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // clean steps in a row before the scale grows
  bool enabled = true;             // false: scale() is the identity, step() just steps
};

class GradScaler {
 public:
  // ValueError ("GradScaler: ...") for init_scale <= 0 or not finite, growth_factor <= 1,
  // backoff_factor outside (0, 1), growth_interval < 1.
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale, differentiable; the loss itself when disabled.
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient of optimizer.params() by the scale, in place (parameters without a
  // gradient are skipped), and records for this optimizer whether any of them holds an inf or a
  // NaN (agreed across ranks, see set_found_inf_agreement). ValueError when already called for
  // this optimizer since the last update() (step() calls it when it was not). No-op when disabled.
  void unscale_(Optimizer& optimizer);
  // Unscales (when unscale_ was not called for this optimizer since the last update()), then
  // calls optimizer.step() unless an inf or NaN was found. Returns whether it stepped.
  // ValueError when step() was already called for this optimizer since the last update().
  // Disabled: steps and returns true.
  bool step(Optimizer& optimizer);
  // Adapts the scale (Note [Dynamic loss scaling]) from what unscale_ found since the last
  // update(), in any optimizer, and starts a new iteration. ValueError when no optimizer was
  // unscaled since the last update() (as PyTorch). Disabled: no-op.
  void update();

  // The current scale; 1 when disabled (as PyTorch).
  double get_scale() const;
  // Clean steps in a row since the scale last changed.
  int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // Under data parallelism every rank must skip the same steps, or the replicas drift apart.
  // `agree` is called exactly once per unscale_ with the local flag (an inf or NaN found in this
  // rank's gradients) and returns the flag all ranks agreed on (dist/ provides one built on an
  // allreduce; optim does not depend on dist); that flag is what step() and update() use.
  // An empty function (the default) takes the local flag as it is.
  void set_found_inf_agreement(std::function<bool(bool)> agree);

  // Metadata <prefix>scale, <prefix>growth_tracker, <prefix>growth_factor,
  // <prefix>backoff_factor, <prefix>growth_interval, <prefix>enabled; no tensors.
  void save_state(NamedTensors& tensors, Metadata& meta, const std::string& prefix) const;
  // Restores the scale, the tracker and the growth/backoff factors and interval; checks every key
  // before it changes anything (ValueError naming a missing or malformed key). `enabled` is
  // checked but this scaler keeps its own: whether to scale is the run's choice (a run resumed
  // in float32 turns scaling off), the scale is the file's. Starts a new iteration.
  void load_state(const SafetensorsFile& file, const std::string& prefix);

 private:
  // What this iteration (since the last update()) did with one optimizer.
  struct OptimizerRecord {
    bool unscaled = false;
    bool stepped = false;
    bool found_inf = false;  // the agreed flag
  };

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  std::function<bool(bool)> agree_;
  std::map<const Optimizer*, OptimizerRecord> records_;
};

}  // namespace loom::optim

// optim/schedule.cpp — the learning-rate schedules in closed form (Note [Schedule steps] in
// optim/schedule.h). PyTorch computes most of them recursively from the previous lr; the closed
// forms agree with those to rounding (the tests compare within 1e-10).

#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace loom::optim {

// ---------------------------------------------------------------- LRSchedule

LRSchedule::LRSchedule(Optimizer& optimizer, std::string name)
    : base_lr_(optimizer.lr()), optimizer_(optimizer), name_(std::move(name)) {}

void LRSchedule::check_step(int64_t step) const {
  LOOM_CHECK(step >= 0, ValueError, name_, ": lr_at: expected a step >= 0; got step=", step);
}

// The optimizer refuses a negative lr. Only OneCycleLR's linear anneal makes one, extrapolated
// at step total_steps, which no optimizer step uses in PyTorch's loop: the optimizer gets 0.
void LRSchedule::set_optimizer_lr(double lr) const { optimizer_.set_lr(std::max(lr, 0.0)); }

void LRSchedule::apply() {
  set_optimizer_lr(lr_at(step_));
  on_step(step_);
}

void LRSchedule::step() {
  const double lr = lr_at(step_ + 1);  // may raise (OneCycleLR past its end): nothing changes
  ++step_;
  set_optimizer_lr(lr);
  on_step(step_);
}

void LRSchedule::save_state(NamedTensors& /*tensors*/, Metadata& meta,
                            const std::string& prefix) const {
  meta[prefix + "schedule"] = name_;
  meta[prefix + "step"] = std::to_string(step_);
  meta[prefix + "base_lr"] = format_double(base_lr_);
}

void LRSchedule::load_state(const SafetensorsFile& file, const std::string& prefix) {
  auto read = [&](const std::string& key) {
    const auto it = file.metadata.find(prefix + key);
    LOOM_CHECK(it != file.metadata.end(), ValueError, name_, ": load_state: the checkpoint has no ",
               prefix + key, " in its metadata");
    return it->second;
  };
  const std::string kind = read("schedule");
  LOOM_CHECK(kind == name_, ValueError, name_, ": load_state: ", prefix,
             "schedule holds the state of ", kind, ", not ", name_);
  const double step = parse_double(read("step"), name_ + ": load_state: " + prefix + "step");
  LOOM_CHECK(step >= 0 && step == std::floor(step) && step < 9.0e15, ValueError, name_,
             ": load_state: ", prefix, "step holds ", step, "; expected a whole number >= 0");
  const double base_lr =
      parse_double(read("base_lr"), name_ + ": load_state: " + prefix + "base_lr");
  LOOM_CHECK(std::isfinite(base_lr) && base_lr >= 0, ValueError, name_, ": load_state: ", prefix,
             "base_lr holds ", base_lr, "; expected a finite lr >= 0");
  const double previous_base_lr = base_lr_;
  base_lr_ = base_lr;
  double lr = 0;
  try {
    lr = lr_at(static_cast<int64_t>(step));
  } catch (...) {
    base_lr_ = previous_base_lr;
    throw;
  }
  step_ = static_cast<int64_t>(step);
  set_optimizer_lr(lr);
  on_step(step_);
}

// ---------------------------------------------------------------- StepLR

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRSchedule(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  LOOM_CHECK(step_size > 0, ValueError,
             "StepLR: expected step_size > 0; got step_size=", step_size);
  LOOM_CHECK(std::isfinite(gamma) && gamma >= 0, ValueError,
             "StepLR: expected a finite gamma >= 0; got gamma=", gamma);
  apply();
}

double StepLR::lr_at(int64_t step) const {
  check_step(step);
  return base_lr_ * std::pow(gamma_, static_cast<double>(step / step_size_));
}

// ---------------------------------------------------------------- MultiStepLR

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRSchedule(optimizer, "MultiStepLR"), milestones_(std::move(milestones)), gamma_(gamma) {
  LOOM_CHECK(std::isfinite(gamma) && gamma >= 0, ValueError,
             "MultiStepLR: expected a finite gamma >= 0; got gamma=", gamma);
  std::sort(milestones_.begin(), milestones_.end());
  apply();
}

double MultiStepLR::lr_at(int64_t step) const {
  check_step(step);
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step);
  return base_lr_ * std::pow(gamma_, static_cast<double>(passed - milestones_.begin()));
}

// ---------------------------------------------------------------- CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRSchedule(optimizer, "CosineAnnealingLR"), t_max_(t_max), eta_min_(eta_min) {
  LOOM_CHECK(t_max > 0, ValueError, "CosineAnnealingLR: expected T_max > 0; got T_max=", t_max);
  LOOM_CHECK(std::isfinite(eta_min) && eta_min >= 0, ValueError,
             "CosineAnnealingLR: expected a finite eta_min >= 0; got eta_min=", eta_min);
  apply();
}

double CosineAnnealingLR::lr_at(int64_t step) const {
  check_step(step);
  const double phase = std::numbers::pi * static_cast<double>(step) / static_cast<double>(t_max_);
  return eta_min_ + (base_lr_ - eta_min_) * (1 + std::cos(phase)) / 2;
}

// ---------------------------------------------------------------- LinearWarmup

LinearWarmup::LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor,
                           std::unique_ptr<LRSchedule> after)
    : LRSchedule(optimizer, "LinearWarmup"),
      warmup_steps_(warmup_steps),
      start_factor_(start_factor),
      after_(std::move(after)) {
  LOOM_CHECK(warmup_steps > 0, ValueError,
             "LinearWarmup: expected warmup_steps > 0; got warmup_steps=", warmup_steps);
  LOOM_CHECK(start_factor > 0 && start_factor <= 1, ValueError,
             "LinearWarmup: expected 0 < start_factor <= 1; got start_factor=", start_factor);
  if (after_) {
    LOOM_CHECK(&after_->optimizer() == &optimizer, ValueError,
               "LinearWarmup: the schedule after "
               "the warmup (",
               after_->name(), ") drives another optimizer");
    base_lr_ = after_->base_lr();
  }
  apply();
}

double LinearWarmup::lr_at(int64_t step) const {
  check_step(step);
  if (step < warmup_steps_)
    return base_lr_ * (start_factor_ + (1.0 - start_factor_) * static_cast<double>(step) /
                                           static_cast<double>(warmup_steps_));
  return after_ ? after_->lr_at(step - warmup_steps_) : base_lr_;
}

void LinearWarmup::save_state(NamedTensors& tensors, Metadata& meta,
                              const std::string& prefix) const {
  LRSchedule::save_state(tensors, meta, prefix);
  if (after_) after_->save_state(tensors, meta, prefix + "after.");
}

void LinearWarmup::load_state(const SafetensorsFile& file, const std::string& prefix) {
  if (after_) after_->load_state(file, prefix + "after.");
  LRSchedule::load_state(file, prefix);  // last: the optimizer's lr is the warmup's
}

// ---------------------------------------------------------------- OneCycleLR

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
                       OneCycleOptions options)
    : LRSchedule(optimizer, "OneCycleLR"),
      max_lr_(max_lr),
      total_steps_(total_steps),
      options_(options) {
  LOOM_CHECK(total_steps > 0, ValueError,
             "OneCycleLR: expected total_steps > 0; got total_steps=", total_steps);
  LOOM_CHECK(std::isfinite(max_lr) && max_lr >= 0, ValueError,
             "OneCycleLR: expected a finite max_lr >= 0; got max_lr=", max_lr);
  LOOM_CHECK(options.pct_start >= 0 && options.pct_start <= 1, ValueError,
             "OneCycleLR: expected 0 <= pct_start <= 1; got pct_start=", options.pct_start);
  LOOM_CHECK(std::isfinite(options.div_factor) && options.div_factor > 0, ValueError,
             "OneCycleLR: expected div_factor > 0; got div_factor=", options.div_factor);
  LOOM_CHECK(
      std::isfinite(options.final_div_factor) && options.final_div_factor > 0, ValueError,
      "OneCycleLR: expected final_div_factor > 0; got final_div_factor=", options.final_div_factor);
  const double initial_lr = max_lr / options.div_factor;
  const double min_lr = initial_lr / options.final_div_factor;
  const double total = static_cast<double>(total_steps), rise = options.pct_start * total;
  const double hi = options.max_momentum, lo = options.base_momentum;
  if (options.three_phase)
    phases_ = {{rise - 1, initial_lr, max_lr, hi, lo},
               {2 * rise - 2, max_lr, initial_lr, lo, hi},
               {total - 1, initial_lr, min_lr, hi, hi}};
  else
    phases_ = {{rise - 1, initial_lr, max_lr, hi, lo}, {total - 1, max_lr, min_lr, lo, hi}};
  if (options.cycle_momentum) {
    LOOM_CHECK(0 <= lo && lo <= hi && hi <= 1, ValueError,
               "OneCycleLR: expected 0 <= base_momentum <= max_momentum <= 1; got base_momentum=",
               lo, " max_momentum=", hi);
    (void)optimizer.momentum();  // NotImplementedError for an optimizer without one
  }
  // A phase of zero length would divide by zero (PyTorch raises ZeroDivisionError there).
  double start = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    LOOM_CHECK(phases_[i].end_step != start, ValueError, "OneCycleLR: phase ", i,
               " has no steps with total_steps=", total_steps, " pct_start=", options.pct_start,
               "; choose more steps or another pct_start");
    start = phases_[i].end_step;
  }
  base_lr_ = initial_lr;  // PyTorch's initial_lr
  apply();
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::locate(int64_t step) const {
  check_step(step);
  LOOM_CHECK(step <= total_steps_, ValueError, "OneCycleLR: step ", step,
             " is past total_steps=", total_steps_);
  const double s = static_cast<double>(step);
  double start = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& phase = phases_[i];
    if (s <= phase.end_step || i + 1 == phases_.size()) {
      return {&phase, (s - start) / (phase.end_step - start)};
    }
    start = phase.end_step;
  }
  LOOM_ASSERT(false, "OneCycleLR: no phase");
  return {nullptr, 0.0};
}

// From `start` (pct 0) to `end` (pct 1), in PyTorch's formulas.
double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal == Anneal::Linear) return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
}

double OneCycleLR::lr_at(int64_t step) const {
  const auto [phase, pct] = locate(step);
  return anneal(phase->start_lr, phase->end_lr, pct);
}

double OneCycleLR::momentum_at(int64_t step) const {
  const auto [phase, pct] = locate(step);
  return anneal(phase->start_momentum, phase->end_momentum, pct);
}

void OneCycleLR::on_step(int64_t step) {
  if (options_.cycle_momentum) optimizer().set_momentum(momentum_at(step));
}

}  // namespace loom::optim

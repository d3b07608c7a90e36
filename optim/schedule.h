// optim/schedule.h — learning-rate schedules: each is a pure function lr_at(step) of the step
// count, plus a counter that sets the optimizer's lr as training advances. The numbers are those
// of torch.optim.lr_scheduler's classes (StepLR, MultiStepLR, CosineAnnealingLR, LinearLR and
// SequentialLR, OneCycleLR).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace loom::optim {

// Note [Schedule steps]
// lr_at(s) is the lr of optimizer step s + 1: lr_at(0) is the lr of the first optimizer.step().
// A schedule sets the optimizer's lr to lr_at(0) when constructed and to lr_at(s) at its s-th
// step(), so the loop is PyTorch's:
//     for (...) { ...backward...; optimizer.step(); schedule.step(); }
// Being a function of s alone, a schedule resumes from a checkpoint by its counter: load_state
// sets the counter and the optimizer's lr = lr_at(counter). base_lr is the optimizer's lr when the
// schedule was constructed (PyTorch's initial_lr); it is saved too, so a schedule constructed
// after the optimizer's state was loaded still resumes right.
class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  LRSchedule(const LRSchedule&) = delete;
  LRSchedule& operator=(const LRSchedule&) = delete;

  // The lr of optimizer step `step` + 1. ValueError for a negative step.
  virtual double lr_at(int64_t step) const = 0;
  // Advances the counter and sets the optimizer's lr to lr_at(counter).
  void step();
  int64_t step_count() const { return step_; }
  double base_lr() const { return base_lr_; }
  const std::string& name() const { return name_; }
  Optimizer& optimizer() const { return optimizer_; }

  // Metadata <prefix>schedule (the class), <prefix>step and <prefix>base_lr.
  virtual void save_state(NamedTensors& tensors, Metadata& meta, const std::string& prefix) const;
  // ValueError naming the key when absent, or when the file holds another class's state.
  virtual void load_state(const SafetensorsFile& file, const std::string& prefix);

 protected:
  // Reads base_lr from the optimizer, which must outlive the schedule.
  LRSchedule(Optimizer& optimizer, std::string name);
  // Sets the optimizer's lr to lr_at(step_count()); each constructor calls it last.
  void apply();
  // Called after each change of the optimizer's lr (construction, step, load_state) with the
  // step whose lr was set: schedules that drive more than the lr do it here.
  virtual void on_step(int64_t /*step*/) {}
  void check_step(int64_t step) const;  // ValueError when negative
  void set_optimizer_lr(double lr) const;

  double base_lr_;

 private:
  Optimizer& optimizer_;
  std::string name_;
  int64_t step_ = 0;
};

// base_lr * gamma^(step / step_size)
class StepLR : public LRSchedule {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// base_lr * gamma^(number of milestones <= step); a milestone given twice counts twice, as in
// PyTorch. Milestones may come in any order.
class MultiStepLR : public LRSchedule {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2; past T_max the cosine goes
// on (back up to base_lr at 2 T_max), as PyTorch's does.
class CosineAnnealingLR : public LRSchedule {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  double lr_at(int64_t step) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// A linear ramp from base_lr * start_factor (step 0) towards base_lr over warmup_steps, then
// `after` (its lr_at(step - warmup_steps)), or base_lr when there is none. PyTorch:
// LinearLR(start_factor, total_iters=warmup_steps) alone, or
// SequentialLR([LinearLR(...), after], milestones=[warmup_steps]). Construct `after` first, on
// the same optimizer; the warmup ramps to after's base_lr.
class LinearWarmup : public LRSchedule {
 public:
  LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor,
               std::unique_ptr<LRSchedule> after = nullptr);
  double lr_at(int64_t step) const override;
  // Also saves and loads `after` under <prefix>after.
  void save_state(NamedTensors& tensors, Metadata& meta, const std::string& prefix) const override;
  void load_state(const SafetensorsFile& file, const std::string& prefix) override;

 private:
  int64_t warmup_steps_;
  double start_factor_;
  std::unique_ptr<LRSchedule> after_;
};

enum class Anneal { Cos, Linear };

struct OneCycleOptions {
  double pct_start = 0.3;  // the fraction of steps spent rising
  Anneal anneal = Anneal::Cos;
  double div_factor = 25;         // initial lr = max_lr / div_factor
  double final_div_factor = 1e4;  // min lr = initial lr / final_div_factor
  bool three_phase = false;       // rise, fall back to the initial lr, then anneal to min lr
  // PyTorch's default: the optimizer's momentum (SGD) or beta1 (Adam) moves against the lr,
  // from max_momentum down to base_momentum while the lr rises, and back while it falls.
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
};

// torch.optim.lr_scheduler.OneCycleLR: its lr and (cycle_momentum) its momentum, step by step.
// The optimizer's lr at construction is ignored: base_lr() is max_lr / div_factor.
// lr_at(step) for step > total_steps raises ValueError, as PyTorch does.
class OneCycleLR : public LRSchedule {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
             OneCycleOptions options = {});
  double lr_at(int64_t step) const override;
  double momentum_at(int64_t step) const;  // the momentum of optimizer step `step` + 1

 protected:
  void on_step(int64_t step) override;  // sets the momentum when cycling

 private:
  struct Phase {
    double end_step;
    double start_lr;
    double end_lr;
    double start_momentum;
    double end_momentum;
  };
  // The phase holding `step` and how far through it the step is (0 to 1).
  std::pair<const Phase*, double> locate(int64_t step) const;
  double anneal(double start, double end, double pct) const;
  double max_lr_;
  int64_t total_steps_;
  OneCycleOptions options_;
  std::vector<Phase> phases_;
};

}  // namespace loom::optim

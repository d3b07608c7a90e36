// dist/trace.h — a timeline of what each rank did, in the Chrome trace format (open the file in
// chrome://tracing or ui.perfetto.dev): one row per rank and thread, one box per phase of a
// step (data, forward, backward, optimizer) and per bucket allreduce (or, under FSDP, per unit
// all-gather and reduce-scatter) from launch to completion.
// Times are the steady clock's, shared by the processes of one machine. StepTimeline is what a
// training loop calls: it marks the phases as they end, adds each bucket's allreduce from the
// reducer's timeline, and keeps the reducer's overlap (how much communication backward hid).
#pragma once

#include <string>
#include <vector>

#include "dist/process_group.h"  // steady_seconds
#include "dist/store.h"

namespace loom::dist {
class Reducer;
struct FSDPTimeline;
}  // namespace loom::dist

namespace loom::dist {

class Trace {
 public:
  explicit Trace(int rank) : rank_(rank) {}
  // A box from start to end (steady-clock seconds) on row `thread` of this rank.
  void add(const std::string& name, const std::string& category, double start, double end,
           int thread = 0);
  size_t size() const { return events_.size(); }
  // This rank's events as a JSON array of Chrome trace events.
  std::string events_json() const;
  // Every rank's events into one file: ranks publish theirs through the store, rank 0 waits
  // for all `world_size` of them and writes `path` atomically. Call on every rank. Without a
  // store (one process) this rank's events alone are written.
  void write(const std::string& path, Store* store, int world_size) const;

 private:
  struct Event {
    std::string name, category;
    double start, end;
    int thread;
  };
  int rank_;
  std::vector<Event> events_;
};

// The phases of training steps, one after the other on row 0: mark(name) closes the box that
// began at the previous mark (or restart()), then end_step adds each bucket's allreduce of the
// step's synchronised backward on row 1 and counts its overlap. Boxes are kept only when
// `record` (--trace); the overlap always.
//   timeline.restart();                  // before waiting for the batch
//   ... next batch ...  timeline.mark("data", "data");
//   ... forward ...     timeline.mark("forward");
//   ... backward ...    timeline.mark("backward");
//   ... step ...        timeline.mark("optimizer"); timeline.end_step(&ddp.reducer());
class StepTimeline {
 public:
  StepTimeline(int rank, bool record) : trace_(rank), record_(record) {}
  void restart() { last_ = steady_seconds(); }
  void mark(const std::string& name, const std::string& category = "compute");
  // The step's buckets and overlap; `reducer` null without data parallelism.
  void end_step(const Reducer* reducer);
  // FSDP's step: each unit's all-gathers and reduce-scatter on row 1, and the reduce-scatters'
  // overlap (Note [FSDP units]).
  void end_step(const FSDPTimeline& fsdp);

  void begin_epoch() { epoch_overlap_ = 0, epoch_steps_ = 0; }
  // The mean share of the allreduce time hidden behind backward, over the steps of this epoch
  // and over all, and how many steps all counts (0 without a reducer).
  double epoch_overlap() const { return epoch_steps_ ? epoch_overlap_ / epoch_steps_ : 0.0; }
  double mean_overlap() const { return steps_ ? overlap_ / steps_ : 0.0; }
  int64_t overlap_steps() const { return steps_; }

  const Trace& trace() const { return trace_; }

 private:
  Trace trace_;
  bool record_;
  double last_ = 0;
  double overlap_ = 0, epoch_overlap_ = 0;
  int64_t steps_ = 0, epoch_steps_ = 0;
};

}  // namespace loom::dist

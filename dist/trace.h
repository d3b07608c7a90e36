// dist/trace.h — a timeline of what each rank did, in the Chrome trace format (open the file in
// chrome://tracing or ui.perfetto.dev): one row per rank and thread, one box per phase of a
// step (data, forward, backward, optimizer) and per bucket allreduce from launch to completion.
// Times are the steady clock's, shared by the processes of one machine.
#pragma once

#include <string>
#include <vector>

#include "dist/process_group.h"  // steady_seconds
#include "dist/store.h"

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

}  // namespace loom::dist

// dist/trace.cpp — Chrome trace events, gathered through the store.

#include "dist/trace.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "tensor/atomic_file.h"
#include "tensor/error.h"

namespace loom::dist {

void Trace::add(const std::string& name, const std::string& category, double start, double end,
                int thread) {
  events_.push_back({name, category, start, end, thread});
}

std::string Trace::events_json() const {
  nlohmann::json out = nlohmann::json::array();
  // Names for the rows: "rank 1" and its threads.
  out.push_back({{"name", "process_name"},
                 {"ph", "M"},
                 {"pid", rank_},
                 {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (int tid : {0, 1})
    out.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", rank_},
                   {"tid", tid},
                   {"args", {{"name", tid == 0 ? "training step" : "gradient allreduce"}}}});
  for (const Event& e : events_)
    out.push_back({{"name", e.name},
                   {"cat", e.category},
                   {"ph", "X"},
                   {"pid", rank_},
                   {"tid", e.thread},
                   {"ts", e.start * 1e6},  // microseconds
                   {"dur", std::max(0.0, e.end - e.start) * 1e6}});
  return out.dump();
}

void Trace::write(const std::string& path, Store* store, int world_size) const {
  nlohmann::json all = nlohmann::json::array();
  if (store) {
    store->set("trace/" + std::to_string(rank_), events_json());
    if (rank_ != 0) return;
    for (int r = 0; r < world_size; ++r)
      for (const auto& e : nlohmann::json::parse(store->get_string("trace/" + std::to_string(r))))
        all.push_back(e);
  } else {
    all = nlohmann::json::parse(events_json());
  }
  const std::string text = nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump();
  AtomicFile file(path, "trace");
  file.write(text.data(), text.size());
  file.commit();
}

void StepTimeline::mark(const std::string& name, const std::string& category) {
  const double now = steady_seconds();
  if (record_) trace_.add(name, category, last_, now);
  last_ = now;
}

void StepTimeline::end_step(const Reducer* reducer) {
  if (!reducer) return;
  const ReducerTimeline& tl = reducer->timeline();
  if (record_)
    for (size_t b = 0; b < tl.launched.size(); ++b)
      trace_.add("allreduce bucket " + std::to_string(b), "communication",
                 tl.start + tl.launched[b], tl.start + tl.completed[b], 1);
  const double overlap = tl.overlap();
  overlap_ += overlap, epoch_overlap_ += overlap;
  ++steps_, ++epoch_steps_;
}

void StepTimeline::end_step(const FSDPTimeline& fsdp) {
  if (record_)
    for (const FSDPTimeline::Event& e : fsdp.events)
      if (e.completed > 0)
        trace_.add(e.what, "communication", fsdp.start + e.launched, fsdp.start + e.completed, 1);
  const double overlap = fsdp.overlap();
  overlap_ += overlap, epoch_overlap_ += overlap;
  ++steps_, ++epoch_steps_;
}

}  // namespace loom::dist

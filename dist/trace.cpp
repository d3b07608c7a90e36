// dist/trace.cpp — Chrome trace events, gathered through the store.

#include "dist/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tensor/error.h"

namespace loom::dist {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
  // Atomic: a temporary file beside the target, then a rename.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(f.good(), IOError, "trace: cannot write ", tmp);
    f << text;
    f.flush();
    LOOM_CHECK(f.good(), IOError, "trace: writing ", tmp, " failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  LOOM_CHECK(!ec, IOError, "trace: cannot rename ", tmp, " to ", path, ": ", ec.message());
}

}  // namespace loom::dist

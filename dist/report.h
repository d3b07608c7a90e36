// dist/report.h — what a training run tells its user: lines on the terminal (rank 0 alone), a
// progress bar redrawn in place, one JSON object per line in a log file (--log-json), and the
// images per second of an epoch with its first step (warm-up) left out; TensorBoard scalars
// (--tensorboard, dist/tensorboard.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dist/job.h"
#include "dist/tensorboard.h"

namespace loom::dist {

// "m:ss" of a number of seconds, rounded.
std::string duration_str(double seconds);
// The first line of `text` with its newline (the summary line of a plan() table).
std::string first_line(const std::string& text);

// Images per second over the steps of an epoch, the first left out (it pays for warm-up) once
// there are two; `seconds` of a step run from taking its batch to the end of its bookkeeping.
class Throughput {
 public:
  void add_step(double seconds, int64_t images);
  void add_seconds(double seconds) { seconds_ += seconds; }  // e.g. waiting for the GPU at the end
  int64_t steps() const { return steps_; }
  double seconds() const { return seconds_; }
  // Of this rank; the job's is world x this (every rank trains the same batches).
  double images_per_s() const;
  // While drawing progress: as images_per_s, but a single step counts (not below 1e-9 s).
  double running_images_per_s() const;
  // Seconds left for `steps_left` steps at this epoch's mean.
  double eta(int64_t steps_left) const { return steps_ ? steps_left * seconds_ / steps_ : 0.0; }

 private:
  double seconds_ = 0, first_seconds_ = 0, last_seconds_ = 0;
  int64_t images_ = 0, first_images_ = 0, last_images_ = 0, steps_ = 0;
};

// One line of the JSON log: keys and values in the order added (the file's objects are written
// with their keys sorted, as nlohmann::json does).
class LogRecord {
 public:
  using Value = std::variant<int64_t, double, bool, std::string>;
  LogRecord& add(std::string key, double v) { return put(std::move(key), v); }
  LogRecord& add(std::string key, int64_t v) { return put(std::move(key), v); }
  LogRecord& add(std::string key, int v) { return put(std::move(key), int64_t{v}); }
  LogRecord& add(std::string key, bool v) { return put(std::move(key), v); }
  LogRecord& add(std::string key, std::string v) { return put(std::move(key), std::move(v)); }
  LogRecord& add(std::string key, const char* v) { return put(std::move(key), std::string(v)); }
  const std::vector<std::pair<std::string, Value>>& fields() const { return fields_; }
  std::string json() const;  // one line, no newline

 private:
  LogRecord& put(std::string key, Value v) {
    fields_.emplace_back(std::move(key), std::move(v));
    return *this;
  }
  std::vector<std::pair<std::string, Value>> fields_;
};

// What the progress bar shows.
struct Progress {
  int64_t epoch = 0;  // counted from 1
  int64_t done = 0, total = 0;
  double loss = 0, accuracy = 0;  // accuracy in [0, 1]
  double images_per_s = 0, seconds_left = 0;
};

class Reporter {
 public:
  // The bar is drawn on rank 0 where `progress_bar` (stdout is a terminal).
  Reporter(const Job& job, bool progress_bar);
  ~Reporter();
  // JSON lines go to `path` (rank 0; empty: no log), after what it holds when `append` (a
  // resumed run), else in a new file. IOError when it cannot be opened.
  void open_log(const std::string& path, bool append);
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // printf to stdout on rank 0, flushed at once.
  template <typename... Args>
  void say(const char* format, Args... args) const {
    if (!leader_) return;
    std::printf(format, args...);
    std::fflush(stdout);
  }
  // Whether the bar is drawn now: at most ten times a second, and at the end of the epoch (the
  // caller reads the running loss back from the device only then).
  bool progress_due(int64_t done, int64_t total) const;
  void progress(const Progress& p);
  void end_progress();  // clears the bar's line
  // A JSON line in the log (rank 0; nothing without a log).
  void log(const LogRecord& record);
  // TensorBoard event files in `dir` (rank 0; empty: none). IOError when it cannot be made.
  void open_tensorboard(const std::string& dir);
  bool tensorboard() const { return writer_ != nullptr; }
  // A point of the scalar `tag` at `step` (nothing without TensorBoard); flush() makes what
  // was added readable.
  void scalar(const std::string& tag, double value, int64_t step);
  void flush();

 private:
  bool leader_, bar_;
  double last_draw_ = -1e30;  // steady-clock seconds
  std::FILE* log_ = nullptr;
  std::unique_ptr<SummaryWriter> writer_;
};

class StepTimeline;

// A run's last lines about communication (rank 0 prints them): the share of the gradients'
// reduction (`reduction`: "allreduce", "reduce-scatter") that backward hid, and, when `trace` is
// not empty, every rank's timeline written there (every rank calls it).
void report_communication(const Reporter& out, const StepTimeline& timeline, const Job& job,
                          const char* reduction, const std::string& trace);

}  // namespace loom::dist

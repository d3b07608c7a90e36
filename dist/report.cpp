// dist/report.cpp — the reporter, its progress bar and JSON log, and the throughput count.

#include "dist/report.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "dist/process_group.h"  // steady_seconds
#include "dist/trace.h"
#include "tensor/error.h"

namespace loom::dist {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n') + 1); }

std::string duration_str(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buf;
}

void Throughput::add_step(double seconds, int64_t images) {
  if (steps_ == 0) first_seconds_ = seconds, first_images_ = images;
  last_seconds_ = seconds, last_images_ = images;
  seconds_ += seconds;
  images_ += images;
  ++steps_;
}

double Throughput::images_per_s() const {
  const auto images = static_cast<double>(images_);
  if (steps_ > 1)
    return (images - static_cast<double>(first_images_)) / (seconds_ - first_seconds_);
  return steps_ == 1 ? images / seconds_ : 0.0;
}

double Throughput::running_images_per_s() const {
  if (steps_ > 1)
    return static_cast<double>(images_ - first_images_) / std::max(1e-9, seconds_ - first_seconds_);
  return static_cast<double>(last_images_) / std::max(1e-9, last_seconds_);
}

std::string LogRecord::json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, value] : fields_)
    std::visit([&, &key = key](const auto& v) { j[key] = v; }, value);
  return j.dump();
}

Reporter::Reporter(const Job& job, bool progress_bar)
    : leader_(job.leader()), bar_(job.leader() && progress_bar) {}

void Reporter::open_log(const std::string& path, bool append) {
  if (path.empty() || !leader_) return;
  if (log_) std::fclose(log_);
  log_ = std::fopen(path.c_str(), append ? "a" : "w");
  LOOM_CHECK(log_ != nullptr, IOError, "cannot open the JSON log ", path);
}

Reporter::~Reporter() {
  if (log_) std::fclose(log_);
}

bool Reporter::progress_due(int64_t done, int64_t total) const {
  return bar_ && (steady_seconds() - last_draw_ >= 0.1 || done >= total);
}

void Reporter::progress(const Progress& p) {
  last_draw_ = steady_seconds();
  constexpr int kWidth = 24;
  const int filled = p.total > 0 ? static_cast<int>(kWidth * p.done / p.total) : kWidth;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), ' ');
  std::printf("\r\033[Kepoch %lld [%s] %lld/%lld  loss %.4f  acc %.2f%%  %.0f img/s  left %s",
              static_cast<long long>(p.epoch), bar.c_str(), static_cast<long long>(p.done),
              static_cast<long long>(p.total), p.loss, 100 * p.accuracy, p.images_per_s,
              duration_str(p.seconds_left).c_str());
  std::fflush(stdout);
}

void Reporter::end_progress() {
  if (bar_) std::printf("\r\033[K");
}

void Reporter::open_tensorboard(const std::string& dir) {
  if (!dir.empty() && leader_) writer_ = std::make_unique<SummaryWriter>(dir);
}

void Reporter::scalar(const std::string& tag, double value, int64_t step) {
  if (writer_) writer_->add_scalar(tag, value, step);
}

void Reporter::flush() {
  if (writer_) writer_->flush();
}

void Reporter::log(const LogRecord& record) {
  if (!log_) return;
  std::fprintf(log_, "%s\n", record.json().c_str());
  std::fflush(log_);
}

void report_communication(const Reporter& out, const StepTimeline& timeline, const Job& job,
                          const char* reduction, const std::string& trace) {
  if (timeline.overlap_steps() > 0)
    out.say("communication hidden behind backward: %.0f%% of the %s time (mean over %lld steps)\n",
            100 * timeline.mean_overlap(), reduction,
            static_cast<long long>(timeline.overlap_steps()));
  if (!trace.empty()) {
    timeline.trace().write(trace, job.store.get(), job.world);
    out.say("trace of %zu events per rank written to %s\n", timeline.trace().size(), trace.c_str());
  }
}

}  // namespace loom::dist

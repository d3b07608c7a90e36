// dist/health.cpp — heartbeats and the job watch of Note [Job health] (dist/health.h).

#include "dist/health.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "dist/process_group.h"  // steady_seconds
#include "tensor/error.h"

namespace loom::dist {

namespace {

// LOOM_HEARTBEAT_FD, read once: -1 when the launcher gave none.
int heartbeat_fd() {
  static const int fd = [] {
    const char* text = std::getenv("LOOM_HEARTBEAT_FD");
    if (text == nullptr || *text == '\0') return -1;
    int value = -1;
    const char* end = text + std::strlen(text);
    const auto [last, ec] = std::from_chars(text, end, value);
    return ec == std::errc() && last == end && value >= 0 ? value : -1;
  }();
  return fd;
}

std::atomic<double> g_last_beat{0};

// The failure the watch found; g_failed turns true once g_failure holds it.
std::atomic<bool> g_failed{false};
std::mutex g_failure_mutex;
std::string g_failure;
std::atomic<bool> g_watching{false};

void record_failure(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_failure_mutex);
  if (g_failed) return;
  g_failure = what;
  g_failed = true;
}

}  // namespace

void heartbeat() {
  const int fd = heartbeat_fd();
  if (fd < 0) return;
  const double now = steady_seconds();
  double last = g_last_beat.load(std::memory_order_relaxed);
  if (now - last < 0.1 || !g_last_beat.compare_exchange_strong(last, now)) return;
  const char beat = 1;
  // The launcher made the pipe non-blocking: a full pipe (a launcher that reads slowly) is
  // beat enough, and a launcher that is gone is not this rank's concern here.
  [[maybe_unused]] const ssize_t n = ::write(fd, &beat, 1);
}

JobWatch::JobWatch(std::shared_ptr<Store> store, Milliseconds poll)
    : store_(std::move(store)), poll_(poll) {
  LOOM_CHECK(store_ != nullptr, ValueError, "JobWatch: the store is null");
  LOOM_CHECK(!g_watching.exchange(true), DistError, "JobWatch: this process already watches a job");
  {
    std::lock_guard<std::mutex> lock(g_failure_mutex);
    g_failure.clear();
    g_failed = false;
  }
  thread_ = std::thread([this] { loop(); });
}

JobWatch::~JobWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  g_watching = false;
}

void JobWatch::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    lock.unlock();
    try {
      if (store_->add("failures", 0) > 0) {
        const Bytes what = store_->get("failure", Milliseconds(2000));
        record_failure(std::string(what.begin(), what.end()));
      }
    } catch (const DistError& e) {
      record_failure(std::string("the job's store does not answer (has the launcher of node 0 "
                                 "stopped, or its host become unreachable?): ") +
                     e.what());
    }
    lock.lock();
    if (g_failed) break;  // nothing more to learn
    wake_.wait_for(lock, poll_, [&] { return stop_; });
  }
}

std::string job_failure_within(Milliseconds patience) {
  const auto end = std::chrono::steady_clock::now() + patience;
  while (g_watching.load() && !g_failed.load() && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(Milliseconds(20));
  return job_failure();
}

std::string job_failure() {
  if (!g_failed.load()) return "";
  std::lock_guard<std::mutex> lock(g_failure_mutex);
  return g_failure;
}

}  // namespace loom::dist

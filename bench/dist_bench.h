// bench/dist_bench.h — what the data-parallel benchmarks share: launching their own workers
// quietly, measuring how much of the machine other processes took meanwhile (it is shared), and
// a temporary file for rank 0's results.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "dist/launch.h"
#include "tensor/error.h"

namespace loom::bench {

namespace dist = loom::dist;
using Clock = std::chrono::steady_clock;

// dist::launch with stderr (the launcher's and the workers') caught in a temporary file: the
// launcher's "starting N worker(s)" line is dropped, anything else (errors) passed on.
inline int launch_quietly(const dist::LaunchOptions& options,
                          const std::vector<std::string>& command) {
  std::fflush(stderr);
  FILE* capture = std::tmpfile();
  LOOM_CHECK(capture != nullptr, ValueError, "launch_quietly: tmpfile failed");
  const int saved = dup(2);
  dup2(fileno(capture), 2);
  int status = 1;
  std::string failure;
  try {
    status = dist::launch(options, command);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::rewind(capture);
  char line[4096];
  while (std::fgets(line, sizeof line, capture))
    if (std::strncmp(line, "loomrun: starting ", 18) != 0) std::fputs(line, stderr);
  std::fclose(capture);
  LOOM_CHECK(failure.empty(), DistError, failure);
  return status;
}

// How many cores other processes kept busy while a job ran: the machine's busy CPU time (from
// /proc/stat, steal included) less this process's and its waited-for children's (the workers'),
// over the wall time. The machine is shared: this says how much of the job's numbers to trust.
class ForeignLoad {
 public:
  ForeignLoad() : wall_(Clock::now()), busy_(machine_busy_seconds()), own_(own_seconds()) {}
  double cores() const {
    const double wall = std::chrono::duration<double>(Clock::now() - wall_).count();
    const double others = (machine_busy_seconds() - busy_) - (own_seconds() - own_);
    return wall > 0 ? std::max(0.0, others / wall) : 0.0;
  }

 private:
  static double machine_busy_seconds() {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    return (user + nice + system + irq + softirq + steal) /
           static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  static double own_seconds() {
    double total = 0;
    for (const int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
      rusage usage{};
      getrusage(who, &usage);
      total += usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
               1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
    }
    return total;
  }
  Clock::time_point wall_;
  double busy_, own_;
};

// A file in /tmp for the workers' results, removed when the launcher is done.
struct ResultFile {
  std::string path;
  explicit ResultFile(const std::string& program) {
    std::string pattern = "/tmp/loom_" + program + "_XXXXXX";
    const int fd = mkstemp(pattern.data());
    LOOM_CHECK(fd >= 0, ValueError, program, ": mkstemp failed");
    close(fd);
    path = pattern;
  }
  ~ResultFile() { std::remove(path.c_str()); }
  ResultFile(const ResultFile&) = delete;
  ResultFile& operator=(const ResultFile&) = delete;
};

// main() of a benchmark that re-launches itself as its workers: `parse` reads the flags into an
// options struct with a `worker` field, then the worker or the launching side runs; errors are
// printed (a worker's with its rank) and exit with status 1.
template <typename Parse, typename Worker, typename Launcher>
int run_bench(int argc, char** argv, Parse&& parse, Worker&& worker, Launcher&& launcher) {
  bool is_worker = false;
  try {
    const auto options = parse(argc, argv);
    is_worker = options.worker;
    return is_worker ? worker(options) : launcher(options, argc, argv);
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    if (is_worker) std::fprintf(stderr, "[rank %s] ", rank ? rank : "?");
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace loom::bench

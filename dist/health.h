// dist/health.h — what a worker tells its launcher and learns from it while it trains: that it
// makes progress (heartbeats), and that the job has failed elsewhere (a rank on another host
// died, hung or raised), so that a collective waiting for a peer that is gone raises DistError
// naming it within a second instead of at the collective's timeout.
//
// Note [Job health]
//   Heartbeats. loomrun gives each worker the write end of a pipe as file descriptor
//   LOOM_HEARTBEAT_FD. heartbeat() writes a byte to it (at most one every 100 ms, never
//   blocking); the training loops beat once per micro-batch and evaluation batch, and a rank
//   waiting in a collective beats while it waits (it is not the one that hangs). A worker that
//   has beaten once and then stays silent for the launcher's --heartbeat-timeout is hung: its
//   launcher stops it and reports it as the job's failure. A worker that never beats (a program
//   that does not use loom, or one still loading its data) is not watched.
//   Failures. A launcher that sees one of its workers fail (exit status, signal, silence)
//   writes what happened under "round/<r>/failure" in the job's store (the first report of the
//   round wins) and increments "round/<r>/failures" (dist/launch.h, Note [Launchers together]).
//   JobWatch, made by join_job when the launcher serves the store, reads that count four times a
//   second on its own connection; job_failure() returns the report once there is one, or why the
//   store stopped answering. ProcessGroupGloo's waits look at it: the collective raises
//   DistError "allreduce(...) cannot finish: rank 3 on node 1 (10.0.0.2) was killed by signal
//   SIGKILL", and the group closes its connections, which ends the collective for the ranks
//   still inside it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dist/store.h"

namespace loom::dist {

// One heartbeat to the launcher (Note [Job health]); a no-op without LOOM_HEARTBEAT_FD.
void heartbeat();

// Polls the job's store for the launchers' failure reports of this round (Note [Job health])
// and publishes what it finds to job_failure(). One per process at a time.
class JobWatch {
 public:
  // `store` is the round's view of the launchers' store ("round/<r>/" prefixed), best a
  // connection of its own with a short timeout; `poll` how often to look.
  JobWatch(std::shared_ptr<Store> store, Milliseconds poll = Milliseconds(250));
  ~JobWatch();
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

 private:
  void loop();

  std::shared_ptr<Store> store_;
  const Milliseconds poll_;
  std::mutex mutex_;
  bool stop_ = false;
  std::condition_variable wake_;
  std::thread thread_;
};

// "" while no failure is known; else what the launchers reported ("rank 3 on node 1 (...) was
// killed by signal SIGKILL"), or why the job's store stopped answering. Cheap: an atomic load
// while there is none.
std::string job_failure();

// A collective failed here (a peer's connection closed): the launchers' report of why, waiting
// for it up to `patience` (a launcher reports within a fraction of a second of a worker's
// death); "" when no job is watched or no report came.
std::string job_failure_within(Milliseconds patience);

}  // namespace loom::dist

// tests/dist/gloo_stuck_worker_test.cpp — Note [A stuck worker] (dist/gloo_process_group.cpp):
// a failed gloo group is released without waiting for a worker that gloo holds, in real
// processes. A program of its own because the worker it leaves behind keeps rank 0's store
// server, and so its connection threads, alive until the process exits: by design, but
// ThreadSanitizer's leak check would report those threads, and only here is that expected.
#include <chrono>
#include <memory>
#include <thread>

#include "dist/health.h"
#include "dist/multiprocess.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "test_util.h"

// Races are still checked here (scripts/sanitize.sh thread); unjoined threads at exit are not.
extern "C" const char* __tsan_default_options() { return "report_thread_leaks=0"; }

namespace loom::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::ms_since;

// Rank 0's worker waits inside gloo for a broadcast that rank 1 never
// joins; a failure reported elsewhere fails the group, and releasing it must not wait for that
// broadcast's timeout (30 s here) before the rank can say why it stopped.
TEST(ProcessGroupGloo, AFailedGroupIsReleasedWithoutWaitingForItsStuckWorker) {
  test::run_ranks(2, [](test::Rank& r) {
    ProcessGroupOptions options;
    options.timeout = 30s;
    options.check_collectives = false;  // so that rank 0's worker enters gloo at once
    auto pg = make_gloo_process_group(r.store, r.rank, r.world_size, options);
    pg->barrier()->wait();
    if (r.rank == 1) {
      r.store->wait({"released"}, 20s);
      return;
    }
    JobWatch watch(std::make_shared<PrefixStore>("job", r.store), 50ms);
    auto work = pg->broadcast(ones({1000}), /*root=*/1);
    std::this_thread::sleep_for(200ms);  // the worker is in gloo's receive by now
    r.store->set("job/failure", std::string("rank 1 (pid 1) on node 1 (test) was killed"));
    r.store->add("job/failures", 1);
    EXPECT_LOOM_ERROR(work->wait(), DistError,
                      {"broadcast #2 (float32 [1000], root 1) cannot finish: rank 1 (pid 1)"});
    const auto start = Clock::now();
    pg.reset();
    EXPECT_LT(ms_since(start), 3000);
    r.store->set("released", std::string("1"));
  });
}

}  // namespace
}  // namespace loom::dist

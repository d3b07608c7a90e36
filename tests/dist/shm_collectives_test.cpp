// tests/dist/shm_collectives_test.cpp — Note [Shared-memory allreduce] in real processes: the
// allreduce and the reduce-scatter fold in rank order across rounds and equal gloo's TCP bits on
// two ranks, the broadcast and the all-gather cross rounds, and the failures (a mismatch, a peer
// that exits, an abort, a timeout) raise promptly; ranks that do not share the namespaces or
// /dev/shm keep TCP.
#include "dist/shm_collectives.h"

#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "dist/multiprocess.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "test_util.h"

namespace loom::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::ms_since;

std::shared_ptr<ProcessGroup> group(test::Rank& r, bool shared_memory, bool checks = true,
                                    Milliseconds timeout = 10s) {
  ProcessGroupOptions options;
  options.timeout = timeout;
  options.shared_memory = shared_memory;
  options.check_collectives = checks;
  return make_gloo_process_group(r.store, r.rank, r.world_size, options);
}

// Rank r's float32 values: not integers, so that the order of the additions shows in the bits.
std::vector<float> values(int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank)) *
           (1.0f + 0.01f * static_cast<float>(i % 97));
  return v;
}

// 1 MiB rounds hold 262144 float32 values: these sizes take one round, a round and a bit, and
// several rounds with a ragged last one, besides tiny ones that leave some ranks no piece.
const std::vector<int64_t> kSizes = {1, 17, 262144 + 5, 3 * 262144 + 100};

void check_rank_order_fold(test::Rank& r) {
  auto pg = group(r, /*shared_memory=*/true);
  EXPECT_EQ(pg->transport(),
            "shared memory (allreduce, broadcast, allgather, reduce_scatter) and tcp (the rest)");
  for (const int64_t n : kSizes) {
    Tensor t = tensor<float>(values(r.rank, n));
    pg->allreduce(t, ReduceOp::Sum)->wait();
    std::vector<float> want = values(0, n);
    for (int q = 1; q < r.world_size; ++q) {
      const std::vector<float> theirs = values(q, n);
      for (int64_t i = 0; i < n; ++i) want[i] += theirs[i];
    }
    const std::vector<float> got = t.to_vector<float>();
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && wrong++ < 3)
        ADD_FAILURE() << r.world_size << " ranks, n=" << n << ": element " << i << " is " << got[i]
                      << ", the rank-order fold " << want[i];
  }
}

TEST(ShmCollectives, AllreduceFoldsInRankOrderAcrossRoundsOnTwoThreeAndFourRanks) {
  for (const int world : {2, 3, 4}) test::run_ranks(world, check_rank_order_fold);
}

TEST(ShmCollectives, TwoRanksGetTheBitsOfGloosTcpAllreduce) {
  test::run_ranks(2, [](test::Rank& r) {
    auto shm = group(r, /*shared_memory=*/true);
    auto tcp = group(r, /*shared_memory=*/false);
    EXPECT_EQ(tcp->transport(), "tcp");
    const int64_t n = 262144 + 77;
    for (DType dtype : {kFloat32, kBFloat16, kFloat64}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        Tensor a = tensor<float>(values(r.rank, n)).to(dtype);
        Tensor b = a.clone();
        shm->allreduce(a, op)->wait();
        tcp->allreduce(b, op)->wait();
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << dtype << " " << to_string(op);
      }
    }
  });
}

TEST(ShmCollectives, BroadcastCrossesRoundsFromAnyRoot) {
  test::run_ranks(3, [](test::Rank& r) {
    auto pg = group(r, /*shared_memory=*/true);
    for (const int root : {1, 2}) {
      const int64_t n = 300000 + root;  // float64: 2.3 MiB, three rounds
      std::vector<double> mine(n);
      for (int64_t i = 0; i < n; ++i) mine[i] = 1000.0 * r.rank + 0.5 * static_cast<double>(i);
      Tensor t = tensor<double>(mine);
      pg->broadcast(t, root)->wait();
      const std::vector<double> got = t.to_vector<double>();
      int wrong = 0;
      for (int64_t i = 0; i < n; ++i)
        if (got[i] != 1000.0 * root + 0.5 * static_cast<double>(i) && wrong++ < 3)
          ADD_FAILURE() << "root " << root << ": element " << i << " is " << got[i];
    }
    // The rounds stay in step after a broadcast: an allreduce still folds right.
    Tensor t = full({1000}, static_cast<double>(r.rank + 1), kFloat64);
    pg->allreduce(t)->wait();
    EXPECT_EQ(t.to_vector<double>()[999], 6.0);
  });
}

// A reduce-scatter round holds 1 MiB / size of every piece: 87376 float32 values on 3 ranks.
void check_reduce_scatter_and_allgather(test::Rank& r) {
  auto pg = group(r, /*shared_memory=*/true);
  const int world = r.world_size;
  for (const int64_t piece : {int64_t{5}, int64_t{2} * 87376 + 5}) {
    // Flat input: world pieces back to back, each rank's values shifted by the piece index.
    Tensor input = tensor<float>(values(r.rank, piece * world));
    Tensor out = empty({piece});
    pg->reduce_scatter_tensor(out, input)->wait();
    std::vector<float> want = values(0, piece * world);
    for (int q = 1; q < world; ++q) {
      const std::vector<float> theirs = values(q, piece * world);
      for (int64_t i = 0; i < piece * world; ++i) want[i] += theirs[i];
    }
    // And in place, out being this rank's piece of the input, as DDP's ZeRO buckets do.
    Tensor in_place = tensor<float>(values(r.rank, piece * world));
    pg->reduce_scatter_tensor(in_place.narrow(0, r.rank * piece, piece), in_place)->wait();
    int wrong = 0;
    for (const std::vector<float>& got :
         {out.to_vector<float>(), in_place.narrow(0, r.rank * piece, piece).to_vector<float>()})
      for (int64_t i = 0; i < piece; ++i)
        if (std::memcmp(&got[i], &want[r.rank * piece + i], sizeof(float)) != 0 && wrong++ < 3)
          ADD_FAILURE() << "reduce_scatter on " << world << " ranks, piece " << piece
                        << ": element " << i << " is " << got[i] << ", the rank-order fold "
                        << want[r.rank * piece + i];

    // All-gather in place: this rank's piece of the flat output is the input.
    Tensor gathered = empty({piece * world});
    Tensor mine = gathered.narrow(0, r.rank * piece, piece);
    mine.copy_(tensor<float>(values(r.rank, piece)));
    pg->allgather_into_tensor(gathered, mine)->wait();
    const std::vector<float> all = gathered.to_vector<float>();
    wrong = 0;
    for (int q = 0; q < world; ++q) {
      const std::vector<float> theirs = values(q, piece);
      for (int64_t i = 0; i < piece; ++i)
        if (all[q * piece + i] != theirs[i] && wrong++ < 3)
          ADD_FAILURE() << "allgather on " << world << " ranks: rank " << q << "'s element " << i
                        << " is " << all[q * piece + i] << ", not " << theirs[i];
    }
  }
}

TEST(ShmCollectives, ReduceScatterAndAllgatherCrossRoundsOnTwoThreeAndFourRanks) {
  for (const int world : {2, 3, 4}) test::run_ranks(world, check_reduce_scatter_and_allgather);
}

TEST(ShmCollectives, TwoRanksGetTheBitsOfTheTcpRingReduceScatter) {
  test::run_ranks(2, [](test::Rank& r) {
    auto shm = group(r, /*shared_memory=*/true);
    auto tcp = group(r, /*shared_memory=*/false);
    for (DType dtype : {kFloat32, kBFloat16}) {
      Tensor input = tensor<float>(values(r.rank, 2 * 300001)).to(dtype);
      Tensor a = empty({300001}, dtype), b = empty({300001}, dtype);
      shm->reduce_scatter_tensor(a, input, ReduceOp::Avg)->wait();
      tcp->reduce_scatter_tensor(b, input, ReduceOp::Avg)->wait();
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << dtype;
    }
  });
}

TEST(ShmCollectives, LoomSharedMemoryZeroKeepsTcp) {
  test::run_ranks(2, [](test::Rank& r) {
    ::setenv("LOOM_SHARED_MEMORY", "0", 1);
    auto pg = make_gloo_process_group(r.store, r.rank, r.world_size, {.timeout = 10s});
    EXPECT_EQ(pg->transport(), "tcp");
    Tensor t = ones({10});
    pg->allreduce(t)->wait();
    EXPECT_EQ(t.to_vector<float>()[9], 2.0f);
  });
}

TEST(ShmCollectives, MismatchedCountsRaiseOnBothRanksEvenWithoutTheChecks) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = group(r, /*shared_memory=*/true, /*checks=*/false);
    Tensor t = ones({r.rank == 0 ? 1000 : 2000});
    EXPECT_LOOM_ERROR(pg->allreduce(t)->wait(), DistError,
                      {"allreduce through shared memory", "1000 float32 values (sum)",
                       "2000 float32 values (sum)"});
  });
}

TEST(ShmCollectives, AnAllreduceAgainstABroadcastRaisesNamingBoth) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = group(r, /*shared_memory=*/true, /*checks=*/false);
    Tensor t = ones({1000});
    EXPECT_LOOM_ERROR((r.rank == 0 ? pg->allreduce(t) : pg->broadcast(t, 0))->wait(), DistError,
                      {"through shared memory", "an allreduce of 1000 float32 values (sum)",
                       "a broadcast of 4000 bytes from rank 0"});
  });
}

TEST(ShmCollectives, APeerThatExitsDuringTheAllreduceIsNamedAtOnce) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = group(r, /*shared_memory=*/true, /*checks=*/false, 20s);
    pg->barrier()->wait();
    if (r.rank == 1) {
      r.store->set("harness/done/1", std::string("1"));  // what the harness would do
      std::fflush(nullptr);
      ::_exit(0);
    }
    const auto start = Clock::now();
    EXPECT_LOOM_ERROR(pg->allreduce(ones({1000}))->wait(), DistError,
                      {"rank 1 (pid", "exited during the collective"});
    EXPECT_LT(ms_since(start), 3000);
  });
}

TEST(ShmCollectives, ARankThatNeverArrivesTimesOutWithoutTheChecks) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = group(r, /*shared_memory=*/true, /*checks=*/false, 500ms);
    if (r.rank == 1) {
      r.store->wait({"raised"}, 10s);
      return;
    }
    const auto start = Clock::now();
    EXPECT_LOOM_ERROR(pg->allreduce(ones({1000}))->wait(), DistError,
                      {"allreduce", "timed out", "waiting for rank 1"});
    EXPECT_GE(ms_since(start), 450);
    r.store->set("raised", std::string("1"));
  });
}

// The class alone, over the job's store: an abort reaches a rank waiting in the segment.
TEST(ShmCollectives, AnAbortEndsThePeersWaitWithItsReason) {
  test::run_ranks(2, [](test::Rank& r) {
    std::string why_not;
    auto shm = ShmCollectives::connect(*r.store, r.rank, r.world_size, 10s, why_not);
    ASSERT_NE(shm, nullptr) << why_not;
    if (r.rank == 1) {
      r.store->wait({"waiting"}, 10s);
      std::this_thread::sleep_for(100ms);
      shm->abort("its loss was NaN");
      return;
    }
    r.store->set("waiting", std::string("1"));
    std::vector<float> data(100, 1.0f);
    const auto start = Clock::now();
    EXPECT_LOOM_ERROR(shm->allreduce(data.data(), 100, kFloat32, ReduceOp::Sum, Clock::now() + 10s,
                                     [] { return std::string(); }),
                      DistError, {"rank 1 gave up on the group: its loss was NaN"});
    EXPECT_LT(ms_since(start), 2000);
  });
}

// Which groups: a rank in another network namespace, or with another /dev/shm, keeps TCP, and
// every rank says why. Needs root (unshare); skipped otherwise.
void check_refused(test::Rank& r, int isolate, const std::string& reason) {
  if (r.rank == 1) {
    ASSERT_EQ(::unshare(isolate), 0) << std::strerror(errno);
    if (isolate & CLONE_NEWNS) {  // a private /dev/shm of its own
      ASSERT_EQ(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0);
      ASSERT_EQ(::mount("tmpfs", "/dev/shm", "tmpfs", 0, nullptr), 0);
    }
  }
  std::string why_not;
  auto shm = ShmCollectives::connect(*r.store, r.rank, r.world_size, 10s, why_not);
  EXPECT_EQ(shm, nullptr);
  EXPECT_NE(why_not.find("rank 1: "), std::string::npos) << why_not;
  EXPECT_NE(why_not.find(reason), std::string::npos) << why_not;
}

TEST(ShmCollectives, ARankInAnotherNetworkNamespaceIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "unshare needs root";
  test::run_ranks(2, [](test::Rank& r) { check_refused(r, CLONE_NEWNET, "namespaces"); });
}

TEST(ShmCollectives, ARankWithAnotherDevShmIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "unshare needs root";
  test::run_ranks(2, [](test::Rank& r) {
    check_refused(r, CLONE_NEWNS, "rank 0's segment is not in this /dev/shm");
  });
}

}  // namespace
}  // namespace loom::dist

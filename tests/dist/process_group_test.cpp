// tests/dist/process_group_test.cpp — ProcessGroupGloo in real processes (2 and 3 ranks): every
// collective against hand-computed values, send/recv, asynchronous work in flight, and the
// failures of Note [Collective checks] (mismatched collectives, a rank that never arrives).
#include "dist/process_group.h"

#include <cstdlib>
#include <thread>

#include "dist/multiprocess.h"
#include "dist/nccl_process_group.h"
#include "dist/store.h"
#include "tensor/accelerator.h"
#include "test_util.h"

namespace loom::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::ms_since;

std::shared_ptr<ProcessGroup> join(test::Rank& r, Milliseconds timeout = 5s,
                                   bool shared_memory = true) {
  ProcessGroupOptions options;
  options.timeout = timeout;
  options.shared_memory = shared_memory;
  return make_gloo_process_group(r.store, r.rank, r.world_size, options);
}

// Rank r's value at element i: small integers of both signs, exact in every dtype.
double value(int rank, int64_t i) { return static_cast<double>(i % 7) - 3.0 + 2.0 * rank; }

Tensor rank_tensor(int rank, int64_t n, DType dtype) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(rank, i);
  return tensor<double>(v).to(dtype);
}

double expected(ReduceOp op, int world, int64_t i, bool integral) {
  double sum = 0, hi = value(0, i), lo = value(0, i);
  for (int r = 0; r < world; ++r) {
    sum += value(r, i);
    hi = std::max(hi, value(r, i));
    lo = std::min(lo, value(r, i));
  }
  switch (op) {
    case ReduceOp::Sum:
      return sum;
    case ReduceOp::Avg:
      return integral ? std::trunc(sum / world) : sum / world;
    case ReduceOp::Max:
      return hi;
    case ReduceOp::Min:
      return lo;
  }
  return 0;
}

// On one host the allreduce goes through shared memory unless `shared_memory` is off (Note
// [Shared-memory allreduce]): both paths.
void check_allreduce_everything(test::Rank& r, bool shared_memory) {
  auto pg = join(r, 5s, shared_memory);
  EXPECT_EQ(pg->backend(), "gloo");
  EXPECT_EQ(pg->transport().find("shared memory") == 0, shared_memory) << pg->transport();
  EXPECT_EQ(pg->rank(), r.rank);
  EXPECT_EQ(pg->size(), r.world_size);
  const int64_t n = 1000;
  for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64, kFloat16, kBFloat16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      Tensor t = rank_tensor(r.rank, n, dtype);
      pg->allreduce(t, op)->wait();
      const std::vector<double> got = t.to_vector<double>();
      const bool integral = dtype == kInt32 || dtype == kInt64;
      int wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        double want = expected(op, r.world_size, i, integral);
        if (dtype == kFloat16 || dtype == kBFloat16) want = scalar_tensor(want).to(dtype).item();
        if (got[i] != want && wrong++ < 3)
          ADD_FAILURE() << "allreduce " << to_string(op) << " " << dtype << " on " << r.world_size
                        << " ranks: element " << i << " is " << got[i] << ", expected " << want;
      }
    }
  }
}

TEST(ProcessGroupGloo, AllreduceEveryOpAndDtypeOnTwoRanks) {
  for (const bool shared_memory : {true, false})
    test::run_ranks(2, [&](test::Rank& r) { check_allreduce_everything(r, shared_memory); });
}

TEST(ProcessGroupGloo, AllreduceEveryOpAndDtypeOnThreeRanks) {
  for (const bool shared_memory : {true, false})
    test::run_ranks(3, [&](test::Rank& r) { check_allreduce_everything(r, shared_memory); });
}

void check_data_movement(test::Rank& r, bool shared_memory) {
  auto pg = join(r, 5s, shared_memory);
  const int world = r.world_size;
  // broadcast from the last rank (not 0).
  const int root = world - 1;
  Tensor b = r.rank == root ? tensor<double>({1.5, -2.5, 3.0}, {3}) : zeros({3}, kFloat64);
  pg->broadcast(b, root)->wait();
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{1.5, -2.5, 3.0}));

  // allgather: rank r contributes [r, 10 r] (int64), out[q] must hold q's.
  Tensor mine = tensor<int64_t>({r.rank, 10 * r.rank}, {2});
  std::vector<Tensor> gathered;
  for (int q = 0; q < world; ++q) gathered.push_back(full({2}, -1, kInt64));
  pg->allgather(gathered, mine)->wait();
  for (int q = 0; q < world; ++q)
    EXPECT_EQ(gathered[q].to_vector<int64_t>(), (std::vector<int64_t>{q, 10 * q})) << "from " << q;

  // reduce_scatter: rank r's input for rank q is [100 q + r, r]; rank q gets the sums.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    std::vector<Tensor> inputs;
    for (int q = 0; q < world; ++q)
      inputs.push_back(tensor<float>({100.0f * q + r.rank, static_cast<float>(r.rank)}, {2}));
    Tensor out = zeros({2});
    pg->reduce_scatter(out, inputs, op)->wait();
    const float ranks_sum = world * (world - 1) / 2.0f;
    std::vector<float> want;
    if (op == ReduceOp::Sum) want = {100.0f * r.rank * world + ranks_sum, ranks_sum};
    if (op == ReduceOp::Avg) want = {100.0f * r.rank + ranks_sum / world, ranks_sum / world};
    if (op == ReduceOp::Max) want = {100.0f * r.rank + world - 1, world - 1.0f};
    EXPECT_EQ(out.to_vector<float>(), want) << to_string(op);
  }

  // barrier: the last rank arrives late; nobody leaves before it arrives.
  r.store->set("before_barrier/" + std::to_string(r.rank), std::string("1"));
  if (r.rank == world - 1) std::this_thread::sleep_for(200ms);
  const auto start = Clock::now();
  pg->barrier()->wait();
  if (r.rank == 0) {
    EXPECT_GE(ms_since(start), 100);
  }
}

TEST(ProcessGroupGloo, BroadcastAllgatherReduceScatterBarrierOnTwoRanks) {
  for (const bool shared_memory : {true, false})
    test::run_ranks(2, [&](test::Rank& r) { check_data_movement(r, shared_memory); });
}

TEST(ProcessGroupGloo, BroadcastAllgatherReduceScatterBarrierOnThreeRanks) {
  for (const bool shared_memory : {true, false})
    test::run_ranks(3, [&](test::Rank& r) { check_data_movement(r, shared_memory); });
}

// The flat collectives against the allreduce: a reduce-scatter of every rank's buffer must give
// each rank its piece of the allreduced buffer (sums in float64 are exact here: small integers),
// and an all-gather in place or from another tensor must lay every rank's piece in rank order.
// The counters must show what Note [Bytes moved] says each call moves.
void check_flat_collectives(test::Rank& r) {
  auto pg = join(r);
  const int world = r.world_size;
  for (DType dtype : {kFloat64, kFloat32, kBFloat16, kInt64}) {
    for (int64_t piece : {int64_t{1}, int64_t{7}, int64_t{40001}}) {
      const int64_t n = piece * world;
      // rank r's element i: (i * 7 + 3 r) mod 11 - 5, small integers exact in bfloat16 sums.
      std::vector<double> values(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        values[i] = static_cast<double>((i * 7 + 3 * r.rank) % 11) - 5;
      Tensor input = tensor<double>(values, {n}).to(dtype);
      Tensor reference = input.clone();
      pg->allreduce(reference)->wait();
      Tensor out = full({piece}, -99, dtype);
      pg->reduce_scatter_tensor(out, input)->wait();
      EXPECT_EQ(out.to(kFloat64).to_vector<double>(),
                reference.narrow(0, r.rank * piece, piece).to(kFloat64).to_vector<double>())
          << dtype << " piece " << piece;
      EXPECT_EQ(input.to(kFloat64).to_vector<double>(), values) << "the input was changed";

      Tensor whole = full({n}, -99, dtype);
      pg->allgather_into_tensor(whole, out)->wait();
      EXPECT_EQ(whole.to(kFloat64).to_vector<double>(), reference.to(kFloat64).to_vector<double>());
      Tensor in_place = full({n}, -99, dtype);
      in_place.narrow(0, r.rank * piece, piece).copy_(out);
      pg->allgather_into_tensor(in_place, in_place.narrow(0, r.rank * piece, piece))->wait();
      EXPECT_EQ(in_place.to(kFloat64).to_vector<double>(),
                reference.to(kFloat64).to_vector<double>());
    }
  }
  Tensor avg = full({2}, 0.0);
  pg->reduce_scatter_tensor(avg, full({2 * world}, static_cast<double>(r.rank)), ReduceOp::Avg)
      ->wait();
  EXPECT_EQ(avg.to_vector<float>(), std::vector<float>(2, (world - 1) / 2.0f));

  // Counters: one fresh count of each op on 4 KiB of float32.
  pg->reset_counters();
  Tensor buffer = zeros({1024 * world});
  Tensor shard = zeros({1024});
  pg->allreduce(buffer)->wait();
  pg->reduce_scatter_tensor(shard, buffer)->wait();
  pg->allgather_into_tensor(buffer, shard)->wait();
  const CollectiveCounters counters = pg->counters();
  const int64_t payload = 4096 * world;
  ASSERT_EQ(counters.size(), 3u);
  EXPECT_EQ(counters.at("allreduce").calls, 1);
  EXPECT_EQ(counters.at("allreduce").payload_bytes, payload);
  EXPECT_EQ(counters.at("allreduce").bus_bytes, 2 * payload * (world - 1) / world);
  EXPECT_EQ(counters.at("reduce_scatter").payload_bytes, payload);
  EXPECT_EQ(counters.at("reduce_scatter").bus_bytes, payload * (world - 1) / world);
  EXPECT_EQ(counters.at("allgather").bus_bytes, payload * (world - 1) / world);
  const std::string table = format_counters(counters);
  EXPECT_NE(table.find("reduce_scatter"), std::string::npos) << table;
  EXPECT_NE(table.find("total"), std::string::npos) << table;
}

TEST(ProcessGroupGloo, FlatReduceScatterAndAllgatherAgreeWithAllreduceOnTwoRanks) {
  test::run_ranks(2, check_flat_collectives);
}

TEST(ProcessGroupGloo, FlatReduceScatterAndAllgatherAgreeWithAllreduceOnThreeRanks) {
  test::run_ranks(3, check_flat_collectives);
}

TEST(ProcessGroupGloo, FlatReduceScatterAndAllgatherAgreeWithAllreduceOnFourRanks) {
  test::run_ranks(4, check_flat_collectives);
}

TEST(ProcessGroupGloo, SendAndRecvIncludingAnExchange) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = join(r);
    const int peer = 1 - r.rank;
    // One way, with two tags received in the opposite order of sending.
    if (r.rank == 0) {
      auto a = pg->send(tensor<float>({1, 2, 3}, {3}), 1, /*tag=*/7);
      auto b = pg->send(tensor<int32_t>({42}, {1}), 1, /*tag=*/8);
      a->wait();
      b->wait();
      EXPECT_TRUE(a->is_completed());
    } else {
      Tensor x = zeros({3}), y = zeros({1}, kInt32);
      auto b = pg->recv(y, 0, 8);
      auto a = pg->recv(x, 0, 7);
      b->wait();
      a->wait();
      EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 2, 3}));
      EXPECT_EQ(y.to_vector<int32_t>(), (std::vector<int32_t>{42}));
    }
    // Both ranks send first, then receive: no deadlock.
    Tensor out = full({1000}, r.rank + 1.0, kFloat64), in = zeros({1000}, kFloat64);
    auto s = pg->send(out, peer);
    auto q = pg->recv(in, peer);
    q->wait();
    s->wait();
    EXPECT_EQ(in.to_vector<double>()[999], peer + 1.0);
    EXPECT_GT(s->finished_at(), 0);
    // A collective still works after point-to-point traffic.
    Tensor t = ones({4});
    pg->allreduce(t)->wait();
    EXPECT_EQ(t.to_vector<float>()[0], 2.0f);
  });
}

TEST(ProcessGroupGloo, SeveralAsyncOpsInFlightThenWaitedInOrder) {
  test::run_ranks(3, [](test::Rank& r) {
    auto pg = join(r);
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 6; ++k) {
      tensors.push_back(full({10000}, (k + 1) * (r.rank + 1), kFloat32));
      works.push_back(pg->allreduce(tensors.back()));
    }
    works.push_back(pg->barrier());
    for (size_t k = 0; k < works.size(); ++k) {
      works[k]->wait();
      EXPECT_TRUE(works[k]->is_completed());
    }
    for (int k = 0; k < 6; ++k)
      EXPECT_EQ(tensors[k].to_vector<float>()[9999], (k + 1) * 6.0f) << "op " << k;  // 1+2+3
    // The worker ran them one after another: a timeline of non-overlapping intervals.
    for (size_t k = 0; k < works.size(); ++k) {
      EXPECT_GT(works[k]->started_at(), 0);
      EXPECT_GE(works[k]->finished_at(), works[k]->started_at());
      if (k > 0) {
        EXPECT_GE(works[k]->started_at(), works[k - 1]->finished_at());
      }
    }
  });
}

TEST(ProcessGroupGloo, WaitWithATimeoutGivesUpButTheOperationGoesOn) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = join(r);
    if (r.rank == 1) std::this_thread::sleep_for(400ms);
    Tensor t = ones({8});
    auto work = pg->allreduce(t);
    if (r.rank == 0) {
      EXPECT_LOOM_ERROR(work->wait(100ms), DistError,
                        {"allreduce #1 (float32 [8], sum)", "gave up after 100 ms"});
      EXPECT_FALSE(work->is_completed());
      EXPECT_EQ(work->finished_at(), 0.0);
    }
    work->wait();
    EXPECT_EQ(t.to_vector<float>()[0], 2.0f);
  });
}

TEST(ProcessGroupGloo, FingerprintKeysAreDeletedOnceEveryRankHasReadThem) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = join(r);
    const int64_t before = r.store->num_keys();
    for (int k = 0; k < 20; ++k) pg->allreduce(ones({4}));
    pg->barrier()->wait();
    pg->barrier()->wait();
    std::this_thread::sleep_for(200ms);              // the deletes run while the worker is idle
    EXPECT_LE(r.store->num_keys(), before + 2 * 2);  // at most the last barrier's keys
  });
}

TEST(ProcessGroupGloo, MismatchedCollectivesRaiseOnBothRanksWithBothFingerprints) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = join(r, 5s);
    Tensor t = ones({r.rank == 0 ? 10 : 11});
    const auto start = Clock::now();
    EXPECT_LOOM_ERROR(pg->allreduce(t)->wait(), DistError,
                      {"allreduce #1", "different collectives", "allreduce(float32 [10], sum)",
                       "allreduce(float32 [11], sum)"});
    EXPECT_LT(ms_since(start), 3000);  // found by the check, not by the timeout
    // The group is unusable from then on.
    EXPECT_LOOM_ERROR(pg->barrier(), DistError, {"barrier", "unusable", "different collectives"});
  });
}

// The same number of elements in another shape is another collective: the fingerprint carries
// the shape and the dtype, not only the count.
TEST(ProcessGroupGloo, AllreducesOfTheSameCountInOtherShapesOrDtypesAreAMismatch) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = join(r, 5s);
    Tensor t = r.rank == 0 ? ones({2, 3}) : ones({3, 2});
    EXPECT_LOOM_ERROR(pg->allreduce(t)->wait(), DistError,
                      {"allreduce #1", "different collectives", "allreduce(float32 [2, 3], sum)",
                       "allreduce(float32 [3, 2], sum)"});
  });
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = join(r, 5s);
    Tensor t = ones({4}, r.rank == 0 ? kFloat32 : kInt32);
    EXPECT_LOOM_ERROR(pg->allreduce(t)->wait(), DistError,
                      {"allreduce #1", "different collectives", "allreduce(float32 [4], sum)",
                       "allreduce(int32 [4], sum)"});
  });
}

// LOOM_CHECK_COLLECTIVES=0 makes the default off: the same call then goes through unchecked (the
// bytes of a [2, 3] and a [3, 2] tensor agree) and the store holds no fingerprint.
TEST(ProcessGroupGloo, LoomCheckCollectivesZeroTurnsTheChecksOffByDefault) {
  test::run_ranks(2, [](test::Rank& r) {
    ::setenv("LOOM_CHECK_COLLECTIVES", "0", 1);
    ProcessGroupOptions options;
    ::unsetenv("LOOM_CHECK_COLLECTIVES");
    EXPECT_FALSE(options.check_collectives);
    EXPECT_TRUE(ProcessGroupOptions{}.check_collectives);
    options.timeout = 5s;
    auto pg = make_gloo_process_group(r.store, r.rank, r.world_size, options);
    const int64_t before = r.store->num_keys();
    Tensor t = r.rank == 0 ? ones({2, 3}) : ones({3, 2});
    pg->allreduce(t)->wait();
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(6, 2.0f));
    EXPECT_EQ(r.store->num_keys(), before);
  });
}

TEST(ProcessGroupGloo, AMismatchOnOneOfThreeRanksRaisesOnAll) {
  test::run_ranks(3, [](test::Rank& r) {
    auto pg = join(r, 5s);
    Tensor t = ones({5});
    pg->allreduce(t)->wait();  // #1 is fine
    const auto start = Clock::now();
    auto work = r.rank == 1 ? pg->broadcast(t, 0) : pg->allreduce(t);
    EXPECT_LOOM_ERROR(work->wait(), DistError,
                      {"#2", "different collectives", "broadcast(float32 [5], root 0)",
                       "allreduce(float32 [5], sum)"});
    EXPECT_LT(ms_since(start), 3000);
  });
}

TEST(ProcessGroupGloo, ARankThatNeverArrivesIsNamedAfterTheTimeout) {
  test::run_ranks(3, [](test::Rank& r) {
    auto pg = join(r, 1000ms);
    if (r.rank == 2) {
      // Stays connected but never calls the collective; leaves once the others have raised.
      r.store->wait({"raised/0", "raised/1"}, 10s);
      return;
    }
    Tensor t = ones({1000});
    const auto start = Clock::now();
    EXPECT_LOOM_ERROR(pg->allreduce(t)->wait(), DistError,
                      {"allreduce #1 (float32 [1000], sum)", "ranks that never arrived: 2"});
    EXPECT_GE(ms_since(start), 900);
    EXPECT_LT(ms_since(start), 4000);
    r.store->set("raised/" + std::to_string(r.rank), std::string("1"));
  });
}

TEST(ProcessGroupGloo, ARankThatDiesIsNamedLongBeforeTheTimeout) {
  test::run_ranks(3, [](test::Rank& r) {
    auto pg = join(r, 8000ms);
    pg->barrier()->wait();  // every rank has connected to every other
    if (r.rank == 2) {
      r.store->set("harness/done/2", std::string("1"));  // what the harness would do
      std::fflush(nullptr);
      ::_exit(0);  // dies without a word: its gloo connections close
    }
    const auto start = Clock::now();
    // Rank 1 finds out through gloo, rank 0 (blocked on rank 2's fingerprint) through the
    // marker rank 1 leaves in rank 2's place.
    EXPECT_LOOM_ERROR(pg->allreduce(ones({1000}))->wait(), DistError,
                      {"allreduce #2 (float32 [1000], sum)", "never arrived", "2"});
    EXPECT_LT(ms_since(start), 4000);
  });
}

TEST(ProcessGroupGloo, TheTimeoutMessageOfTheRankThatWaitedForTheMissingOne) {
  test::run_ranks(2, [](test::Rank& r) {
    auto pg = join(r, 500ms);
    if (r.rank == 1) {
      r.store->wait({"raised"}, 10s);
      return;
    }
    EXPECT_LOOM_ERROR(pg->allreduce(ones({1000}))->wait(), DistError,
                      {"allreduce #1 (float32 [1000], sum) timed out after 500 ms",
                       "ranks that never arrived: 1"});
    r.store->set("raised", std::string("1"));
  });
}

// ---------------------------------------------------------------- one rank: argument checks

class OneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    TCPStoreOptions options;
    options.is_server = true;
    options.port = 0;
    store_ = std::make_shared<TCPStore>(options);
    pg_ = make_gloo_process_group(store_, 0, 1);
  }
  std::shared_ptr<TCPStore> store_;
  std::shared_ptr<ProcessGroup> pg_;
};

TEST_F(OneRank, CollectivesOfOneRankLeaveTheTensorOrCopyIt) {
  Tensor t = tensor<float>({1, 2, 3}, {3});
  pg_->allreduce(t, ReduceOp::Avg)->wait();
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  pg_->broadcast(t, 0)->wait();
  std::vector<Tensor> out = {zeros({3})};
  pg_->allgather(out, t)->wait();
  EXPECT_EQ(out[0].to_vector<float>(), (std::vector<float>{1, 2, 3}));
  Tensor rs = zeros({3});
  pg_->reduce_scatter(rs, {t}, ReduceOp::Sum)->wait();
  EXPECT_EQ(rs.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  pg_->barrier()->wait();
  pg_->allreduce(zeros({0}))->wait();  // empty tensors are fine
}

TEST_F(OneRank, BadArgumentsRaiseTypedErrorsAtTheCall) {
  EXPECT_LOOM_ERROR(pg_->allreduce(ones({2}, kBool)), DTypeError, {"allreduce", "bool"});
  EXPECT_LOOM_ERROR(pg_->allreduce(Tensor()), ValueError, {"allreduce", "defined"});
  Tensor wide = ones({3, 4});
  EXPECT_LOOM_ERROR(pg_->allreduce(wide.t()), ValueError,
                    {"allreduce", "contiguous", "[4, 3]", "[1, 4]"});
  EXPECT_LOOM_ERROR(pg_->broadcast(ones({2}), 1), ValueError, {"broadcast", "root 1"});
  EXPECT_LOOM_ERROR(pg_->allgather({zeros({2}), zeros({2})}, ones({2})), ValueError,
                    {"allgather", "expected 1 output", "got 2"});
  EXPECT_LOOM_ERROR(pg_->allgather({zeros({3})}, ones({2})), ShapeError,
                    {"allgather", "[3]", "[2]"});
  EXPECT_LOOM_ERROR(pg_->allgather({zeros({2}, kFloat64)}, ones({2})), DTypeError,
                    {"allgather", "float64", "float32"});
  EXPECT_LOOM_ERROR(pg_->reduce_scatter(zeros({2}), {ones({2}, kInt64)}), DTypeError,
                    {"reduce_scatter", "int64"});
  EXPECT_LOOM_ERROR(pg_->send(ones({2}), 0), ValueError, {"send", "rank 0", "this is rank 0"});
  EXPECT_LOOM_ERROR(pg_->recv(ones({2}), 3), ValueError, {"recv", "rank 3"});
  EXPECT_LOOM_ERROR(make_gloo_process_group(store_, 2, 2), ValueError, {"rank 2"});
  EXPECT_LOOM_ERROR(make_gloo_process_group(nullptr, 0, 1), ValueError, {"store"});
}

TEST_F(OneRank, FlatCollectivesCheckTheirSizes) {
  EXPECT_LOOM_ERROR(pg_->reduce_scatter_tensor(zeros({3}), zeros({4})), ShapeError,
                    {"reduce_scatter_tensor", "[4]", "[3]"});
  EXPECT_LOOM_ERROR(pg_->allgather_into_tensor(zeros({2}), zeros({3})), ShapeError,
                    {"allgather_into_tensor", "[2]", "[3]"});
  EXPECT_LOOM_ERROR(pg_->allgather_into_tensor(zeros({3}, kFloat64), zeros({3})), DTypeError,
                    {"allgather_into_tensor", "float64", "float32"});
  Tensor ok = tensor<float>({1, 2}, {2});
  Tensor out = zeros({2});
  pg_->reduce_scatter_tensor(out, ok)->wait();
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(pg_->counters().at("reduce_scatter").bus_bytes, 0);  // one rank sends nothing
}

TEST_F(OneRank, AnUnresolvableGlooHostIsReportedNotACrash) {
  ::setenv("LOOM_GLOO_HOST", "no-such-host.invalid", 1);
  EXPECT_LOOM_ERROR(make_gloo_process_group(store_, 0, 1), DistError,
                    {"LOOM_GLOO_HOST", "no-such-host.invalid"});
  ::unsetenv("LOOM_GLOO_HOST");
}

TEST(ReduceOp, Names) {
  EXPECT_STREQ(to_string(ReduceOp::Sum), "sum");
  EXPECT_STREQ(to_string(ReduceOp::Avg), "avg");
  EXPECT_STREQ(to_string(ReduceOp::Max), "max");
  EXPECT_STREQ(to_string(ReduceOp::Min), "min");
}

// The nccl group's front checks what needs no GPU before it loads libloom_nccl.
TEST(NcclFront, ChecksTheArgumentsThenSaysWhyThereIsNoGroup) {
  EXPECT_LOOM_ERROR(make_nccl_process_group(nullptr, 0, 1), ValueError,
                    {"make_nccl_process_group", "store"});
  TCPStoreOptions options;
  options.port = 0;
  options.is_server = true;
  auto store = std::make_shared<TCPStore>(options);
  EXPECT_LOOM_ERROR(make_nccl_process_group(store, 2, 2), ValueError, {"rank 2"});
  EXPECT_LOOM_ERROR(make_nccl_process_group(store, 0, 1, {.timeout = Milliseconds(0)}), ValueError,
                    {"timeout"});
  if (cuda_device_count() > 0) return;  // the rest is about machines without a GPU
  EXPECT_FALSE(nccl_is_available());
  EXPECT_LOOM_ERROR(make_nccl_process_group(store, 0, 1), DeviceError,
                    {"make_nccl_process_group",
                     cuda_is_built() ? "no CUDA device is visible" : "built without CUDA"});
}

}  // namespace
}  // namespace loom::dist

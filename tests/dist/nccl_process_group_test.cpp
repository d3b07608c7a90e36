// tests/dist/nccl_process_group_test.cpp — ProcessGroupNCCL in real processes (one GPU each where
// there are enough, else two ranks sharing cuda:0): every collective against hand-computed
// values, send/recv, work in flight on a non-default stream, two groups side by side, and a rank
// that never joins a collective (DistError within the timeout, then the group refuses work).
// Without a GPU only the clear error of creating a group runs; the rest skip.
#include "dist/nccl_process_group.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "dist/multiprocess.h"
#include "tensor/accelerator.h"
#include "tensor/cuda/runtime.h"
#include "test_util.h"

namespace loom::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::ms_since;

using test::visible_gpus;  // asked of a forked child: the parent never initialises CUDA

// Rank r's GPU: its own where there are enough, else every rank shares cuda:0. NCCL refuses two
// ranks of one host on one GPU ("Duplicate GPU detected"), so ranks that share it each claim a
// host of their own (NCCL_HOSTID) and talk over sockets on loopback, as ranks on different
// machines would. Called in the rank's process before any NCCL call.
Device gpu_of(const test::Rank& r) {
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  ::setenv("NCCL_DEBUG", "WARN", 0);
  if (cuda::device_count() >= r.world_size) return Device(DeviceType::CUDA, r.rank);
  ::setenv("NCCL_HOSTID", ("loom-test-host-" + std::to_string(r.rank)).c_str(), 1);
  ::setenv("NCCL_IB_DISABLE", "1", 1);
  ::setenv("NCCL_MNNVL_ENABLE", "0", 1);
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  return Device(DeviceType::CUDA, 0);
}

std::shared_ptr<ProcessGroup> join(test::Rank& r, Device gpu, Milliseconds timeout = 30s) {
  cuda::set_device(gpu.index);
  return make_nccl_process_group(r.store, r.rank, r.world_size, {.timeout = timeout}, gpu.index);
}

// Every NCCL test runs its ranks with room for NCCL's start-up (a few seconds over sockets).
void run_gpu_ranks(int world, const std::function<void(test::Rank&)>& body) {
  test::run_ranks(world, body, /*deadline=*/120s, /*store_timeout=*/60s);
}

std::vector<double> values_of(const Tensor& t) { return t.to(kCPU).to_vector<double>(); }

// Rank r's value at element i: small integers, exact in every dtype (non-negative for uint8).
double value(int rank, int64_t i, DType dtype) {
  const double v = static_cast<double>(i % 7) + 2.0 * rank;
  return dtype == kUInt8 ? v : v - 3.0;
}

Tensor rank_tensor(int rank, int64_t n, DType dtype, Device gpu) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(rank, i, dtype);
  return tensor<double>(v).to(dtype).to(gpu);
}

double expected(ReduceOp op, int world, int64_t i, DType dtype) {
  double sum = 0, hi = value(0, i, dtype), lo = value(0, i, dtype);
  for (int r = 0; r < world; ++r) {
    sum += value(r, i, dtype);
    hi = std::max(hi, value(r, i, dtype));
    lo = std::min(lo, value(r, i, dtype));
  }
  switch (op) {
    case ReduceOp::Sum:
      return sum;
    case ReduceOp::Avg:
      return is_floating(dtype) ? sum / world : std::trunc(sum / world);
    case ReduceOp::Max:
      return hi;
    case ReduceOp::Min:
      return lo;
  }
  return 0;
}

// ---------------------------------------------------------------- without a GPU

TEST(ProcessGroupNCCL, WithoutAGpuCreatingAGroupRaisesAClearError) {
  if (visible_gpus() > 0) GTEST_SKIP() << "a GPU is visible: the tests below cover the group";
  test::run_ranks(1, [](test::Rank& r) {
    EXPECT_FALSE(nccl_is_available());
    EXPECT_LOOM_ERROR(make_nccl_process_group(r.store, 0, 1), DeviceError,
                      {"make_nccl_process_group",
                       cuda_is_built() ? "no CUDA device is visible" : "built without CUDA"});
  });
}

// ---------------------------------------------------------------- one rank

TEST(ProcessGroupNCCL, OneRankRunsEveryCollectiveAndChecksItsArguments) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  run_gpu_ranks(1, [](test::Rank& r) {
    const Device gpu = gpu_of(r);
    auto pg = join(r, gpu);
    EXPECT_TRUE(nccl_is_available());
    EXPECT_EQ(pg->backend(), "nccl");
    EXPECT_EQ(pg->rank(), 0);
    EXPECT_EQ(pg->size(), 1);

    Tensor t = tensor<float>({1, 2, 3}, {3}).to(gpu);
    pg->allreduce(t, ReduceOp::Avg)->wait();
    EXPECT_EQ(values_of(t), (std::vector<double>{1, 2, 3}));
    Tensor i = tensor<int32_t>({-3, 4}, {2}).to(gpu);
    pg->allreduce(i, ReduceOp::Avg)->wait();  // the integer division by a world of one
    EXPECT_EQ(values_of(i), (std::vector<double>{-3, 4}));
    pg->broadcast(t, 0)->wait();
    std::vector<Tensor> out = {zeros({3}, kFloat32, gpu)};
    pg->allgather(out, t)->wait();
    EXPECT_EQ(values_of(out[0]), (std::vector<double>{1, 2, 3}));
    Tensor rs = zeros({3}, kFloat32, gpu);
    pg->reduce_scatter(rs, {t}, ReduceOp::Sum)->wait();
    EXPECT_EQ(values_of(rs), (std::vector<double>{1, 2, 3}));
    auto barrier = pg->barrier();
    EXPECT_TRUE(barrier->is_completed());  // the host waited for it
    barrier->wait();
    pg->allreduce(zeros({0}, kFloat32, gpu))->wait();  // empty tensors are fine
    auto work = pg->allreduce(t);
    work->wait(5s);  // blocks the host until done
    EXPECT_TRUE(work->is_completed());
    EXPECT_GE(work->finished_at(), work->started_at());

    EXPECT_LOOM_ERROR(pg->allreduce(ones({2})), DeviceError, {"allreduce", "cuda:0", "cpu"});
    EXPECT_LOOM_ERROR(pg->allreduce(ones({2}, kBool).to(gpu)), DTypeError, {"allreduce", "bool"});
    EXPECT_LOOM_ERROR(pg->allreduce(Tensor()), ValueError, {"allreduce", "defined"});
    Tensor wide = ones({3, 4}, kFloat32, gpu);
    EXPECT_LOOM_ERROR(pg->allreduce(wide.t()), ValueError,
                      {"allreduce", "contiguous", "[4, 3]", "[1, 4]"});
    EXPECT_LOOM_ERROR(pg->broadcast(t, 1), ValueError, {"broadcast", "root 1"});
    EXPECT_LOOM_ERROR(pg->allgather({zeros({3}, kFloat32, gpu), zeros({3}, kFloat32, gpu)}, t),
                      ValueError, {"allgather", "expected 1 output", "got 2"});
    EXPECT_LOOM_ERROR(pg->allgather({zeros({2}, kFloat32, gpu)}, t), ShapeError,
                      {"allgather", "[2]", "[3]"});
    EXPECT_LOOM_ERROR(pg->allgather({zeros({3}, kFloat64, gpu)}, t), DTypeError,
                      {"allgather", "float64", "float32"});
    EXPECT_LOOM_ERROR(pg->reduce_scatter(rs, {ones({3}, kInt64, gpu)}), DTypeError,
                      {"reduce_scatter", "int64"});
    EXPECT_LOOM_ERROR(pg->send(t, 0), ValueError, {"send", "rank 0", "this is rank 0"});
    EXPECT_LOOM_ERROR(pg->recv(t, 3), ValueError, {"recv", "rank 3"});
    EXPECT_LOOM_ERROR(make_nccl_process_group(r.store, 2, 2), ValueError, {"rank 2"});
    EXPECT_LOOM_ERROR(make_nccl_process_group(nullptr, 0, 1), ValueError, {"store"});
    EXPECT_LOOM_ERROR(make_nccl_process_group(r.store, 0, 1, {}, 99), DeviceError, {"cuda:99"});
  });
}

// ---------------------------------------------------------------- two ranks

TEST(ProcessGroupNCCL, TwoRanksAllreduceEveryOpAndDtype) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  run_gpu_ranks(2, [](test::Rank& r) {
    const Device gpu = gpu_of(r);
    auto pg = join(r, gpu);
    const int64_t n = 1000;
    for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        Tensor t = rank_tensor(r.rank, n, dtype, gpu);
        pg->allreduce(t, op)->wait();  // the copy back below is queued after it, on the stream
        const std::vector<double> got = values_of(t);
        int wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          double want = expected(op, r.world_size, i, dtype);
          if (dtype == kFloat16 || dtype == kBFloat16) want = scalar_tensor(want).to(dtype).item();
          if (got[i] != want && wrong++ < 3)
            ADD_FAILURE() << "allreduce " << to_string(op) << " " << dtype << ": element " << i
                          << " is " << got[i] << ", expected " << want;
        }
      }
    }
  });
}

TEST(ProcessGroupNCCL, TwoRanksBroadcastAllgatherReduceScatterSendRecv) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  run_gpu_ranks(2, [](test::Rank& r) {
    const Device gpu = gpu_of(r);
    auto pg = join(r, gpu);
    const int world = r.world_size;

    // broadcast from the last rank (not 0).
    Tensor b =
        r.rank == 1 ? tensor<double>({1.5, -2.5, 3.0}, {3}).to(gpu) : zeros({3}, kFloat64, gpu);
    pg->broadcast(b, 1)->wait();
    EXPECT_EQ(values_of(b), (std::vector<double>{1.5, -2.5, 3.0}));

    // allgather: rank r contributes [r, 10 r]; out[q] must hold q's. Separate outputs (through
    // a scratch buffer), then views of one buffer (gathered in place).
    Tensor mine = tensor<int64_t>({r.rank, 10 * r.rank}, {2}).to(gpu);
    std::vector<Tensor> gathered;
    for (int q = 0; q < world; ++q) gathered.push_back(full({2}, -1, kInt64, gpu));
    pg->allgather(gathered, mine)->wait();
    for (int q = 0; q < world; ++q)
      EXPECT_EQ(values_of(gathered[q]), (std::vector<double>{1.0 * q, 10.0 * q})) << "from " << q;
    Tensor flat = full({2 * world}, -1, kInt64, gpu);
    std::vector<Tensor> views;
    for (int q = 0; q < world; ++q) views.push_back(flat.narrow(0, 2 * q, 2));
    pg->allgather(views, mine)->wait();
    EXPECT_EQ(values_of(flat), (std::vector<double>{0, 0, 1, 10}));

    // reduce_scatter: rank r's input for rank q is [100 q + r, r]; rank q gets the reduction.
    const double ranks_sum = world * (world - 1) / 2.0;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      std::vector<Tensor> inputs;
      for (int q = 0; q < world; ++q)
        inputs.push_back(tensor<float>({100.0f * q + r.rank, 1.0f * r.rank}, {2}).to(gpu));
      Tensor out = zeros({2}, kFloat32, gpu);
      pg->reduce_scatter(out, inputs, op)->wait();
      std::vector<double> want;
      if (op == ReduceOp::Sum) want = {100.0 * r.rank * world + ranks_sum, ranks_sum};
      if (op == ReduceOp::Avg) want = {100.0 * r.rank + ranks_sum / world, ranks_sum / world};
      if (op == ReduceOp::Max) want = {100.0 * r.rank + world - 1, world - 1.0};
      EXPECT_EQ(values_of(out), want) << to_string(op);
    }
    // The same from views of one buffer (no scratch), in int32 with Avg (sum, then / 2).
    Tensor packed = tensor<int32_t>({10 + r.rank, -3 - r.rank, 20 + r.rank, 7}, {4}).to(gpu);
    Tensor piece = zeros({2}, kInt32, gpu);
    pg->reduce_scatter(piece, {packed.narrow(0, 0, 2), packed.narrow(0, 2, 2)}, ReduceOp::Avg)
        ->wait();
    const std::vector<double> want_piece =
        r.rank == 0 ? std::vector<double>{10, -3} : std::vector<double>{20, 7};  // 21/2, -7/2
    EXPECT_EQ(values_of(piece), want_piece);

    // send/recv, matched in call order.
    if (r.rank == 0) {
      auto a = pg->send(tensor<float>({1, 2, 3}, {3}).to(gpu), 1);
      auto c = pg->send(tensor<int32_t>({42}, {1}).to(gpu), 1);
      a->wait(30s);
      c->wait(30s);
      EXPECT_TRUE(a->is_completed());
    } else {
      Tensor x = zeros({3}, kFloat32, gpu), y = zeros({1}, kInt32, gpu);
      pg->recv(x, 0)->wait();
      pg->recv(y, 0)->wait();
      EXPECT_EQ(values_of(x), (std::vector<double>{1, 2, 3}));
      EXPECT_EQ(values_of(y), (std::vector<double>{42}));
    }

    // A barrier: the last rank arrives late; nobody leaves before it arrives.
    if (r.rank == 1) std::this_thread::sleep_for(300ms);
    const auto start = Clock::now();
    pg->barrier()->wait();
    if (r.rank == 0) {
      EXPECT_GE(ms_since(start), 150);
    }
  });
}

TEST(ProcessGroupNCCL, WorkInFlightOnANonDefaultStreamAndTwoGroupsSideBySide) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  run_gpu_ranks(2, [](test::Rank& r) {
    const Device gpu = gpu_of(r);
    auto pg = join(r, gpu);
    auto second = join(r, gpu);  // its own unique id, communicator and stream
    // The tensors come from a stream of the caller's own: the collectives wait for it through
    // an event, and wait() orders that stream after them.
    cuda::Stream compute = cuda::Stream::create(gpu.index);
    cuda::StreamGuard on_compute(compute);
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 6; ++k) {
      tensors.push_back(full({100000}, (k + 1) * (r.rank + 1), kFloat32, gpu));
      ProcessGroup& group = k % 2 == 0 ? *pg : *second;
      works.push_back(group.allreduce(tensors.back()));
    }
    for (auto& w : works) w->wait();
    for (int k = 0; k < 6; ++k)
      EXPECT_EQ(values_of(tensors[k])[99999], (k + 1) * 3.0) << "op " << k;  // 1 + 2
    for (auto& w : works) {
      w->wait(30s);
      EXPECT_TRUE(w->is_completed());
      EXPECT_GT(w->started_at(), 0);
      EXPECT_GE(w->finished_at(), w->started_at());
    }
    second->barrier()->wait();
    pg->barrier()->wait();
  });
}

// ---------------------------------------------------------------- failures

TEST(ProcessGroupNCCL, ARankThatNeverJoinsACollectiveRaisesWithinTheTimeout) {
  LOOM_SKIP_WITHOUT_GPUS(1);
  run_gpu_ranks(2, [](test::Rank& r) {
    const Device gpu = gpu_of(r);
    auto pg = join(r, gpu, 5000ms);
    pg->barrier()->wait();  // both ranks are connected
    if (r.rank == 1) {
      // Stays alive but never calls allreduce #2; leaves once rank 0 has raised.
      r.store->wait({"raised"}, 60s);
      return;
    }
    Tensor t = ones({1000}, kFloat32, gpu);
    const auto start = Clock::now();
    std::string message;
    std::shared_ptr<Work> work;
    try {
      // Queueing fails by itself if NCCL must first connect the ranks for this size.
      work = pg->allreduce(t);
    } catch (const DistError& e) {
      message = e.what();
    }
    if (work) {
      EXPECT_LOOM_ERROR(work->wait(200ms), DistError,
                        {"allreduce #2 (float32 [1000], sum)", "gave up after 200 ms"});
      EXPECT_FALSE(work->is_completed());
      try {
        work->wait(60s);  // the host waits until the watchdog fails it
        ADD_FAILURE() << "allreduce #2 completed without rank 1";
      } catch (const DistError& e) {
        message = e.what();
      }
      EXPECT_TRUE(work->is_completed());
    }
    for (const char* fragment :
         {"allreduce #2 (float32 [1000], sum)", "timed out after 5000 ms", "it ran", "NCCL's state",
          "ranks that never arrived: 1", "aborted"})
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
    EXPECT_GE(ms_since(start), 4900);
    EXPECT_LT(ms_since(start), 20000);
    // From then on the group refuses work at once.
    const auto refused = Clock::now();
    EXPECT_LOOM_ERROR(pg->allreduce(t), DistError, {"allreduce", "unusable", "timed out"});
    EXPECT_LOOM_ERROR(pg->barrier(), DistError, {"barrier", "unusable"});
    EXPECT_LT(ms_since(refused), 1000);
    r.store->set("raised", std::string("1"));
  });
}

}  // namespace
}  // namespace loom::dist

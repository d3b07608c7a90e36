// dist/nccl_process_group.cu — ProcessGroupNCCL: the collectives of process_group.h on CUDA
// tensors through NCCL, queued on one communication stream per group and watched by one thread
// per group that turns a hang or an NCCL error into a DistError (Note [NCCL streams and waits],
// nccl_process_group.h). The communicator is non-blocking, so that creating it and queueing a
// collective can be timed out and aborted too.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "dist/collective_checks.h"
#include "dist/nccl_process_group.h"
#include "tensor/cuda/common.cuh"
#include "tensor/error.h"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0),
              "loom's nccl process group needs NCCL 2.14 or later (non-blocking communicators)");

namespace loom::dist {

namespace {

using namespace std::chrono_literals;

constexpr auto kWatchdogPoll = 1ms;  // how often the watchdog queries the oldest work
constexpr double kProbeAfter = 0.5;  // seconds a collective stalls before fingerprints are compared
constexpr double kProbeEvery = 0.25;

int64_t to_ms(double seconds) { return static_cast<int64_t>(seconds * 1e3); }

// Sleeps that start short (an enqueue usually finishes within microseconds) and grow to 1 ms.
class Backoff {
 public:
  void sleep() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min<std::chrono::microseconds>(delay_ * 2, 1ms);
  }
  std::chrono::microseconds delay() const { return delay_; }
  void grow() { delay_ = std::min<std::chrono::microseconds>(delay_ * 2, 1ms); }

 private:
  std::chrono::microseconds delay_{20};
};

// ---------------------------------------------------------------- NCCL errors and types

// "invalid usage (Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000)": the
// error's name, then NCCL's last message when it has one.
std::string nccl_error(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += detail::str(" (", last, ")");
  return text;
}

// Every NCCL call is checked here: a failure raises DistError naming the call, the device and
// NCCL's error. ncclInProgress is no failure: a non-blocking communicator is still working on
// the call, and the caller polls ncclCommGetAsyncError until it is done.
void check_nccl(ncclResult_t result, const std::string& op, int device, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  throw DistError(
      detail::str(op, " failed on cuda:", device, ": NCCL error: ", nccl_error(result, comm)));
}

// The dtypes NCCL reduces: every loom dtype but bool.
ncclDataType_t nccl_dtype(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::Float16:
      return ncclFloat16;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Int64:
      return ncclInt64;
    case DType::Int32:
      return ncclInt32;
    case DType::UInt8:
      return ncclUint8;
    default:
      throw DTypeError(detail::str(op,
                                   ": NCCL reduces float32, float64, float16, bfloat16, int64, "
                                   "int32 and uint8 tensors; got ",
                                   dtype));
  }
}

// Integer Avg runs as Sum followed by divide_by_world_size (Note [NCCL streams and waits]).
ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return is_floating(dtype) ? ncclAvg : ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

bool divides_after(ReduceOp op, DType dtype) { return op == ReduceOp::Avg && !is_floating(dtype); }

// data[i] /= divisor, truncating toward zero (C++'s integer division). One thread per element,
// grid-stride loop.
template <typename T>
__global__ void divide_kernel(T* data, int64_t n, int64_t divisor) {
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    data[i] = static_cast<T>(data[i] / divisor);
}

void divide_by_world_size(const Tensor& t, int size, cudaStream_t stream, int device) {
  const int64_t n = t.numel();
  if (n == 0 || size == 1) return;
  auto launch = [&]<typename T>() {
    divide_kernel<T>
        <<<cuda::blocks_for(n), cuda::kThreads, 0, stream>>>(static_cast<T*>(t.data()), n, size);
    cuda::check_launch("divide_kernel (nccl integer avg)", device);
  };
  switch (t.dtype()) {
    case DType::Int64:
      return launch.operator()<int64_t>();
    case DType::Int32:
      return launch.operator()<int32_t>();
    case DType::UInt8:
      return launch.operator()<uint8_t>();
    default:
      LOOM_ASSERT(false, "divide_by_world_size: not an integer dtype");
  }
}

// ---------------------------------------------------------------- checking arguments

void check_tensor(const char* op, const Tensor& t, int device) {
  LOOM_CHECK(t.defined(), ValueError, op, ": expected a defined tensor");
  LOOM_CHECK(t.is_cuda() && t.device().index == device, DeviceError, op,
             ": the nccl process group of cuda:", device, " takes tensors on cuda:", device,
             "; got one of shape ", t.sizes(), " on ", t.device());
  LOOM_CHECK(t.is_contiguous(), ValueError, op, ": expected a contiguous tensor; got sizes ",
             t.sizes(), " strides ", t.strides());
}

void check_like(const char* op, const char* what, const Tensor& t, const Tensor& like, int device) {
  check_tensor(op, t, device);
  LOOM_CHECK(t.dtype() == like.dtype(), DTypeError, op, ": ", what, " is ", t.dtype(),
             ", expected ", like.dtype());
  LOOM_CHECK(t.sizes() == like.sizes(), ShapeError, op, ": ", what, " has shape ", t.sizes(),
             ", expected ", like.sizes());
}

// True when `parts` lie back to back, in order, in one storage: one flat buffer for NCCL.
// `single` may be the slot `slot` of the flat `parts` (NCCL's in-place case) or lie elsewhere,
// but must not overlap the flat buffer otherwise.
bool usable_with_flat(const Tensor& single, const std::vector<Tensor>& parts, size_t slot) {
  return !single.is_alias_of(parts[0]) || single.data() == parts[slot].data();
}

// ---------------------------------------------------------------- Work

// A collective (or send/recv) on the comm stream. Its state moves once, from pending to
// completed (the host saw the completion event) or failed (the watchdog or the enqueue gave up
// on it); whichever comes first wins.
class NcclWork final : public Work {
 public:
  NcclWork(std::string description, int64_t seq, std::string fingerprint, bool full_sync,
           int device, Milliseconds group_timeout, bool blocking_wait, std::vector<Tensor> tensors)
      : description_(std::move(description)),
        fingerprint_(std::move(fingerprint)),
        seq_(seq),
        full_sync_(full_sync),
        device_(device),
        group_timeout_(group_timeout),
        blocking_wait_(blocking_wait),
        started_(steady_seconds()),
        tensors_(std::move(tensors)) {}

  bool is_completed() const override { return poll(); }

  // Note [NCCL streams and waits]: the current stream waits for the completion event; the host
  // waits only with a positive timeout or LOOM_NCCL_BLOCKING_WAIT.
  void wait(Milliseconds timeout) override {
    if (timeout > Milliseconds(0) || blocking_wait_) {
      const Milliseconds limit =
          timeout > Milliseconds(0)
              ? timeout
              : std::chrono::duration_cast<Milliseconds>(2 * group_timeout_ + 10s);
      if (!block(limit)) {
        throw DistError(detail::str(description_, ": wait() gave up after ", limit.count(),
                                    " ms; the operation is still queued or running"));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ == State::Failed) throw DistError(error_);  // a fresh exception per waiter
    }
    cuda::Stream::current(device_).wait(done_);
  }

  double started_at() const override { return started_; }
  double finished_at() const override {
    if (finished_.load() == 0) {
      try {
        poll();
      } catch (const std::exception&) {
        // A CUDA error: the watchdog reports it through the work's failure.
      }
    }
    return finished_.load();
  }

  // ---- the group's side

  const std::string& description() const { return description_; }
  const std::string& fingerprint() const { return fingerprint_; }
  int64_t seq() const { return seq_; }  // 0 for send and recv
  bool full_sync() const { return full_sync_; }
  cuda::Event& done_event() { return done_; }

  // Called once the completion event is recorded: from then on queries mean something (an event
  // never recorded reads as happened).
  void mark_enqueued() { enqueued_.store(true); }
  bool enqueued() const { return enqueued_.load(); }

  // True once the work completed or failed; marks it completed when its event has happened.
  // A CUDA error while querying raises DeviceError.
  bool poll() const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ != State::Pending) return true;
    }
    if (!enqueued() || !done_.query()) return false;
    std::vector<Tensor> release;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ == State::Pending) {
        state_ = State::Completed;
        finished_ = steady_seconds();
        release.swap(tensors_);  // NCCL is done with them (Note [NCCL streams and waits])
      }
    }
    cv_.notify_all();
    return true;
  }

  // The host waits until the work completed or failed, at most `limit`; false when it passed.
  bool block(Milliseconds limit) const {
    const double give_up = steady_seconds() + std::chrono::duration<double>(limit).count();
    Backoff backoff;
    while (!poll()) {
      if (steady_seconds() > give_up) return false;
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, backoff.delay(), [&] { return state_ != State::Pending; });
      backoff.grow();
    }
    return true;
  }

  void fail(const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ != State::Pending) return;
      state_ = State::Failed;
      error_ = error;
      finished_ = steady_seconds();
    }
    cv_.notify_all();
  }
  bool failed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_ == State::Failed;
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }
  // After a failure, once the comm stream has drained past the work.
  void release_tensors() {
    std::vector<Tensor> release;
    std::lock_guard<std::mutex> lock(mutex_);
    release.swap(tensors_);
  }

 private:
  enum class State { Pending, Completed, Failed };

  const std::string description_;  // "allreduce #3 (float32 [1000], sum)"
  const std::string fingerprint_;  // "allreduce(float32 [1000], sum)"
  const int64_t seq_;
  const bool full_sync_;  // every rank's data reaches every rank (not broadcast, send, recv)
  const int device_;
  const Milliseconds group_timeout_;
  const bool blocking_wait_;
  const double started_;
  cuda::Event done_;  // recorded on the comm stream after the NCCL call
  std::atomic<bool> enqueued_{false};

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  mutable State state_ = State::Pending;
  mutable std::atomic<double> finished_{0};
  std::string error_;
  mutable std::vector<Tensor> tensors_;  // alive until the completion event has happened
};

// ---------------------------------------------------------------- the process group

std::atomic<int> next_group_id{0};

bool blocking_wait_from_env() {
  const char* value = std::getenv("LOOM_NCCL_BLOCKING_WAIT");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options,
                   int device)
      : ProcessGroup(rank, size),
        options_(options),
        device_(device),
        blocking_wait_(blocking_wait_from_env()),
        // Groups are numbered in the order they are made: the same on every rank.
        store_(std::make_shared<PrefixStore>("nccl" + std::to_string(next_group_id++), store)),
        checks_(store_, rank, size, options_.timeout) {
    store_->set_timeout(options_.timeout);
    cuda::DeviceGuard guard(device_);
    comm_stream_.emplace(cuda::Stream::create(device_));
    barrier_buffer_ = zeros({1}, kInt32, Device(DeviceType::CUDA, device_));
    comm_ = create_communicator();
    watchdog_ = std::thread([this] { watchdog_loop(); });
  }

  // Lets the outstanding works finish (each within the timeout), then releases the
  // communicator: finalized and destroyed when healthy, aborted when that does not end in time.
  ~ProcessGroupNCCL() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    try {
      cuda::DeviceGuard guard(device_);
      if (comm_ != nullptr) release_communicator();
      comm_stream_->synchronize();
    } catch (const std::exception&) {
      // A destructor: the process is going on without this group either way.
    }
  }

  std::string backend() const override { return "nccl"; }

  std::shared_ptr<Work> allreduce(Tensor t, ReduceOp op) override {
    check_tensor("allreduce", t, device_);
    const ncclDataType_t type = nccl_dtype(t.dtype(), "allreduce");
    const ncclRedOp_t nccl_reduce = nccl_op(op, t.dtype());
    const int64_t n = t.numel();
    count("allreduce", static_cast<int64_t>(t.nbytes()));
    After after;
    if (divides_after(op, t.dtype()))
      after = [this, t](cudaStream_t s) { divide_by_world_size(t, size_, s, device_); };
    return enqueue(
        "allreduce", describe_tensor(t) + ", " + to_string(op), /*collective=*/true,
        /*full_sync=*/true, {t},
        [&](ncclComm_t comm, cudaStream_t s) {
          if (n == 0) return ncclSuccess;
          return ncclAllReduce(t.data(), t.data(), static_cast<size_t>(n), type, nccl_reduce, comm,
                               s);
        },
        after);
  }

  std::shared_ptr<Work> broadcast(Tensor t, int root) override {
    check_tensor("broadcast", t, device_);
    LOOM_CHECK(root >= 0 && root < size_, ValueError, "broadcast: root ", root,
               " is not a rank of this group of ", size_);
    count("broadcast", static_cast<int64_t>(t.nbytes()));
    return enqueue("broadcast", describe_tensor(t) + ", root " + std::to_string(root),
                   /*collective=*/true, /*full_sync=*/false, {t},
                   [&](ncclComm_t comm, cudaStream_t s) {
                     if (t.nbytes() == 0) return ncclSuccess;
                     return ncclBroadcast(t.data(), t.data(), t.nbytes(), ncclUint8, root, comm, s);
                   });
  }

  // One ncclAllGather into a flat buffer: `out` itself when its tensors lie back to back in one
  // storage, else a scratch buffer copied into them on the comm stream.
  std::shared_ptr<Work> allgather(std::vector<Tensor> out, Tensor input) override {
    check_tensor("allgather", input, device_);
    LOOM_CHECK(static_cast<int>(out.size()) == size_, ValueError, "allgather: expected ", size_,
               " output tensors (one per rank); got ", out.size());
    for (const Tensor& o : out) check_like("allgather", "an output", o, input, device_);
    const size_t nbytes = input.nbytes();
    count("allgather", static_cast<int64_t>(nbytes) * size_);
    const bool direct = lie_back_to_back(out) && usable_with_flat(input, out, rank_);
    Tensor flat = direct ? out[0] : empty({size_ * input.numel()}, input.dtype(), input.device());
    std::vector<Tensor> keep = out;
    keep.push_back(input);
    keep.push_back(flat);
    After after;
    if (!direct)
      after = [this, out, flat, nbytes](cudaStream_t) {
        const auto* base = static_cast<const uint8_t*>(flat.data());
        for (int r = 0; r < size_; ++r)
          cuda::copy_bytes_async(out[r].data(), base + r * nbytes, nbytes,
                                 cuda::CopyKind::DeviceToDevice, *comm_stream_);
      };
    return enqueue(
        "allgather", describe_tensor(input), /*collective=*/true, /*full_sync=*/true, keep,
        [&](ncclComm_t comm, cudaStream_t s) {
          if (nbytes == 0) return ncclSuccess;
          return ncclAllGather(input.data(), flat.data(), nbytes, ncclUint8, comm, s);
        },
        after);
  }

  // One ncclReduceScatter from a flat buffer: `inputs` themselves when they lie back to back in
  // one storage, else a scratch buffer they are copied into on the comm stream.
  std::shared_ptr<Work> reduce_scatter(Tensor out, std::vector<Tensor> inputs,
                                       ReduceOp op) override {
    check_tensor("reduce_scatter", out, device_);
    const ncclDataType_t type = nccl_dtype(out.dtype(), "reduce_scatter");
    LOOM_CHECK(static_cast<int>(inputs.size()) == size_, ValueError, "reduce_scatter: expected ",
               size_, " input tensors (one per rank); got ", inputs.size());
    for (const Tensor& in : inputs) check_like("reduce_scatter", "an input", in, out, device_);
    const ncclRedOp_t nccl_reduce = nccl_op(op, out.dtype());
    const size_t nbytes = out.nbytes();
    const int64_t n = out.numel();
    count("reduce_scatter", static_cast<int64_t>(nbytes) * size_);
    const bool direct = lie_back_to_back(inputs) && usable_with_flat(out, inputs, rank_);
    Tensor flat = direct ? inputs[0] : empty({size_ * n}, out.dtype(), out.device());
    std::vector<Tensor> keep = inputs;
    keep.push_back(out);
    keep.push_back(flat);
    After after;
    if (divides_after(op, out.dtype()))
      after = [this, out](cudaStream_t s) { divide_by_world_size(out, size_, s, device_); };
    return enqueue(
        "reduce_scatter", describe_tensor(out) + ", " + to_string(op), /*collective=*/true,
        /*full_sync=*/true, keep,
        [&](ncclComm_t comm, cudaStream_t s) {
          if (n == 0) return ncclSuccess;
          if (!direct) {
            auto* base = static_cast<uint8_t*>(flat.data());
            for (int r = 0; r < size_; ++r)
              cuda::copy_bytes_async(base + r * nbytes, inputs[r].data(), nbytes,
                                     cuda::CopyKind::DeviceToDevice, *comm_stream_);
          }
          return ncclReduceScatter(flat.data(), out.data(), static_cast<size_t>(n), type,
                                   nccl_reduce, comm, s);
        },
        after);
  }

  // One NCCL group of a send and a receive per peer (NCCL has no all-to-all of its own): grouped,
  // every rank's sends and receives are posted together, so none waits on another's order.
  std::shared_ptr<Work> alltoall(Tensor out, Tensor input) override {
    check_tensor("alltoall", input, device_);
    check_tensor("alltoall", out, device_);
    check_alltoall("nccl", out, input, size_);
    count("alltoall", static_cast<int64_t>(input.nbytes()));
    const size_t piece = input.nbytes() / static_cast<size_t>(size_);
    return enqueue("alltoall", describe_tensor(input), /*collective=*/true, /*full_sync=*/true,
                   {out, input}, [&](ncclComm_t comm, cudaStream_t s) {
                     if (piece == 0) return ncclSuccess;
                     const auto* in = static_cast<const uint8_t*>(input.data());
                     auto* to = static_cast<uint8_t*>(out.data());
                     ncclResult_t result = ncclGroupStart();
                     for (int r = 0; r < size_ && result == ncclSuccess; ++r) {
                       result = ncclSend(in + r * piece, piece, ncclUint8, r, comm, s);
                       if (result == ncclSuccess)
                         result = ncclRecv(to + r * piece, piece, ncclUint8, r, comm, s);
                     }
                     const ncclResult_t ended = ncclGroupEnd();
                     return result != ncclSuccess ? result : ended;
                   });
  }

  // An allreduce of one int32 on the device; the host then waits for it (up to the timeout,
  // after which the watchdog has failed it): when barrier() returns, every rank has reached it
  // and this rank's work queued before it has finished.
  std::shared_ptr<Work> barrier() override {
    auto work = enqueue("barrier", "", /*collective=*/true, /*full_sync=*/true, {barrier_buffer_},
                        [&](ncclComm_t comm, cudaStream_t s) {
                          return ncclAllReduce(barrier_buffer_.data(), barrier_buffer_.data(), 1,
                                               ncclInt32, ncclSum, comm, s);
                        });
    work->block(std::chrono::duration_cast<Milliseconds>(2 * options_.timeout + 10s));
    return work;
  }

  std::shared_ptr<Work> send(Tensor t, int dst, int tag) override {
    if (t.defined()) count("send", static_cast<int64_t>(t.nbytes()));
    return point_to_point("send", t, dst, tag, /*is_send=*/true);
  }
  std::shared_ptr<Work> recv(Tensor t, int src, int tag) override {
    return point_to_point("recv", t, src, tag, /*is_send=*/false);
  }

 private:
  // The NCCL call(s) of one work, on the comm stream: called once, with mutex_ held.
  using Issue = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;
  // What follows them on the comm stream (copies out, the integer Avg's division): queued only
  // once NCCL has queued its kernel, which a non-blocking communicator may do later than the call.
  using After = std::function<void(cudaStream_t stream)>;

  cudaStream_t stream() const { return static_cast<cudaStream_t>(comm_stream_->handle()); }

  std::shared_ptr<Work> point_to_point(const char* op, const Tensor& t, int peer, int tag,
                                       bool is_send) {
    check_tensor(op, t, device_);
    LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, ValueError, op, ": rank ", peer,
               " is not another rank of this group of ", size_, " (this is rank ", rank_, ")");
    LOOM_CHECK(tag >= 0, ValueError, op, ": the tag must be non-negative; got ", tag);
    const std::string name = detail::str(op, is_send ? " to rank " : " from rank ", peer);
    return enqueue(name, detail::str(describe_tensor(t), ", tag ", tag), /*collective=*/false,
                   /*full_sync=*/false, {t}, [&](ncclComm_t comm, cudaStream_t s) {
                     if (t.nbytes() == 0) return ncclSuccess;
                     return is_send ? ncclSend(t.data(), t.nbytes(), ncclUint8, peer, comm, s)
                                    : ncclRecv(t.data(), t.nbytes(), ncclUint8, peer, comm, s);
                   });
  }

  void throw_if_broken(const std::string& what) const {
    LOOM_CHECK(broken_.empty(), DistError, what,
               ": the process group is unusable after an earlier failure: ", broken_);
  }

  // Queues one work on the comm stream (Note [NCCL streams and waits]); one caller at a time, so
  // that NCCL sees the calls in the order they were made. A failure while queueing fails the
  // group and raises DistError here.
  std::shared_ptr<NcclWork> enqueue(const std::string& name, const std::string& details,
                                    bool collective, bool full_sync, std::vector<Tensor> tensors,
                                    const Issue& issue, const After& after = {}) {
    cuda::DeviceGuard guard(device_);
    std::lock_guard<std::mutex> one_caller(enqueue_mutex_);
    std::shared_ptr<NcclWork> work;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      throw_if_broken(name);
      const int64_t seq = collective ? next_seq_++ : 0;
      std::string description = collective ? name + " #" + std::to_string(seq) : name;
      if (!details.empty()) description += " (" + details + ")";
      work = std::make_shared<NcclWork>(std::move(description), seq, name + "(" + details + ")",
                                        full_sync, device_, options_.timeout, blocking_wait_,
                                        std::move(tensors));
      outstanding_.push_back(work);
      if (collective && options_.check_collectives && size_ > 1) unpublished_.push_back(work);
    }
    cv_.notify_all();
    try {
      // The comm stream starts after what the caller's stream has queued so far (the producers
      // of the tensors): an event, not a host synchronisation.
      cuda::Event ready;
      ready.record(cuda::Stream::current(device_));
      comm_stream_->wait(ready);
      run_nccl(*work, issue);
      if (after) after(stream());
      std::lock_guard<std::mutex> lock(mutex_);
      work->done_event().record(*comm_stream_);
      // Failed meanwhile (a timeout, a peer's error): the failure's drain point was recorded
      // before `after` queued its copies, which read this work's tensors; move it past them.
      if (!broken_.empty()) drain_event_.record(*comm_stream_);
      work->mark_enqueued();
    } catch (const DistError& e) {  // an NCCL error, a timeout, or the group failed meanwhile
      fail_from_enqueue(*work, std::string(e.what()) + "; the NCCL communicator was aborted");
    } catch (const std::exception& e) {  // a CUDA error
      fail_from_enqueue(*work, detail::str(work->description(), " failed on cuda:", device_, ": ",
                                           e.what(), "; the NCCL communicator was aborted"));
    }
    cv_.notify_all();
    return work;
  }

  // Fails the group with `why` unless it failed already, and raises the work's error.
  [[noreturn]] void fail_from_enqueue(NcclWork& work, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.empty()) fail_locked(why, &work, why);
    throw DistError(work.failed() ? work.error() : broken_);
  }

  // Issues the NCCL call, then waits until the non-blocking communicator has queued it (the
  // first call between two ranks also connects them, which needs the peer): by the group's
  // timeout, counted from the work's start, or the group fails.
  void run_nccl(NcclWork& work, const Issue& issue) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!broken_.empty()) throw DistError(work.error());
      const ncclResult_t result = issue(comm_, stream());
      check_nccl(result, work.description(), device_, comm_);
      if (result == ncclSuccess) return;
    }
    const double deadline =
        work.started_at() + std::chrono::duration<double>(options_.timeout).count();
    Backoff backoff;
    while (true) {
      backoff.sleep();
      std::lock_guard<std::mutex> lock(mutex_);
      if (!broken_.empty()) throw DistError(work.error());
      ncclResult_t state = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", device_, comm_);
      if (state == ncclSuccess) return;
      check_nccl(state, work.description(), device_, comm_);
      if (steady_seconds() > deadline) break;
    }
    const std::string why = timeout_message(work, ncclInProgress);
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.empty()) fail_locked(why, &work, why);
    throw DistError(work.error());
  }

  // Records the first failure: fails every outstanding work (`culprit` with `message`, the
  // others as aborted), then aborts the communicator, which also ends NCCL kernels stuck on the
  // GPU. The works keep their tensors until the comm stream has drained past them. mutex_ held.
  void fail_locked(const std::string& reason, const NcclWork* culprit, const std::string& message) {
    if (!broken_.empty()) return;
    broken_ = reason;
    for (const auto& w : outstanding_) {
      w->fail(w.get() == culprit
                  ? message
                  : detail::str(w->description(), " was aborted after a failure: ", reason));
      draining_.push_back(w);
    }
    outstanding_.clear();
    unpublished_.clear();
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);  // its result tells nothing more: the communicator is gone either way
      comm_ = nullptr;
    }
    try {
      drain_event_.record(*comm_stream_);
    } catch (const std::exception&) {
      // The device itself failed: nothing more will run on the stream.
    }
    cv_.notify_all();
  }

  // ---- creating and releasing the communicator

  ncclComm_t create_communicator() {
    const std::string who =
        detail::str("ProcessGroupNCCL: rank ", rank_, " of ", size_, " on cuda:", device_);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (rank_ == 0) {
      check_nccl(ncclGetUniqueId(&id), who + ": ncclGetUniqueId", device_, nullptr);
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store_->set("unique_id", Bytes(bytes, bytes + sizeof(id)));
    } else {
      Bytes value;
      try {
        value = store_->get("unique_id", options_.timeout);
      } catch (const DistError& e) {
        throw DistError(detail::str(who, " did not receive NCCL's unique id from rank 0 within ",
                                    options_.timeout.count(), " ms: ", e.what()));
      }
      LOOM_CHECK(value.size() == sizeof(id), DistError, who, ": NCCL's unique id in the store has ",
                 value.size(), " bytes, expected ", sizeof(id));
      std::memcpy(&id, value.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; hangs become timeouts (file comment)
    ncclComm_t comm = nullptr;
    ncclResult_t state = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
    const double deadline =
        steady_seconds() + std::chrono::duration<double>(options_.timeout).count();
    Backoff backoff;
    while (state == ncclInProgress && comm != nullptr && steady_seconds() <= deadline) {
      backoff.sleep();
      const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
      if (queried != ncclSuccess) state = queried;
    }
    if (state == ncclSuccess && comm != nullptr) return comm;
    const std::string why =
        state == ncclInProgress
            ? detail::str(who, " could not create its NCCL communicator within ",
                          options_.timeout.count(),
                          " ms: every rank must call make_nccl_process_group (NCCL's state: ",
                          ncclGetErrorString(state), ")")
            : detail::str(who,
                          ": creating the NCCL communicator failed: ", nccl_error(state, comm));
    if (comm != nullptr) ncclCommAbort(comm);
    throw DistError(why);
  }

  // Finalize (flushes and frees the network resources), then destroy; abort when finalizing
  // fails or does not end within the timeout.
  void release_communicator() {
    ncclResult_t state = ncclCommFinalize(comm_);
    const double deadline =
        steady_seconds() + std::chrono::duration<double>(options_.timeout).count();
    Backoff backoff;
    while (state == ncclInProgress && steady_seconds() <= deadline) {
      backoff.sleep();
      const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
      if (queried != ncclSuccess) state = queried;
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }

  // ---- the watchdog

  // Note [NCCL streams and waits]: completions in stream order, NCCL's asynchronous errors,
  // timeouts; then, without the lock, the store's chores (fingerprints).
  void watchdog_loop() {
    try {
      cuda::set_device(device_);  // else the first CUDA call would make a context on cuda:0
    } catch (const std::exception&) {
      // The constructor set the same device: this cannot fail where the group was created.
    }
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      if (stop_ && outstanding_.empty() && draining_.empty()) return;
      auto busy = [&] {
        return !outstanding_.empty() || !draining_.empty() ||
               (!store_failed_ && !unpublished_.empty());
      };
      if (!busy() && !has_garbage()) {
        cv_.wait(lock, [&] { return stop_ || busy(); });
        continue;
      }
      check_works(lock);
      drain();
      lock.unlock();
      store_chores();
      lock.lock();
      cv_.wait_for(lock, kWatchdogPoll,
                   [&] { return stop_ && outstanding_.empty() && draining_.empty(); });
    }
  }

  void check_works(std::unique_lock<std::mutex>& lock) {
    if (!broken_.empty() || outstanding_.empty()) return;
    // NCCL's own errors: a peer that failed or went away, a network error.
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    if (queried != ncclSuccess) state = queried;
    if (state != ncclSuccess && state != ncclInProgress) {
      const NcclWork& front = *outstanding_.front();
      const std::string why = detail::str(front.description(), " failed on cuda:", device_,
                                          " after ", to_ms(steady_seconds() - front.started_at()),
                                          " ms: NCCL error: ", nccl_error(state, comm_),
                                          "; the NCCL communicator was aborted");
      fail_locked(why, &front, why);
      return;
    }
    // Completions: the works of one stream complete in order.
    while (!outstanding_.empty()) {
      const std::shared_ptr<NcclWork> front = outstanding_.front();
      try {
        if (!front->poll()) break;
      } catch (const std::exception& e) {
        const std::string why =
            detail::str(front->description(), " failed on cuda:", device_, ": ", e.what());
        fail_locked(why, front.get(), why);
        return;
      }
      if (front->full_sync()) synced_upto_ = std::max(synced_upto_, front->seq());
      outstanding_.pop_front();
    }
    if (outstanding_.empty()) return;
    // The oldest pending work, past the timeout.
    const std::shared_ptr<NcclWork> front = outstanding_.front();
    const double ran = steady_seconds() - front->started_at();
    if (ran <= std::chrono::duration<double>(options_.timeout).count()) return;
    lock.unlock();
    const std::string why = timeout_message(*front, state);  // reads the store: no lock
    lock.lock();
    bool completed_meanwhile = false;
    try {
      completed_meanwhile = front->poll();
    } catch (const std::exception&) {
      // Reported as the timeout below.
    }
    if (broken_.empty() && !completed_meanwhile) fail_locked(why, front.get(), why);
  }

  // Failed works release their tensors once the comm stream has passed the abort.
  void drain() {
    if (draining_.empty()) return;
    bool drained = true;
    try {
      drained = drain_event_.query();
    } catch (const std::exception&) {
      // A broken device runs nothing more.
    }
    if (!drained) return;
    for (const auto& w : draining_) w->release_tensors();
    draining_.clear();
  }

  // ---- fingerprints (Note [NCCL streams and waits]); watchdog thread, mutex_ not held

  // A rank's own keys are deleted once a later full-sync collective completed here: every rank
  // then completed the earlier ones, so none is still probing them.
  bool has_garbage() const {
    return !store_failed_ && deleted_upto_ + 1 < synced_upto_ && deleted_upto_ < published_upto_;
  }

  void store_chores() {
    if (store_failed_) return;
    try {
      while (true) {
        std::shared_ptr<NcclWork> w;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (unpublished_.empty()) break;
          w = unpublished_.front();
          unpublished_.pop_front();
        }
        checks_.publish(w->seq(), w->fingerprint());
        published_upto_ = w->seq();
      }
      while (has_garbage()) {
        if (!checks_.forget(deleted_upto_ + 1)) {
          store_failed_ = true;  // as below
          return;
        }
        ++deleted_upto_;
      }
      probe_stalled();
    } catch (const DistError&) {
      store_failed_ = true;  // the store is gone: the checks stop, the collectives go on
    }
  }

  // A collective stalled for kProbeAfter: a peer that called another one is a mismatch, which
  // fails the group at once instead of at the timeout.
  void probe_stalled() {
    if (!options_.check_collectives || size_ == 1) return;
    std::shared_ptr<NcclWork> stalled;
    const double now = steady_seconds();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!broken_.empty() || outstanding_.empty()) return;
      stalled = outstanding_.front();
    }
    if (stalled->seq() == 0 || stalled->seq() > published_upto_ ||
        now - stalled->started_at() < kProbeAfter || now - last_probe_ < kProbeEvery)
      return;
    last_probe_ = now;
    const std::string mismatch = checks_.find_mismatch(stalled->seq(), stalled->fingerprint());
    if (mismatch.empty()) return;
    const std::string why =
        stalled->description() + mismatch + "; the NCCL communicator was aborted";
    std::lock_guard<std::mutex> lock(mutex_);
    bool completed_meanwhile = false;
    try {
      completed_meanwhile = stalled->poll();
    } catch (const std::exception&) {
      // The mismatch is the better report.
    }
    if (broken_.empty() && !completed_meanwhile) fail_locked(why, stalled.get(), why);
  }

  // "allreduce #2 (float32 [1000], sum) timed out after 2000 ms on cuda:0 (it ran 2001 ms;
  // NCCL's state: no error); ranks that never arrived: 1; the NCCL communicator was aborted".
  // Reads the store: call without mutex_.
  std::string timeout_message(const NcclWork& work, ncclResult_t state) {
    std::string message = detail::str(work.description(), " timed out after ",
                                      options_.timeout.count(), " ms on cuda:", device_,
                                      " (it ran ", to_ms(steady_seconds() - work.started_at()),
                                      " ms; NCCL's state: ", ncclGetErrorString(state), ")");
    if (work.seq() > 0 && size_ > 1) {
      if (!options_.check_collectives) {
        message +=
            "; with check_collectives on, this message would name the ranks that never "
            "arrived";
      } else {
        message += checks_.arrivals_suffix(work.seq(), work.fingerprint());
      }
    }
    return message + "; the NCCL communicator was aborted";
  }

  const ProcessGroupOptions options_;
  const int device_;
  const bool blocking_wait_;            // LOOM_NCCL_BLOCKING_WAIT
  const std::shared_ptr<Store> store_;  // this group's keys: nccl<id>/...
  CollectiveChecks checks_;
  std::optional<cuda::Stream> comm_stream_;
  Tensor barrier_buffer_;

  std::mutex enqueue_mutex_;  // one caller at a time queues NCCL calls
  std::mutex mutex_;          // everything below, up to the watchdog's own fields
  std::condition_variable cv_;
  ncclComm_t comm_ = nullptr;  // null once aborted
  std::string broken_;         // the first failure; the group refuses new work once it is set
  std::deque<std::shared_ptr<NcclWork>> outstanding_;  // in stream order
  std::vector<std::shared_ptr<NcclWork>> draining_;    // failed, tensors held until drain_event_
  cuda::Event drain_event_;
  std::deque<std::shared_ptr<NcclWork>> unpublished_;  // fingerprints for the watchdog to publish
  bool stop_ = false;
  int64_t next_seq_ = 1;

  // The watchdog's own.
  int64_t synced_upto_ = 0;     // the last full-sync collective that completed here
  int64_t published_upto_ = 0;  // this rank's fingerprints are in the store up to here
  int64_t deleted_upto_ = 0;    // ... and deleted up to here
  bool store_failed_ = false;
  double last_probe_ = 0;
  std::thread watchdog_;
};

}  // namespace

}  // namespace loom::dist

// libloom_nccl's one export (dist/nccl_process_group.h): the group, once the front has checked
// the arguments that need no GPU.
extern "C" __attribute__((visibility("default"))) std::shared_ptr<loom::dist::ProcessGroup>
loom_nccl_make_process_group(std::shared_ptr<loom::dist::Store> store, int rank, int size,
                             loom::dist::ProcessGroupOptions options, int device) {
  using namespace loom;
  using namespace loom::dist;
  const int visible = cuda::device_count();
  LOOM_CHECK(visible > 0, DeviceError,
             "make_nccl_process_group: no CUDA device is visible; the nccl process group needs "
             "one GPU per rank (the gloo group works on CPUs)");
  if (device < 0) device = cuda::current_device();
  LOOM_CHECK(device < visible, DeviceError, "make_nccl_process_group: cuda:", device,
             " is not available: ", visible, " CUDA devices visible");
  return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, options, device);
}

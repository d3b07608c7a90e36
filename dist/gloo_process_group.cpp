// dist/gloo_process_group.cpp — ProcessGroupGloo: collectives on CPU tensors over gloo's TCP
// transport. One worker thread per group runs the collectives in call order, each preceded by
// the fingerprint check of Note [Collective checks] (collective_checks.h); send and recv are posted
// at once from the caller's thread, so that two ranks can exchange without deadlocking a queue.
#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <type_traits>

#include "dist/collective_checks.h"
#include "dist/health.h"
#include "dist/host_staging_group.h"
#include "dist/net.h"
#include "dist/process_group.h"
#include "dist/reductions.h"
#include "dist/shm_collectives.h"
#include "tensor/copy.h"
#include "tensor/dispatch.h"
#include "tensor/error.h"

namespace loom::dist {

namespace {

using Clock = std::chrono::steady_clock;

// The gloo slot prefix of loom's own ring (Note [Ring reduce-scatter]); gloo's collectives use
// 0x01 to 0x08 and user tags of send/recv are small slots.
constexpr uint8_t kRingSlotPrefix = 0x40;

// How long a failed group's release waits for its worker before leaving it (Note [A stuck
// worker]): enough for a collective that is failing anyway to say why.
constexpr Milliseconds kStuckWorkerPatience(1000);

// The time left until `deadline`, at least 1 ms (gloo reads 0 as "no timeout").
Milliseconds time_left(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<Milliseconds>(deadline - Clock::now());
  return std::max(left, Milliseconds(1));
}

// ---------------------------------------------------------------- gloo's rendezvous store

// gloo publishes each rank's addresses through this adapter over a loom store.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<dist::Store> store, Milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const Bytes value = store_->get(key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<dist::Store> store_;
  Milliseconds timeout_;
};

// ---------------------------------------------------------------- where gloo listens

// Note [Gloo address]
//   Each rank's gloo device listens on one address, which the others learn through the store.
//   LOOM_GLOO_IFACE (an interface name such as eth0) or LOOM_GLOO_HOST (an address or host name
//   of this machine) choose it. Otherwise it is this machine's address on the route to
//   MASTER_ADDR: 127.0.0.1 when rank 0 is on this machine through loopback, and the interface
//   that reaches rank 0 when it is elsewhere, which is what the other machines can reach too.
//   Without MASTER_ADDR (a single machine), 127.0.0.1.

gloo::transport::tcp::attr device_attr() {
  gloo::transport::tcp::attr attr;
  const char* iface = std::getenv("LOOM_GLOO_IFACE");
  const char* host = std::getenv("LOOM_GLOO_HOST");
  const char* master = std::getenv("MASTER_ADDR");
  if (iface != nullptr && *iface != '\0') {
    attr.iface = iface;
    return attr;
  }
  if (host != nullptr && *host != '\0') {
    attr.hostname = host;
  } else {
    attr.hostname = master != nullptr && *master != '\0' ? local_address_toward(master) : "";
    if (attr.hostname.empty()) attr.hostname = "127.0.0.1";
  }
  // gloo reads garbage (and crashes) when it cannot resolve the name: check it first.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(attr.hostname.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    throw DistError(detail::str("ProcessGroupGloo: cannot resolve '", attr.hostname,
                                "', the address to listen on (from ",
                                host != nullptr && *host != '\0' ? "LOOM_GLOO_HOST" : "MASTER_ADDR",
                                "): ", ::gai_strerror(rc)));
  }
  ::freeaddrinfo(found);
  return attr;
}

// ---------------------------------------------------------------- SIGPIPE

// Note [SIGPIPE]
//   gloo writes to its sockets with writev, which raises SIGPIPE when the peer has gone; by
//   default that kills the process before gloo can report the error. (Python ignores SIGPIPE,
//   which is why PyTorch never meets it.) loom leaves the process's disposition alone: the
//   threads that touch gloo's sockets run with SIGPIPE blocked (the group's worker and gloo's
//   event loop for good: they start inside such a scope and inherit it; a caller's thread for
//   the duration of the call), and a SIGPIPE raised meanwhile is discarded, so the write fails
//   with EPIPE and gloo reports it as an error like any other.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (sigismember(&old_, SIGPIPE)) return;  // blocked before us: leave it so
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) {
      const timespec now{0, 0};
      sigtimedwait(&pipe_, nullptr, &now);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_, old_;
};

// ---------------------------------------------------------------- reductions

using reduction::dispatch_reducible;
using reduction::divide;
using reduction::reduce_into;

template <typename T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  // gloo calls it with out == a (in place) or three distinct buffers, on n elements.
  return [op](void* out, const void* a, const void* b, size_t n) {
    T* o = static_cast<T*>(out);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    reduce_into(o, x, y, static_cast<int64_t>(n), op);
  };
}

// ---------------------------------------------------------------- checking arguments

void check_tensor(const char* op, const Tensor& t) {
  LOOM_CHECK(t.defined(), ValueError, op, ": expected a defined tensor");
  LOOM_CHECK(t.is_cpu(), DeviceError, op, ": the gloo process group takes CPU tensors; got one on ",
             t.device());
  LOOM_CHECK(t.is_contiguous(), ValueError, op, ": expected a contiguous tensor; got sizes ",
             t.sizes(), " strides ", t.strides());
}

void check_like(const char* op, const char* what, const Tensor& t, const Tensor& like) {
  check_tensor(op, t);
  LOOM_CHECK(t.dtype() == like.dtype(), DTypeError, op, ": ", what, " is ", t.dtype(),
             ", expected ", like.dtype());
  LOOM_CHECK(t.sizes() == like.sizes(), ShapeError, op, ": ", what, " has shape ", t.sizes(),
             ", expected ", like.sizes());
}

void check_reducible(const char* op, DType dtype) {
  dispatch_reducible(dtype, op, []<typename T>() {});
}

// ---------------------------------------------------------------- Work

// What the group's collectives and its send/recv handles share.
struct GroupState {
  std::shared_ptr<gloo::Context> context;
  // The segment that carries allreduce, broadcast, all-gather and reduce-scatter when every rank
  // is on this host (Note [Shared-memory allreduce]); null otherwise.
  std::unique_ptr<ShmCollectives> shm;
  std::mutex mutex;
  std::string broken;  // the first failure; the group refuses new work once it is set

  // Records the first failure and closes every connection of this rank (and aborts its
  // shared-memory segment), so that peers blocked in a collective with it fail at once instead
  // of waiting for their timeout.
  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!broken.empty()) return;
      broken = why;
    }
    try {
      context->closeConnections();
    } catch (const std::exception&) {
      // Already closed or closing: the peers learn of it either way.
    }
    if (shm) shm->abort(why);
  }
  std::string failure() {
    std::lock_guard<std::mutex> lock(mutex);
    return broken;
  }
  // The job failed elsewhere (Note [Job health]): fail, and release the group's worker should
  // it wait in the store for a peer's fingerprint that will never come.
  void abandon(const std::string& why) {
    fail(why);
    std::function<void(const std::string&)> release;
    {
      std::lock_guard<std::mutex> lock(mutex);
      release = release_waiters;
    }
    if (release) release(why);
  }
  std::function<void(const std::string&)> release_waiters;  // set while the group lives
};

// A collective's handle: completed by the worker thread.
class CollectiveWork final : public Work {
 public:
  CollectiveWork(std::string description, Milliseconds default_timeout,
                 std::shared_ptr<GroupState> state)
      : description_(std::move(description)),
        default_timeout_(default_timeout),
        state_(std::move(state)) {}

  bool is_completed() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  // Without a timeout, waits as long as the operation may take: it fails by itself, with its
  // diagnosis, once it has run for the group's timeout (the wait gives up only if it somehow
  // has not, twice over). While it waits the rank beats, and a failure that the launchers
  // reported (Note [Job health]) ends the wait at once, naming it.
  void wait(Milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto begin = Clock::now();
    while (!done_) {
      cv_.wait_for(lock, Milliseconds(100), [&] { return done_; });
      if (done_) break;
      heartbeat();
      if (const std::string failure = job_failure(); !failure.empty()) {
        lock.unlock();
        const std::string why = description_ + " cannot finish: " + failure;
        state_->abandon(why);
        throw DistError(why);
      }
      if (timeout > Milliseconds(0)) {
        if (Clock::now() - begin >= timeout) gave_up(timeout);
        continue;
      }
      const double started = started_.load();
      const double limit = 2.0 * std::chrono::duration<double>(default_timeout_).count() + 10.0;
      if (started > 0 && steady_seconds() - started > limit) {
        gave_up(std::chrono::duration_cast<Milliseconds>(std::chrono::duration<double>(limit)));
      }
    }
    if (failed_) throw DistError(error_);  // a fresh exception for each waiter and thread
  }

  double started_at() const override { return started_.load(); }
  double finished_at() const override { return finished_.load(); }

  const std::string& description() const { return description_; }
  [[noreturn]] void gave_up(Milliseconds waited) const {
    throw DistError(detail::str(description_, ": wait() gave up after ", waited.count(),
                                " ms; the operation is still queued or running"));
  }
  void start() { started_ = steady_seconds(); }
  // An empty `error` means success.
  void finish(std::string error) {
    if (started_.load() == 0) started_ = steady_seconds();
    finished_ = steady_seconds();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failed_ = !error.empty();
      error_ = std::move(error);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  const std::string description_;
  const Milliseconds default_timeout_;
  const std::shared_ptr<GroupState> state_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  bool failed_ = false;
  std::string error_;
  std::atomic<double> started_{0}, finished_{0};
};

// A send or recv: posted at once; wait() waits for gloo to finish it. Keep the handle until
// then: dropping it withdraws the tensor's buffer from gloo.
class PointToPointWork final : public Work {
 public:
  PointToPointWork(std::string description, std::shared_ptr<GroupState> state,
                   std::unique_ptr<gloo::transport::UnboundBuffer> buffer, Tensor tensor,
                   bool is_send, Milliseconds default_timeout)
      : description_(std::move(description)),
        state_(std::move(state)),
        buffer_(std::move(buffer)),
        tensor_(std::move(tensor)),
        is_send_(is_send),
        default_timeout_(default_timeout),
        started_(steady_seconds()) {}

  // Turns true once wait() has returned (gloo cannot be asked without blocking).
  bool is_completed() const override { return done_.load(); }

  // For send and recv the timeout is the operation's own: it fails (and breaks the group, as
  // a collective's timeout does) when the peer has not matched it in time.
  void wait(Milliseconds timeout) override {
    if (timeout <= Milliseconds(0)) timeout = default_timeout_;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done_) {
      ScopedSigpipeBlock no_sigpipe;  // Note [SIGPIPE]
      try {
        if (!buffer_) {
          // Nothing to transfer (an empty tensor).
        } else if (is_send_ ? !buffer_->waitSend(timeout) : !buffer_->waitRecv(timeout)) {
          throw DistError(description_ + " was aborted");
        }
      } catch (const std::exception& e) {
        const std::string why =
            detail::str(description_, " failed within ", timeout.count(), " ms: ", e.what());
        error_ = why;
        state_->fail(why);
      }
      finished_ = steady_seconds();
      done_ = true;
    }
    if (!error_.empty()) throw DistError(error_);
  }

  double started_at() const override { return started_; }
  double finished_at() const override { return finished_.load(); }

 private:
  const std::string description_;
  std::shared_ptr<GroupState> state_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  Tensor tensor_;  // keeps the memory gloo reads or writes alive
  const bool is_send_;
  const Milliseconds default_timeout_;
  const double started_;
  std::atomic<double> finished_{0};
  std::mutex mutex_;  // one waiter at a time
  std::atomic<bool> done_{false};
  std::string error_;  // empty: success; written before done_
};

// ---------------------------------------------------------------- the process group

std::atomic<int> next_group_id{0};

class ProcessGroupGloo final : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
      : ProcessGroup(rank, size),
        options_(options),
        // Groups are numbered in the order they are made: the same on every rank.
        store_(std::make_shared<PrefixStore>("pg" + std::to_string(next_group_id++), store)),
        state_(std::make_shared<GroupState>()),
        checks_(store_, rank, size, options_.timeout) {
    store_->set_timeout(options_.timeout);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options_.timeout);
    const gloo::transport::tcp::attr attr = device_attr();
    ScopedSigpipeBlock no_sigpipe;  // Note [SIGPIPE]: gloo's loop and our worker inherit it
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      GlooStore gloo_store(std::make_shared<PrefixStore>("gloo", store_), options_.timeout);
      context->connectFullMesh(gloo_store, device);
    } catch (const std::exception& e) {
      throw DistError(detail::str("ProcessGroupGloo: rank ", rank, " of ", size,
                                  " could not connect to its peers (listening on ",
                                  attr.iface.empty() ? attr.hostname : "interface " + attr.iface,
                                  "; see LOOM_GLOO_HOST): ", e.what()));
    }
    state_->context = context;
    if (size > 1 && options_.shared_memory) {
      state_->shm = ShmCollectives::connect(*store_, rank, size, options_.timeout, no_shm_);
    }
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->release_waiters = [this](const std::string& why) { release_waiters(why); };
    }
    worker_ = std::thread([this] { worker_loop(); });
  }

  // The worker has ended (or was orphaned and ends now, deleting the group: Note [A stuck
  // worker]).
  ~ProcessGroupGloo() override {
    if (worker_.joinable()) worker_.join();
  }

  // Note [A stuck worker]
  //   Once a group has failed, its worker may be stuck inside gloo: a collective that began as
  //   the group failed waits for a peer that has gone, and closing the connections does not
  //   wake it (gloo's Pair::close ends the socket without signalling the buffers waiting on
  //   it), so it would wait for the collective's timeout, minutes. A rank that raised DistError
  //   must not wait that long to say so and exit. The group is therefore released by
  //   `release` rather than deleted: a healthy group runs what is queued and joins its worker
  //   as before; a failed one waits a moment for the worker to end, and otherwise leaves it to
  //   end the group itself whenever gloo lets it go (at the latest when the process exits).
  static void release(ProcessGroupGloo* group) {
    {
      std::lock_guard<std::mutex> lock(group->state_->mutex);
      group->state_->release_waiters = nullptr;
    }
    std::unique_lock<std::mutex> lock(group->queue_mutex_);
    group->stop_ = true;
    group->queue_cv_.notify_all();
    if (!group->state_->failure().empty() &&
        !group->queue_cv_.wait_for(lock, kStuckWorkerPatience, [&] { return group->ended_; })) {
      group->orphaned_ = true;  // the worker deletes the group when it ends
      group->worker_.detach();
      return;
    }
    lock.unlock();
    delete group;
  }

  std::string backend() const override { return "gloo"; }
  std::string transport() const override {
    if (size_ == 1) return "none (one rank)";
    if (state_->shm)
      return "shared memory (allreduce, broadcast, allgather, reduce_scatter) and tcp (the rest)";
    return no_shm_.empty() ? "tcp" : "tcp (no shared memory: " + no_shm_ + ")";
  }

  std::shared_ptr<Work> allreduce(Tensor t, ReduceOp op) override {
    check_tensor("allreduce", t);
    check_reducible("allreduce", t.dtype());
    count("allreduce", static_cast<int64_t>(t.nbytes()));
    return enqueue("allreduce", describe_tensor(t) + ", " + to_string(op), /*full_sync=*/true,
                   [this, t, op](uint32_t tag, Milliseconds timeout) {
                     allreduce_in_place(t.data(), t.numel(), t.dtype(), op, tag, timeout);
                   });
  }

  std::shared_ptr<Work> broadcast(Tensor t, int root) override {
    check_tensor("broadcast", t);
    LOOM_CHECK(root >= 0 && root < size_, ValueError, "broadcast: root ", root,
               " is not a rank of this group of ", size_);
    count("broadcast", static_cast<int64_t>(t.nbytes()));
    return enqueue("broadcast", describe_tensor(t) + ", root " + std::to_string(root),
                   /*full_sync=*/false, [this, t, root](uint32_t tag, Milliseconds timeout) {
                     if (t.nbytes() == 0 || size_ == 1) return;
                     if (state_->shm) {
                       state_->shm->broadcast(t.data(), static_cast<int64_t>(t.nbytes()), root,
                                              Clock::now() + timeout, shm_failure_);
                       return;
                     }
                     gloo::BroadcastOptions opts(state_->context);
                     opts.setOutput(static_cast<uint8_t*>(t.data()), t.nbytes());
                     opts.setRoot(root);
                     opts.setTag(tag);
                     opts.setTimeout(timeout);
                     gloo::broadcast(opts);
                   });
  }

  // gloo's ring all-gather into one flat buffer: the outputs themselves when they lie back to
  // back (in place when the input is this rank's piece of them), else a scratch buffer.
  std::shared_ptr<Work> allgather(std::vector<Tensor> out, Tensor input) override {
    check_tensor("allgather", input);
    LOOM_CHECK(static_cast<int>(out.size()) == size_, ValueError, "allgather: expected ", size_,
               " output tensors (one per rank); got ", out.size());
    for (const Tensor& o : out) check_like("allgather", "an output", o, input);
    count("allgather", static_cast<int64_t>(input.nbytes()) * size_);
    const bool direct = lie_back_to_back(out);
    const bool in_place = direct && input.data() == out[static_cast<size_t>(rank_)].data();
    LOOM_CHECK(in_place || !direct || !input.is_alias_of(out[0]) || input.nbytes() == 0, ValueError,
               "allgather: the input overlaps the outputs without being this rank's piece of them");
    return enqueue("allgather", describe_tensor(input), /*full_sync=*/true,
                   [this, out, input, direct, in_place](uint32_t tag, Milliseconds timeout) {
                     const size_t nbytes = input.nbytes();
                     if (nbytes == 0) return;
                     if (size_ == 1) {
                       if (!in_place) std::memmove(out[0].data(), input.data(), nbytes);
                       return;
                     }
                     if (state_->shm) {
                       std::vector<void*> outputs;
                       for (const Tensor& o : out) outputs.push_back(o.data());
                       state_->shm->allgather(input.data(), outputs, static_cast<int64_t>(nbytes),
                                              Clock::now() + timeout, shm_failure_);
                       return;
                     }
                     Tensor scratch;
                     uint8_t* flat = static_cast<uint8_t*>(out[0].data());
                     if (!direct) {
                       scratch = loom::empty({static_cast<int64_t>(nbytes) * size_}, kUInt8);
                       flat = static_cast<uint8_t*>(scratch.data());
                     }
                     gloo::AllgatherOptions opts(state_->context);
                     if (!in_place) opts.setInput(static_cast<uint8_t*>(input.data()), nbytes);
                     opts.setOutput(flat, nbytes * size_);
                     opts.setTag(tag);
                     opts.setTimeout(timeout);
                     gloo::allgather(opts);
                     if (!direct)
                       for (int r = 0; r < size_; ++r)
                         std::memcpy(out[r].data(), flat + r * nbytes, nbytes);
                   });
  }

  // Note [Ring reduce-scatter]
  // gloo's new API has no reduce-scatter, so loom runs the textbook ring on gloo's point-to-point
  // buffers. N ranks in a ring, rank r receiving from r-1 and sending to r+1; the input is N
  // pieces, piece c destined for rank c. In step s = 0 .. N-2, rank r sends its running sum of
  // piece (r - s - 1) mod N (at s = 0 its own input's piece) and receives the running sum of
  // piece (r - s - 2) mod N, to which it adds its own input's piece. After N-1 steps the piece it
  // received last is its own, r, now summed over every rank. Each rank sends N-1 pieces:
  // (N-1)/N of the buffer, half of an allreduce. The inputs are read, never written.
  std::shared_ptr<Work> reduce_scatter(Tensor out, std::vector<Tensor> inputs,
                                       ReduceOp op) override {
    check_tensor("reduce_scatter", out);
    check_reducible("reduce_scatter", out.dtype());
    LOOM_CHECK(static_cast<int>(inputs.size()) == size_, ValueError, "reduce_scatter: expected ",
               size_, " input tensors (one per rank); got ", inputs.size());
    for (const Tensor& in : inputs) check_like("reduce_scatter", "an input", in, out);
    count("reduce_scatter", static_cast<int64_t>(out.nbytes()) * size_);
    return enqueue("reduce_scatter", describe_tensor(out) + ", " + to_string(op),
                   /*full_sync=*/true, [this, out, inputs, op](uint32_t tag, Milliseconds timeout) {
                     ring_reduce_scatter(out, inputs, op, tag, timeout);
                   });
  }
  std::shared_ptr<Work> alltoall(Tensor out, Tensor input) override {
    check_tensor("alltoall", input);
    check_tensor("alltoall", out);
    check_alltoall("gloo", out, input, size_);
    count("alltoall", static_cast<int64_t>(input.nbytes()));
    return enqueue("alltoall", describe_tensor(input), /*full_sync=*/true,
                   [this, out, input](uint32_t tag, Milliseconds timeout) {
                     const size_t nbytes = input.nbytes();
                     if (nbytes == 0) return;
                     if (size_ == 1) {
                       std::memcpy(out.data(), input.data(), nbytes);
                       return;
                     }
                     gloo::AlltoallOptions opts(state_->context);
                     opts.setInput(static_cast<uint8_t*>(input.data()), nbytes);
                     opts.setOutput(static_cast<uint8_t*>(out.data()), nbytes);
                     opts.setTag(tag);
                     opts.setTimeout(timeout);
                     gloo::alltoall(opts);
                   });
  }
  std::shared_ptr<Work> barrier() override {
    return enqueue("barrier", "", /*full_sync=*/true, [this](uint32_t tag, Milliseconds timeout) {
      if (size_ == 1) return;
      gloo::BarrierOptions opts(state_->context);
      opts.setTag(tag);
      opts.setTimeout(timeout);
      gloo::barrier(opts);
    });
  }

  std::shared_ptr<Work> send(Tensor t, int dst, int tag) override {
    if (t.defined()) count("send", static_cast<int64_t>(t.nbytes()));
    return point_to_point("send", t, dst, tag, /*is_send=*/true);
  }
  std::shared_ptr<Work> recv(Tensor t, int src, int tag) override {
    return point_to_point("recv", t, src, tag, /*is_send=*/false);
  }

 private:
  using Body = std::function<void(uint32_t tag, Milliseconds timeout)>;
  struct Task {
    std::shared_ptr<CollectiveWork> work;
    int64_t seq = 0;
    std::string fingerprint;  // "allreduce(float32 [1000], sum)"
    bool full_sync = false;   // every rank's data reaches every rank (not broadcast)
    Body body;
  };

  void throw_if_broken(const std::string& what) {
    const std::string failure = state_->failure();
    LOOM_CHECK(failure.empty(), DistError, what,
               ": the process group is unusable after an earlier failure: ", failure);
  }

  std::shared_ptr<Work> enqueue(const std::string& name, const std::string& details, bool full_sync,
                                Body body) {
    std::shared_ptr<CollectiveWork> work;
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      throw_if_broken(name);
      const int64_t seq = next_seq_++;
      std::string description = name + " #" + std::to_string(seq);
      if (!details.empty()) description += " (" + details + ")";
      work = std::make_shared<CollectiveWork>(std::move(description), options_.timeout, state_);
      queue_.push_back(Task{work, seq, name + "(" + details + ")", full_sync, std::move(body)});
    }
    queue_cv_.notify_all();
    return work;
  }

  std::shared_ptr<Work> point_to_point(const char* op, const Tensor& t, int peer, int tag,
                                       bool is_send) {
    check_tensor(op, t);
    LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, ValueError, op, ": rank ", peer,
               " is not another rank of this group of ", size_, " (this is rank ", rank_, ")");
    LOOM_CHECK(tag >= 0, ValueError, op, ": the tag must be non-negative; got ", tag);
    const std::string description = detail::str(op, is_send ? " to rank " : " from rank ", peer,
                                                " (", describe_tensor(t), ", tag ", tag, ")");
    throw_if_broken(description);
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    if (t.nbytes() > 0) {
      ScopedSigpipeBlock no_sigpipe;  // Note [SIGPIPE]
      try {
        buffer = state_->context->createUnboundBuffer(t.data(), t.nbytes());
        // User tags are gloo slots; gloo's collectives use slots with a high prefix byte.
        if (is_send) {
          buffer->send(peer, static_cast<uint64_t>(tag));
        } else {
          buffer->recv(peer, static_cast<uint64_t>(tag));
        }
      } catch (const std::exception& e) {
        throw DistError(description + " failed: " + e.what());
      }
    }
    return std::make_shared<PointToPointWork>(description, state_, std::move(buffer), t, is_send,
                                              options_.timeout);
  }

  void allreduce_in_place(void* data, int64_t n, DType dtype, ReduceOp op, uint32_t tag,
                          Milliseconds timeout) {
    if (n == 0 || size_ == 1) return;
    if (state_->shm) {
      state_->shm->allreduce(data, n, dtype, op, Clock::now() + timeout, shm_failure_);
      return;
    }
    dispatch_reducible(dtype, "allreduce", [&]<typename T>() {
      gloo::AllreduceOptions opts(state_->context);
      opts.setOutput(static_cast<T*>(data), static_cast<size_t>(n));  // in place
      opts.setReduceFunction(reduce_function<T>(op));
      opts.setTag(tag);
      opts.setTimeout(timeout);
      gloo::allreduce(opts);
      if (op == ReduceOp::Avg) divide(static_cast<T*>(data), n, size_);
    });
  }

  // Note [Ring reduce-scatter], on the worker thread.
  void ring_reduce_scatter(const Tensor& out, const std::vector<Tensor>& inputs, ReduceOp op,
                           uint32_t tag, Milliseconds timeout) {
    const int64_t n = out.numel();
    if (n == 0) return;
    if (size_ == 1) {
      if (out.data() != inputs[0].data()) std::memmove(out.data(), inputs[0].data(), out.nbytes());
      return;
    }
    if (state_->shm) {
      std::vector<const void*> pieces;
      for (const Tensor& in : inputs) pieces.push_back(in.data());
      state_->shm->reduce_scatter(out.data(), pieces, n, out.dtype(), op, Clock::now() + timeout,
                                  shm_failure_);
      return;
    }
    const size_t nbytes = out.nbytes();
    const int left = (rank_ - 1 + size_) % size_, right = (rank_ + 1) % size_;
    auto piece = [&](int step_back) { return ((rank_ - step_back) % size_ + size_) % size_; };
    Tensor received = loom::empty({n}, out.dtype());
    Tensor running = loom::empty({n}, out.dtype());
    auto recv_buffer = state_->context->createUnboundBuffer(received.data(), nbytes);
    auto send_buffer = state_->context->createUnboundBuffer(running.data(), nbytes);
    const uint64_t slot = gloo::Slot::build(kRingSlotPrefix, tag);
    dispatch_reducible(out.dtype(), "reduce_scatter", [&]<typename T>() {
      const auto reduce = reduce_function<T>(op);
      for (int step = 0; step < size_ - 1; ++step) {
        if (step == 0) {  // this rank's own input piece goes first, read in place
          auto first = state_->context->createUnboundBuffer(
              const_cast<void*>(inputs[static_cast<size_t>(piece(1))].data()), nbytes);
          recv_buffer->recv(left, slot);
          first->send(right, slot);
          recv_buffer->waitRecv(timeout);
          first->waitSend(timeout);
        } else {
          recv_buffer->recv(left, slot);
          send_buffer->send(right, slot);
          recv_buffer->waitRecv(timeout);
          send_buffer->waitSend(timeout);
        }
        const bool last = step == size_ - 2;
        void* sum = last ? out.data() : running.data();
        reduce(sum, received.data(), inputs[static_cast<size_t>(piece(step + 2))].data(),
               static_cast<size_t>(n));
      }
      if (op == ReduceOp::Avg) divide(static_cast<T*>(out.data()), n, size_);
    });
  }

  // ---- the worker

  void worker_loop() {
    while (true) {
      std::optional<Task> task;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty() || has_garbage(); });
        if (!queue_.empty()) {
          task = std::move(queue_.front());
          queue_.pop_front();
        } else if (stop_) {
          if (orphaned_) {
            lock.unlock();
            delete this;  // Note [A stuck worker]
            return;
          }
          ended_ = true;
          queue_cv_.notify_all();
          return;
        }
      }
      if (task) {
        execute(*task);
      } else {
        collect_garbage();
      }
    }
  }

  // Writes tombstones for the peers whose fingerprint of the running collective is missing
  // (Note [Collective checks]): a worker waiting for one of them goes on and fails.
  void release_waiters(const std::string& why) {
    int64_t seq = 0;
    std::string fingerprint, description;
    {
      std::lock_guard<std::mutex> lock(running_mutex_);
      seq = running_seq_;
      fingerprint = running_fingerprint_;
      description = running_description_;
    }
    if (seq > 0 && options_.check_collectives && size_ > 1)
      checks_.diagnose(seq, fingerprint, description, /*timed_out=*/false, why);
  }

  void execute(Task& task) {
    CollectiveWork& work = *task.work;
    {
      std::lock_guard<std::mutex> lock(running_mutex_);
      running_seq_ = task.seq;
      running_fingerprint_ = task.fingerprint;
      running_description_ = work.description();
    }
    work.start();
    const auto begin = Clock::now();
    const auto deadline = begin + options_.timeout;
    const std::string failure = state_->failure();
    if (!failure.empty()) {
      work.finish(work.description() +
                  ": the process group is unusable after an earlier failure: " + failure);
      return;
    }
    std::string error;
    try {
      if (options_.check_collectives && size_ > 1)
        checks_.check(task.seq, task.fingerprint, work.description(), time_left(deadline));
      try {
        task.body(static_cast<uint32_t>(task.seq), time_left(deadline));
      } catch (const std::exception& e) {
        const bool timed_out = Clock::now() + Milliseconds(50) >= deadline ||
                               std::strstr(e.what(), "imed out") != nullptr;
        // A peer that died closed its connections: under loomrun its launcher says who it
        // was and how it ended (Note [Job health]), which says more than the fingerprints.
        if (const std::string failure = job_failure_within(Milliseconds(2000)); !failure.empty())
          throw DistError(detail::str(work.description(), " cannot finish: ", failure,
                                      " (gloo: ", e.what(), ")"));
        throw DistError(diagnose(task, timed_out, std::string("gloo: ") + e.what()));
      }
      if (task.full_sync) synced_upto_ = task.seq;
    } catch (const DistError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = work.description() + " failed: " + e.what();
    }
    if (!error.empty()) state_->fail(error);
    work.finish(std::move(error));
  }

  // Fingerprint keys are deleted once every rank is known to have read them: after a
  // collective in which every rank's data reaches every rank (all but broadcast) completed
  // here, each rank has passed its own check for it and for every collective before. The
  // deletes run when the queue is empty, off the collectives' path.
  bool has_garbage() const {
    return options_.check_collectives && size_ > 1 && deleted_upto_ < synced_upto_;
  }

  void collect_garbage() {
    if (checks_.forget(deleted_upto_ + 1)) {
      ++deleted_upto_;
    } else {
      deleted_upto_ = synced_upto_;  // the store is gone: the group will find out on its own
    }
  }

  // Why a collective failed, from the fingerprints in the store (Note [Collective checks]).
  std::string diagnose(const Task& task, bool timed_out, const std::string& cause) {
    if (options_.check_collectives)
      return checks_.diagnose(task.seq, task.fingerprint, task.work->description(), timed_out,
                              cause);
    return detail::str(task.work->description(),
                       timed_out ? detail::str(" timed out after ", options_.timeout.count(), " ms")
                                 : std::string(" failed"),
                       " (", cause,
                       "); with check_collectives on, this message would name the ranks that "
                       "never arrived");
  }

  const ProcessGroupOptions options_;
  const std::shared_ptr<Store> store_;  // this group's keys: pg<id>/...
  std::string no_shm_;  // why every collective goes over tcp though options_.shared_memory asked
  // What the shared-memory collectives poll while they wait: this group's failure, if any.
  const std::function<std::string()> shm_failure_ = [this] { return state_->failure(); };
  const std::shared_ptr<GroupState> state_;
  CollectiveChecks checks_;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  bool ended_ = false;     // the worker has returned
  bool orphaned_ = false;  // released while the worker was stuck (Note [A stuck worker])
  int64_t next_seq_ = 1;

  // The collective the worker runs, for release_waiters.
  std::mutex running_mutex_;
  int64_t running_seq_ = 0;
  std::string running_fingerprint_, running_description_;

  // Touched by the worker only.
  int64_t synced_upto_ = 0;   // the last full-sync collective that completed here
  int64_t deleted_upto_ = 0;  // this rank's fingerprint keys up to here are deleted
  std::thread worker_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank,
                                                      int size, ProcessGroupOptions options) {
  check_group_arguments("make_gloo_process_group", store.get(), rank, size, options);
  return stage_through_host(std::shared_ptr<ProcessGroupGloo>(
      new ProcessGroupGloo(std::move(store), rank, size, options), &ProcessGroupGloo::release));
}

}  // namespace loom::dist

// tensor/cuda/runtime.h — the CUDA runtime services tensor/ needs: devices, the caching device
// allocator, streams and events, pinned host memory, synchronous and asynchronous copies.
// Host-only (no CUDA header). Part of libloom_cuda: code outside tensor/cuda/ reaches these
// through the table of tensor/cuda_backend.h (Note [The CUDA backend library]).
//
// Device indices are those the CUDA runtime shows: with CUDA_VISIBLE_DEVICES=2,3 set, cuda:0 is
// physical GPU 2 and cuda:1 is GPU 3, and device_count() is 2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "tensor/caching_allocator.h"
#include "tensor/dtype.h"

namespace loom::cuda {

bool is_built();     // true when loom was compiled with LOOM_CUDA
int device_count();  // visible devices; 0 without a driver or a GPU
int current_device();
void set_device(int device);
void synchronize(int device);  // waits for all work on the device
// The dense peak in FLOP/s of `device` for products in `dtype`: streaming multiprocessors x
// clock x the FLOPs an SM does per clock for that dtype on that architecture (FMA = 2 FLOPs;
// tensor cores for float16 and bfloat16, without sparsity), as the vendor's tables state them.
double dense_peak_flops(int device, DType dtype);

// Sets the current device for a scope and restores the previous one on exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  int previous() const { return previous_; }

 private:
  int previous_ = -1;
  int device_ = -1;
};

class Event;

// A CUDA stream on one device. Copies share it: a stream made by create() is destroyed (after
// its work has finished) when the last copy goes. default_stream() is the device's legacy
// default stream (handle 0), which orders itself with every other blocking stream.
// Each thread has a current stream per device, the default stream until set otherwise; device
// memory is allocated for, and cached per, the current stream (Note [Caching allocator]).
class Stream {
 public:
  static Stream create(int device);
  static Stream default_stream(int device);
  static Stream current(int device);  // this thread's current stream of `device`
  static void set_current(const Stream& stream);

  int device() const { return device_; }
  void* handle() const { return handle_.get(); }  // the cudaStream_t
  StreamId id() const { return reinterpret_cast<StreamId>(handle()); }
  bool is_default() const { return handle() == nullptr; }
  void synchronize() const;             // the host waits for the work queued so far
  bool query() const;                   // true when all queued work has finished
  void wait(const Event& event) const;  // later work on this stream waits for the event
  bool operator==(const Stream& other) const {
    return device_ == other.device_ && handle() == other.handle();
  }

 private:
  Stream(int device, std::shared_ptr<void> handle) : device_(device), handle_(std::move(handle)) {}
  int device_ = 0;
  std::shared_ptr<void> handle_;  // the cudaStream_t; owns it for created streams
};

// Makes `stream` current on its device for a scope, then restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// A CUDA event: marks a point in a stream's work. The CUDA event is created on the first
// record(), on the recording stream's device. With timing=false it is cheaper to record and wait.
class Event {
 public:
  explicit Event(bool timing = false) : timing_(timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  void wait(const Stream& stream) const;  // same as stream.wait(*this)
  void synchronize() const;               // the host waits until the event has happened
  bool query() const;                     // true when it has happened (or was never recorded)
  // Milliseconds from this event to `end`; both recorded with timing=true and completed.
  float elapsed_ms(const Event& end) const;
  bool recorded() const { return handle_ != nullptr; }
  void* handle() const { return handle_; }  // the cudaEvent_t

 private:
  bool timing_ = false;
  int device_ = -1;
  void* handle_ = nullptr;
};

// Device memory through the caching allocator, for this thread's current stream of `device`.
void* allocate(size_t nbytes, int device);
void deallocate(void* ptr, int device);  // never throws
// Gives cached, unused device memory back to the driver.
void empty_cache();
AllocatorStats allocator_stats(int device);
void reset_peak_allocator_stats(int device);

// Page-locked (pinned) host memory: the host side of asynchronous copies. Portable to every
// device.
void* allocate_pinned(size_t nbytes);
void free_pinned(void* ptr);  // never throws

// A pinned host buffer that frees itself.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t nbytes) : data_(allocate_pinned(nbytes)), nbytes_(nbytes) {}
  ~PinnedBuffer() { free_pinned(data_); }
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(o.data_), nbytes_(o.nbytes_) {
    o.data_ = nullptr;
    o.nbytes_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(nbytes_, o.nbytes_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
};

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
// Synchronous copy: returns when the bytes have arrived.
void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device);
// Queues the copy on `stream` and returns at once. Truly asynchronous only with pinned host
// memory; the host buffer must stay alive until the stream has passed the copy.
void copy_bytes_async(void* dst, const void* src, size_t nbytes, CopyKind kind,
                      const Stream& stream);

// Note [Deferred device checks]
// Some checks need a kernel's answer, such as whether every class target is in range. Reading
// that answer at once would make the host wait for the device in the middle of a step: the
// queue of work drains, and the GPU idles while the host queues the next ops. So such an op
// defers its check instead. The kernel writes its finding to device memory, and a copy to
// pinned host memory and an event follow on the same stream. `verdict` (host code that throws
// the op's error, naming the op and its shapes) runs on the host once that copy has arrived.
// Each thread settles its own checks, in the order it queued them:
//   - at each copy to the host through copy_bytes (item(), to_vector(), .to(kCPU)) and at
//     synchronize(), where the host waits for the device anyway;
//   - without waiting, whenever it defers a new check.
// A bad target thus raises its IndexError at the latest at the next item() or synchronize()
// (of the stream or device it ran on: a check queued on another stream, or behind one not yet
// arrived from another device, waits for a later settling). There the exception is the same
// typed error, and the process goes on: where PyTorch's device-side assert leaves the CUDA
// context unusable. Until then the op's outputs at the bad positions are NaN, so a step taken
// before the next wait can write NaN into the parameters, as a NaN loss would. With
// LOOM_SYNC_CHECKS=1 in the environment every check is settled as it is deferred (the host
// waits there), for debugging, as CUDA_LAUNCH_BLOCKING=1 does for launches. Checks still
// pending when their thread ends are dropped. `nbytes` is at most 32.
void defer_check(const void* device_bytes, size_t nbytes, const Stream& stream,
                 std::function<void(const void* host_bytes)> verdict);
// Runs the verdicts of this thread's deferred checks whose copies have arrived (wait: of all,
// waiting for them). The first verdict that throws ends the call with its exception; the
// checks before it, and it, are settled.
void settle_checks(bool wait);
size_t pending_checks();  // this thread's

// While one lives, this thread's settle_checks does nothing. It is for library code that waits
// for the device in the middle of changing its own state: GradScaler's unscale, DDP's bucket
// rebuild, replica check and found-inf agreement, the host staging of gloo collectives,
// SyncBatchNorm's global count check. An earlier op's check cannot then throw halfway through
// (on some ranks only) and leave that state half changed; it is settled at the thread's next
// wait outside such code. hold_deferred_checks(+1 / -1) is the same without an object.
void hold_deferred_checks(int delta);
class DeferredChecksHold {
 public:
  DeferredChecksHold();
  ~DeferredChecksHold();
  DeferredChecksHold(const DeferredChecksHold&) = delete;
  DeferredChecksHold& operator=(const DeferredChecksHold&) = delete;
};

}  // namespace loom::cuda

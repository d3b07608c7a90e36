// tensor/cuda/runtime.cu — devices, streams, events, pinned memory and copies through the CUDA
// runtime, and the caching allocator (caching_allocator.h) plugged onto cudaMalloc/cudaFree and
// the device's memory cap.
// Every call is checked (check.h): a failure is a DeviceError naming the call, error and device.

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace loom::cuda {

namespace {

cudaStream_t raw_stream(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

void check_device(int device) {
  const int n = device_count();
  if (device < 0 || device >= n)
    throw DeviceError(detail::str("cuda:", device, " is not available: ", n,
                                  " CUDA devices visible (indices count the devices "
                                  "CUDA_VISIBLE_DEVICES leaves visible)"));
}

// The device allocator: never destroyed, since tensors may be freed after static destructors.
CachingAllocator& device_allocator() {
  static CachingAllocator* allocator = new CachingAllocator(RawAllocator{
      [](size_t nbytes, int device) -> void* {
        DeviceGuard guard(device);
        void* ptr = nullptr;
        cudaError_t status = cudaMalloc(&ptr, nbytes);
        if (status == cudaErrorMemoryAllocation) {  // the allocator frees its cache and retries
          cudaGetLastError();
          return nullptr;
        }
        check_cuda(status, device, "cudaMalloc(", nbytes, " bytes)");
        return ptr;
      },
      [](void* ptr, int device) {  // cudaFree waits for the device: the block is idle after it
        int previous = 0;
        if (cudaGetDevice(&previous) != cudaSuccess) return;
        if (cudaSetDevice(device) == cudaSuccess) cudaFree(ptr);
        cudaSetDevice(previous);
        // A failure here has no one to tell (this runs from destructors); clear it so that the
        // next check_launch does not report it against an unrelated kernel.
        cudaGetLastError();
      },
      "cudaMalloc",
      // The device's cap (Note [Device memory cap]): asked only before a cudaMalloc.
      [](int device) { return memory_limit(Device(DeviceType::CUDA, device)); }});
  return *allocator;
}

// Each thread's current stream per device; a device not listed uses its default stream.
std::unordered_map<int, Stream>& current_streams() {
  thread_local std::unordered_map<int, Stream> streams;
  return streams;
}

// The answer of cudaStreamQuery/cudaEventQuery: done, not yet (not an error), or a failure.
bool finished(cudaError_t status, int device, const char* call) {
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check_cuda(status, device, call);
  return true;
}

cudaMemcpyKind memcpy_kind(CopyKind kind) {
  switch (kind) {
    case CopyKind::HostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::DeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::DeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

const char* kind_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::HostToDevice:
      return "host to device";
    case CopyKind::DeviceToHost:
      return "device to host";
    case CopyKind::DeviceToDevice:
      return "device to device";
  }
  return "?";
}

}  // namespace

// ---------------------------------------------------------------- devices

bool is_built() { return true; }

// Asked once: CUDA_VISIBLE_DEVICES is read when CUDA starts, and every launch and allocation
// checks its device against this count.
int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {  // no driver or no device: zero GPUs
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

// FLOPs per SM and clock: float32 (CUDA cores x 2) and 16-bit tensor-core products, per compute
// capability (the whitepapers' dense figures: V100 125, A100 312, H100 SXM 989 TFLOP/s in 16
// bits). float64 counts as float32's rate halved on the data-centre parts, which is a bound.
double dense_peak_flops(int device, DType dtype) {
  int sms = 0, clock_khz = 0, major = 0, minor = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), device);
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device), device);
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                  device);
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
                  device);
  const int cc = major * 10 + minor;
  const double fp32_per_clock = (cc == 80 || cc == 70 || cc < 70) ? 128 : 256;  // 64 or 128 cores
  double tensor_per_clock = 0;
  if (cc >= 100)
    tensor_per_clock = 8192;
  else if (cc >= 90)
    tensor_per_clock = 4096;
  else if (cc == 80)
    tensor_per_clock = 2048;
  else if (cc >= 70)
    tensor_per_clock = 1024;
  const double per_clock = is_16bit_float(dtype) && tensor_per_clock > 0 ? tensor_per_clock
                           : dtype == kFloat64                           ? fp32_per_clock / 2
                                                                         : fp32_per_clock;
  return static_cast<double>(sms) * clock_khz * 1e3 * per_clock;
}

int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), -1, "cudaGetDevice");
  return device;
}

void set_device(int device) {
  check_device(device);
  check_cuda(cudaSetDevice(device), device, "cudaSetDevice");
}

void synchronize(int device) {
  DeviceGuard guard(device);
  check_cuda(cudaDeviceSynchronize(), device, "cudaDeviceSynchronize");
  settle_checks(false);  // this device's checks have all arrived
}

DeviceGuard::DeviceGuard(int device) : previous_(current_device()), device_(device) {
  if (device_ != previous_) set_device(device_);
}

DeviceGuard::~DeviceGuard() {
  if (device_ != previous_) cudaSetDevice(previous_);  // a destructor: nothing to report to
}

// ---------------------------------------------------------------- streams and events

Stream Stream::create(int device) {
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  // Non-blocking: the stream does not wait for the legacy default stream (nor it for this one),
  // so work on both can overlap; order between them comes from events.
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), device,
             "cudaStreamCreateWithFlags");
  // Destroying waits for the stream's work first: blocks cached for this stream id may then be
  // reused by a new stream that happens to get the same handle.
  return Stream(device, std::shared_ptr<void>(stream, [device](void* handle) {
                  int previous = 0;
                  if (cudaGetDevice(&previous) != cudaSuccess) return;
                  cudaSetDevice(device);
                  cudaStreamSynchronize(static_cast<cudaStream_t>(handle));
                  cudaStreamDestroy(static_cast<cudaStream_t>(handle));
                  cudaSetDevice(previous);
                }));
}

Stream Stream::default_stream(int device) {
  check_device(device);
  return Stream(device, nullptr);
}

Stream Stream::current(int device) {
  auto& streams = current_streams();
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  return default_stream(device);
}

void Stream::set_current(const Stream& stream) {
  current_streams().insert_or_assign(stream.device(), stream);
}

void Stream::synchronize() const {
  DeviceGuard guard(device_);
  check_cuda(cudaStreamSynchronize(raw_stream(*this)), device_, "cudaStreamSynchronize");
}

bool Stream::query() const {
  DeviceGuard guard(device_);
  return finished(cudaStreamQuery(raw_stream(*this)), device_, "cudaStreamQuery");
}

void Stream::wait(const Event& event) const {
  if (!event.recorded()) return;  // nothing to wait for
  DeviceGuard guard(device_);
  check_cuda(cudaStreamWaitEvent(raw_stream(*this), static_cast<cudaEvent_t>(event.handle()), 0),
             device_, "cudaStreamWaitEvent");
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(Stream::current(stream.device())) {
  Stream::set_current(stream);
}

StreamGuard::~StreamGuard() { current_streams().insert_or_assign(previous_.device(), previous_); }

Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

Event::Event(Event&& other) noexcept
    : timing_(other.timing_), device_(other.device_), handle_(other.handle_) {
  other.handle_ = nullptr;
  other.device_ = -1;
}

Event& Event::operator=(Event&& other) noexcept {
  std::swap(timing_, other.timing_);
  std::swap(device_, other.device_);
  std::swap(handle_, other.handle_);
  return *this;
}

void Event::record(const Stream& stream) {
  DeviceGuard guard(stream.device());
  if (!handle_) {
    cudaEvent_t event = nullptr;
    check_cuda(
        cudaEventCreateWithFlags(&event, timing_ ? cudaEventDefault : cudaEventDisableTiming),
        stream.device(), "cudaEventCreateWithFlags");
    handle_ = event;
    device_ = stream.device();
  }
  if (device_ != stream.device())
    throw DeviceError(detail::str("Event::record: the event belongs to cuda:", device_,
                                  " but the stream to cuda:", stream.device()));
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(handle_), raw_stream(stream)), device_,
             "cudaEventRecord");
}

void Event::wait(const Stream& stream) const { stream.wait(*this); }

void Event::synchronize() const {
  if (!handle_) return;
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)), device_,
             "cudaEventSynchronize");
}

bool Event::query() const {
  if (!handle_) return true;
  return finished(cudaEventQuery(static_cast<cudaEvent_t>(handle_)), device_, "cudaEventQuery");
}

float Event::elapsed_ms(const Event& end) const {
  if (!handle_ || !end.handle_ || !timing_ || !end.timing_)
    throw DeviceError(
        "Event::elapsed_ms: both events must be created with timing=true and "
        "recorded");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_),
                                  static_cast<cudaEvent_t>(end.handle_)),
             device_, "cudaEventElapsedTime");
  return ms;
}

// ---------------------------------------------------------------- memory

void* allocate(size_t nbytes, int device) {
  check_device(device);
  return device_allocator().allocate(nbytes, device, Stream::current(device).id());
}

void deallocate(void* ptr, int /*device*/) {
  // Called from destructors: never throw. The block knows its device and stream.
  try {
    device_allocator().free(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: cuda deallocate: %s\n", e.what());
  }
}

void empty_cache() { device_allocator().empty_cache(); }

AllocatorStats allocator_stats(int device) { return device_allocator().stats(device); }

void reset_peak_allocator_stats(int device) { device_allocator().reset_peak(device); }

void* allocate_pinned(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* ptr = nullptr;
  check_cuda(cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable), -1, "cudaHostAlloc(", nbytes,
             " bytes)");
  return ptr;
}

void free_pinned(void* ptr) {
  if (ptr) cudaFreeHost(ptr);  // never throws
}

// ---------------------------------------------------------------- copies

void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  if (nbytes == 0) return;
  // On the current stream, then wait for it: the copy is ordered after the kernels queued there
  // (a plain cudaMemcpy would not wait for a non-blocking stream).
  Stream stream = Stream::current(device);
  copy_bytes_async(dst, src, nbytes, kind, stream);
  stream.synchronize();
  if (kind == CopyKind::DeviceToHost) settle_checks(false);  // the host waited: settle what came
}

void copy_bytes_async(void* dst, const void* src, size_t nbytes, CopyKind kind,
                      const Stream& stream) {
  if (nbytes == 0) return;
  DeviceGuard guard(stream.device());
  check_cuda(cudaMemcpyAsync(dst, src, nbytes, memcpy_kind(kind), raw_stream(stream)),
             stream.device(), "cudaMemcpyAsync(", nbytes, " bytes, ", kind_name(kind), ")");
}

// ---------------------------------------------------------------- deferred checks

namespace {

constexpr size_t kCheckBytes = 32;

// A check's landing place: pinned bytes and the event behind the copy into them. Reused on the
// device its event was made for.
struct CheckSlot {
  PinnedBuffer bytes{kCheckBytes};
  Event arrived;
  int device = -1;
};

struct PendingCheck {
  std::unique_ptr<CheckSlot> slot;
  std::function<void(const void*)> verdict;
};

// Per thread (Note [Deferred device checks]): a check is settled by the thread that queued it,
// never by another one's wait (a process group's worker, say).
struct ThreadChecks {
  std::deque<PendingCheck> pending;
  std::vector<std::unique_ptr<CheckSlot>> free;
  int holds = 0;  // DeferredChecksHold objects alive
};
ThreadChecks& thread_checks() {
  thread_local ThreadChecks checks;
  return checks;
}

bool sync_checks() {
  static const bool sync = [] {
    const char* v = std::getenv("LOOM_SYNC_CHECKS");
    return v != nullptr && std::string(v) == "1";
  }();
  return sync;
}

}  // namespace

void hold_deferred_checks(int delta) { thread_checks().holds += delta; }
DeferredChecksHold::DeferredChecksHold() { hold_deferred_checks(+1); }
DeferredChecksHold::~DeferredChecksHold() { hold_deferred_checks(-1); }

void defer_check(const void* device_bytes, size_t nbytes, const Stream& stream,
                 std::function<void(const void* host_bytes)> verdict) {
  LOOM_CHECK(nbytes <= kCheckBytes, ValueError, "defer_check: at most ", kCheckBytes,
             " bytes; got ", nbytes);
  settle_checks(false);
  ThreadChecks& checks = thread_checks();
  std::unique_ptr<CheckSlot> slot;
  if (checks.free.empty()) {
    slot = std::make_unique<CheckSlot>();
  } else {
    slot = std::move(checks.free.back());
    checks.free.pop_back();
  }
  if (slot->device != stream.device()) {  // an event records only on its own device's streams
    slot->arrived = Event();
    slot->device = stream.device();
  }
  copy_bytes_async(slot->bytes.data(), device_bytes, nbytes, CopyKind::DeviceToHost, stream);
  slot->arrived.record(stream);
  checks.pending.push_back({std::move(slot), std::move(verdict)});
  if (sync_checks()) settle_checks(true);
}

void settle_checks(bool wait) {
  ThreadChecks& checks = thread_checks();
  if (checks.holds > 0) return;
  while (!checks.pending.empty()) {
    PendingCheck& front = checks.pending.front();
    if (wait)
      front.slot->arrived.synchronize();
    else if (!front.slot->arrived.query())
      return;
    PendingCheck check = std::move(front);
    checks.pending.pop_front();
    // The slot goes back to the pool after its verdict has read it, thrown or not.
    try {
      check.verdict(check.slot->bytes.data());
    } catch (...) {
      checks.free.push_back(std::move(check.slot));
      throw;
    }
    checks.free.push_back(std::move(check.slot));
  }
}

size_t pending_checks() { return thread_checks().pending.size(); }

}  // namespace loom::cuda

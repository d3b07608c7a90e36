// tensor/cuda/runtime_stubs.cpp — linked when loom is built without CUDA (LOOM_CUDA=OFF): every
// entry point of tensor/cuda/runtime.h raises DeviceError, so CUDA requests fail clearly, never
// silently. What runs in destructors (deallocate, free_pinned, ~Event) does nothing instead.

#include "tensor/cuda/runtime.h"
#include "tensor/cuda/stubs.h"
#include "tensor/error.h"

namespace loom::cuda {

namespace {
[[noreturn]] void unavailable(const char* what) {
  throw DeviceError(detail::str(what,
                                ": loom was built without CUDA (configure with -DLOOM_CUDA=ON "
                                "on a machine with the CUDA toolkit)"));
}
}  // namespace

void built_without_cuda(const char* op) { unavailable(op); }

bool is_built() { return false; }
int device_count() { return 0; }
int current_device() { unavailable("cuda current_device"); }
void set_device(int) { unavailable("cuda set_device"); }
void synchronize(int) { unavailable("cuda synchronize"); }

DeviceGuard::DeviceGuard(int) { unavailable("cuda DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;

Stream Stream::create(int) { unavailable("cuda Stream::create"); }
Stream Stream::default_stream(int) { unavailable("cuda Stream::default_stream"); }
Stream Stream::current(int) { unavailable("cuda Stream::current"); }
void Stream::set_current(const Stream&) { unavailable("cuda Stream::set_current"); }
void Stream::synchronize() const { unavailable("cuda Stream::synchronize"); }
bool Stream::query() const { unavailable("cuda Stream::query"); }
void Stream::wait(const Event&) const { unavailable("cuda Stream::wait"); }

// No Stream can exist without CUDA, so a StreamGuard cannot be built; these only link.
StreamGuard::StreamGuard(const Stream& stream) : previous_(stream) {
  unavailable("cuda StreamGuard");
}
StreamGuard::~StreamGuard() = default;

Event::~Event() = default;
Event::Event(Event&& other) noexcept
    : timing_(other.timing_), device_(other.device_), handle_(other.handle_) {}
Event& Event::operator=(Event&& other) noexcept {
  timing_ = other.timing_;
  device_ = other.device_;
  handle_ = other.handle_;
  return *this;
}
void Event::record(const Stream&) { unavailable("cuda Event::record"); }
void Event::wait(const Stream&) const { unavailable("cuda Event::wait"); }
void Event::synchronize() const { unavailable("cuda Event::synchronize"); }
bool Event::query() const { unavailable("cuda Event::query"); }
float Event::elapsed_ms(const Event&) const { unavailable("cuda Event::elapsed_ms"); }

void* allocate(size_t, int) { unavailable("cuda allocate"); }
void deallocate(void*, int) {}  // nothing can have been allocated
void empty_cache() { unavailable("cuda empty_cache"); }
AllocatorStats allocator_stats(int) { unavailable("cuda allocator_stats"); }
void reset_peak_allocator_stats(int) { unavailable("cuda reset_peak_allocator_stats"); }

void* allocate_pinned(size_t) { unavailable("cuda allocate_pinned"); }
void free_pinned(void*) {}  // nothing can have been allocated

void copy_bytes(void*, const void*, size_t, CopyKind, int) { unavailable("cuda copy"); }
void copy_bytes_async(void*, const void*, size_t, CopyKind, const Stream&) {
  unavailable("cuda copy_bytes_async");
}

void defer_check(const void*, size_t, const Stream&, std::function<void(const void*)>) {
  unavailable("cuda defer_check");
}
void settle_checks(bool) {}  // nothing can be pending without CUDA
size_t pending_checks() { return 0; }
DeferredChecksHold::DeferredChecksHold() = default;
DeferredChecksHold::~DeferredChecksHold() = default;

}  // namespace loom::cuda

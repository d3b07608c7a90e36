// tensor/parallel.h — threads inside CPU kernels (OpenMP), and the thread-count setting.
// Kernels split work with parallel_for, which stays on one thread when the work is small or
// when already inside a parallel region (no nested oversubscription).
#pragma once

#include <cstdint>

namespace loom {

// Below this many elements a loop runs on one thread: a parallel region costs a few microseconds.
inline constexpr int64_t kParallelGrain = 32768;

// The grain, in items, of a loop whose items each cost `work` elements: a chunk holds about
// kParallelGrain elements.
inline int64_t grain_for(int64_t work) {
  return work >= kParallelGrain ? 1 : kParallelGrain / (work > 0 ? work : 1);
}

// The number of threads CPU kernels use (default: the machine's cores, or OMP_NUM_THREADS).
void set_num_threads(int n);
int get_num_threads();

namespace detail {

// A non-owning reference to a callable taking (begin, end): lets the one OpenMP region live in
// parallel.cpp instead of being stamped out for every kernel instantiation (which made kernel
// files slow to compile and large).
class RangeFn {
 public:
  template <typename F>
  RangeFn(F& f)  // NOLINT(google-explicit-constructor)
      : object_(&f),
        call_([](void* o, int64_t lo, int64_t hi) { (*static_cast<F*>(o))(lo, hi); }) {}
  void operator()(int64_t lo, int64_t hi) const { call_(object_, lo, hi); }

 private:
  void* object_;
  void (*call_)(void*, int64_t, int64_t);
};

// Splits [begin, end) into one contiguous chunk per thread and runs f on each, in parallel.
void parallel_run(int64_t begin, int64_t end, RangeFn f);
bool parallel_worthwhile(int64_t n, int64_t grain);

}  // namespace detail

// f(begin, end) over contiguous chunks of [begin, end), one chunk per thread, when the range is
// at least `grain` long; inline otherwise (and inside another parallel region).
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  if (begin >= end) return;
  if (detail::parallel_worthwhile(end - begin, grain)) {
    detail::parallel_run(begin, end, detail::RangeFn(f));
    return;
  }
  f(begin, end);
}

}  // namespace loom

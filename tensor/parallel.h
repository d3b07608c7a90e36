// tensor/parallel.h — threads inside CPU kernels (OpenMP), and the thread-count setting.
// Kernels split work with parallel_for, which stays on one thread when the work is small or
// when already inside a parallel region (no nested oversubscription).
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace loom {

// The number of threads CPU kernels use (default: the machine's cores, or OMP_NUM_THREADS).
void set_num_threads(int n);
int get_num_threads();

// f(begin, end) over contiguous chunks of [begin, end), one chunk per thread, when the range is
// at least `grain` long; inline otherwise.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  if (begin >= end) return;
#ifdef _OPENMP
  const int64_t n = end - begin;
  if (n >= std::max<int64_t>(grain, 2) && !omp_in_parallel() && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = begin + n * t / threads, hi = begin + n * (t + 1) / threads;
      if (lo < hi) f(lo, hi);
    }
    return;
  }
#endif
  f(begin, end);
}

}  // namespace loom

// tensor/parallel.cpp — the thread-count setting, shared by OpenMP and Eigen's GEMM.

#include "tensor/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "tensor/error.h"

namespace loom {

void set_num_threads(int n) {
  LOOM_CHECK(n >= 1, ValueError, "set_num_threads: expected at least 1 thread; got ", n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

int get_num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

namespace detail {

bool parallel_worthwhile(int64_t n, int64_t grain) {
#ifdef _OPENMP
  return n >= std::max<int64_t>(grain, 2) && !omp_in_parallel() && omp_get_max_threads() > 1;
#else
  (void)n;
  (void)grain;
  return false;
#endif
}

// An exception may not leave an OpenMP region (it would terminate the program): each thread
// catches, the first exception is kept and rethrown once all threads are done.
void parallel_run(int64_t begin, int64_t end, RangeFn f) {
  const int64_t n = end - begin;
  std::exception_ptr first_error;
  std::atomic<bool> failed{false};
#pragma omp parallel
  {
#ifdef _OPENMP
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
#else
    const int64_t threads = 1, t = 0;
#endif
    const int64_t lo = begin + n * t / threads, hi = begin + n * (t + 1) / threads;
    try {
      if (lo < hi) f(lo, hi);
    } catch (...) {
      if (!failed.exchange(true)) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace detail

}  // namespace loom

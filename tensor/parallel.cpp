// tensor/parallel.cpp — the thread-count setting, shared by OpenMP and Eigen's GEMM.

#include "tensor/parallel.h"

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

}  // namespace loom

// tests/cuda/cuda_test_util.h — shared by the CUDA tests: skipping where there is no GPU, and
// the comparison every kernel test makes (the op on cuda:0 against the same op on the CPU).
#pragma once

#include <gtest/gtest.h>

#include "loom.h"
#include "tensor/cuda/runtime.h"
#include "test_util.h"

namespace loom::test {

inline const Device kCuda0{DeviceType::CUDA, 0};

#define LOOM_SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                         \
    if (!::loom::cuda::is_built()) GTEST_SKIP() << "loom was built without CUDA";              \
    if (::loom::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible";           \
  } while (0)

// The CUDA result, brought back to the CPU, against the CPU result: same shape and dtype,
// values within tolerance.
inline ::testing::AssertionResult cuda_matches_cpu(const Tensor& on_cuda, const Tensor& on_cpu,
                                                   double rtol = 1e-5, double atol = 1e-6) {
  if (!on_cuda.is_cuda()) return ::testing::AssertionFailure() << "result is not on CUDA";
  const Tensor back = on_cuda.to(kCPU);
  if (back.sizes() != on_cpu.sizes())
    return ::testing::AssertionFailure()
           << "shapes differ: cuda " << detail::str(back.sizes()) << " cpu "
           << detail::str(on_cpu.sizes());
  if (back.dtype() != on_cpu.dtype())
    return ::testing::AssertionFailure()
           << "dtypes differ: cuda " << back.dtype() << " cpu " << on_cpu.dtype();
  return tensors_close(back, on_cpu, rtol, atol);
}

}  // namespace loom::test

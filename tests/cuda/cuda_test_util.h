// tests/cuda/cuda_test_util.h — shared by the CUDA tests: skipping where there is no GPU, and
// the comparison every kernel test makes (the op on cuda:0 against the same op on the CPU).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "loom.h"
#include "tensor/cuda/runtime.h"
#include "test_util.h"

namespace loom::test {

inline const Device kCuda0{DeviceType::CUDA, 0};

#define LOOM_SKIP_WITHOUT_GPU()                                                      \
  do {                                                                               \
    if (!::loom::cuda::is_built()) GTEST_SKIP() << "loom was built without CUDA";    \
    if (::loom::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

// The CUDA result, brought back to the CPU, against the CPU result: same shape and dtype,
// values within tolerance (tensors_close's rule), NaN matching NaN and an infinity the same
// infinity (|inf - inf| is NaN, which no tolerance admits: a logsumexp of -inf rows).
inline ::testing::AssertionResult cuda_matches_cpu(const Tensor& on_cuda, const Tensor& on_cpu,
                                                   double rtol = 1e-5, double atol = 1e-6) {
  if (!on_cuda.is_cuda()) return ::testing::AssertionFailure() << "result is not on CUDA";
  const Tensor back = on_cuda.to(kCPU);
  if (back.sizes() != on_cpu.sizes())
    return ::testing::AssertionFailure() << "shapes differ: cuda " << detail::str(back.sizes())
                                         << " cpu " << detail::str(on_cpu.sizes());
  if (back.dtype() != on_cpu.dtype())
    return ::testing::AssertionFailure()
           << "dtypes differ: cuda " << back.dtype() << " cpu " << on_cpu.dtype();
  const std::vector<double> got = back.to_vector<double>(), want = on_cpu.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " vs expected " << want[i];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace loom::test

// tests/tensor/cuda_backend_test.cpp — Note [The CUDA backend library]: CPU work never loads the
// CUDA backend or any CUDA library; the first question about GPUs loads it (in a build with
// CUDA), and every GPU request says clearly why there is no GPU. Each test runs in a process of
// its own (ctest runs them one by one), so "not loaded yet" is observable.

#include "tensor/cuda_backend.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tensor/accelerator.h"
#include "tensor/elementwise.h"
#include "tensor/linalg.h"
#include "test_util.h"

namespace loom {
namespace {

// Whether a shared object whose path contains `name` is mapped into this process.
bool is_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream all;
  all << maps.rdbuf();
  return all.str().find(name) != std::string::npos;
}

TEST(CudaBackend, CpuWorkLoadsNoCudaLibrary) {
  const Tensor a = randn({8, 8});
  const Tensor c = kernels::mm(kernels::add(a, a, 1.0), a);
  EXPECT_EQ(c.sizes(), (Shape{8, 8}));
  const Device cpu = kCPU;
  synchronize(cpu);
  { DeferredChecksHold hold; }
  BatchUploader upload;
  EXPECT_EQ(upload(a, cpu).sizes(), a.sizes());
  EXPECT_FALSE(is_mapped("libloom_cuda"));
  EXPECT_FALSE(is_mapped("libcudart"));
  EXPECT_FALSE(is_mapped("libcudnn"));
  EXPECT_FALSE(is_mapped("libnccl"));
}

TEST(CudaBackend, BuiltWithCudaTheFirstGpuQuestionLoadsTheLibrary) {
  if (!cuda_is_built()) GTEST_SKIP() << "loom was built without CUDA";
  ASSERT_FALSE(is_mapped("libloom_cuda"));
  const int gpus = cuda_device_count();  // loads libloom_cuda, and with it libcudart
  EXPECT_GE(gpus, 0);
  ASSERT_NE(cuda_backend_if_available(), nullptr) << "libloom_cuda did not load";
  EXPECT_TRUE(is_mapped("libloom_cuda"));
  EXPECT_EQ(&cuda_backend(), cuda_backend_if_available());
  EXPECT_EQ(cuda_backend().size, sizeof(CudaBackend));
  if (gpus == 0) {
    EXPECT_LOOM_ERROR(zeros({2}, kFloat32, Device("cuda:0")), DeviceError,
                      {"allocate", "cuda:0", "0 CUDA devices visible"});
  }
}

TEST(CudaBackend, BuiltWithoutCudaEveryGpuRequestSaysSo) {
  if (cuda_is_built()) GTEST_SKIP() << "loom was built with CUDA";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_EQ(cuda_backend_if_available(), nullptr);
  EXPECT_LOOM_ERROR(cuda_backend("conv2d"), DeviceError, {"conv2d", "built without CUDA"});
  EXPECT_LOOM_ERROR(zeros({2}, kFloat32, Device("cuda:0")), DeviceError,
                    {"allocate", "cuda:0", "built without CUDA"});
  EXPECT_LOOM_ERROR(synchronize(Device("cuda:0")), DeviceError,
                    {"synchronize", "built without CUDA"});
  EXPECT_LOOM_ERROR(set_cuda_device(Device("cuda:0")), DeviceError, {"built without CUDA"});
  EXPECT_LOOM_ERROR(current_cuda_device(), DeviceError, {"built without CUDA"});
  BatchUploader upload;
  EXPECT_LOOM_ERROR(upload(zeros({2}), Device("cuda:0")), DeviceError,
                    {"BatchUploader", "built without CUDA"});
  { DeferredChecksHold hold; }  // nothing to hold: no error
}

}  // namespace
}  // namespace loom

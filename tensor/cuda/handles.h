// tensor/cuda/handles.h — what the library-backed CUDA kernels (linalg.cu: cuBLAS, conv.cu:
// cuDNN) and the pooling kernels share: library handles per (device, thread) bound to the current
// stream, checked library calls and the element types they compute in. CUDA sources only.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>

#include "tensor/cuda/blas.h"
#include "tensor/cuda/common.cuh"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace loom::cuda {

// check_cublas(status, device, "cublasGemmEx(m=", m, ...)"): DeviceError naming the call, the
// library's error string and the device, as check_cuda does for the runtime.
template <typename... Call>
void check_cublas(cublasStatus_t status, int device, const Call&... call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw DeviceError(::loom::detail::str(call..., " failed on cuda:", device, ": ",
                                        cublasGetStatusString(status)));
}

template <typename... Call>
void check_cudnn(cudnnStatus_t status, int device, const Call&... call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  throw DeviceError(
      ::loom::detail::str(call..., " failed on cuda:", device, ": ", cudnnGetErrorString(status)));
}

// This thread's handle for `device`, created on first use and bound to the device's current
// stream (Stream::current) at every call, so library work is ordered with loom's kernels. A
// handle is used by one thread at a time; when a thread ends its handles go back to a pool for
// the next thread (they are never destroyed: destroying at process exit can race the driver's
// own teardown). The caller holds a DeviceGuard for `device`.
cublasHandle_t cublas_handle(int device);
cudnnHandle_t cudnn_handle(int device);

// Raw device memory from the caching allocator, for this thread's current stream of `device`;
// given back (for reuse by later work on that stream) when it goes out of scope, which is safe
// as soon as the work using it is queued.
class Scratch {
 public:
  Scratch(size_t bytes, int device)
      : device_(device), ptr_(bytes > 0 ? allocate(bytes, device) : nullptr) {}
  ~Scratch() {
    if (ptr_) deallocate(ptr_, device_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  int device_;
  void* ptr_;
};

// The element type a kernel reads and writes (loom's Half and BFloat16 are bit-compatible with
// CUDA's __half and __nv_bfloat16) and the type it accumulates in: float, or double for double.
template <typename T>
struct Accumulate {
  using type = float;
};
template <>
struct Accumulate<double> {
  using type = double;
};
template <typename T>
using acc_t = typename Accumulate<T>::type;

// dispatch_cuda_floating(x.dtype(), "conv2d", [&]<typename T>() { ... }) with T one of float,
// double, __half, __nv_bfloat16; DTypeError for any other dtype.
template <typename F>
decltype(auto) dispatch_cuda_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Float16:
      return f.template operator()<__half>();
    case DType::BFloat16:
      return f.template operator()<__nv_bfloat16>();
    default:
      throw DTypeError(::loom::detail::str(
          op, ": expected a float32, float64, float16 or bfloat16 tensor; got ", dtype));
  }
}

}  // namespace loom::cuda

// LOOM_CUBLAS_CHECK(cublasCreate(&h), device): names the call by its source text.
#define LOOM_CUBLAS_CHECK(call, device) ::loom::cuda::check_cublas((call), (device), #call)
#define LOOM_CUDNN_CHECK(call, device) ::loom::cuda::check_cudnn((call), (device), #call)

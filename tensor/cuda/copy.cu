// tensor/cuda/copy.cu — copies with conversion and broadcasting, and fills, on one CUDA device.
// Same dtype, same shape, one dense layout (both contiguous or both channels-last): one
// cudaMemcpyAsync. Everything else: the strided map of tensor/cuda/loops.cuh (Note [CUDA
// elementwise loops]), one element per thread, with a conversion that gives the CPU's bits
// (tensor/copy.cpp's convert, float16 and bfloat16 included, tensor/cuda/float16.h).

#include <type_traits>

#include "tensor/checks.h"
#include "tensor/cuda/copy.h"
#include "tensor/cuda/float16.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"

namespace loom::cuda {

namespace {

// ---------------------------------------------------------------- conversions (tensor/copy.cpp)

template <typename T>
__device__ __forceinline__ double to_double(T v) {
  if constexpr (std::is_same_v<T, bool>)
    return v ? 1.0 : 0.0;
  else
    return static_cast<double>(to_math(v));
}

// From double as the CPU's static_cast: 16-bit floats through float (two roundings, as there);
// uint8 through int64, so that a negative value wraps as on the x86 host instead of saturating
// at 0 as the GPU's own conversion would (out-of-range values are undefined in C++ either way).
template <typename T>
__device__ __forceinline__ T from_double(double d) {
  if constexpr (std::is_same_v<T, uint8_t>)
    return static_cast<uint8_t>(static_cast<int64_t>(d));
  else
    return from_math<T>(d);
}

// One element From -> To, the rules of tensor/copy.cpp's convert.
template <typename To, typename From>
struct Convert {
  __device__ To operator()(From v) const {
    if constexpr (std::is_same_v<To, From>)
      return v;
    else if constexpr (std::is_same_v<To, bool>)
      return to_double(v) != 0.0;
    else if constexpr (std::is_same_v<From, int64_t> && std::is_integral_v<To>)
      return static_cast<To>(v);
    else
      return from_double<To>(to_double(v));
  }
};

template <typename T>
struct Constant {
  T value;
  __device__ T operator()() const { return value; }
};

// The fill value as the CPU converts it (host code: the same compiler, the same bits).
template <typename T>
T host_convert(double value) {
  if constexpr (std::is_same_v<T, bool>)
    return value != 0.0;
  else
    return static_cast<T>(value);
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(broadcast_shapes(dst.sizes(), src.sizes(), "copy_") == dst.sizes(), ShapeError,
             "copy_: source shape=", src.sizes(),
             " cannot be broadcast to destination shape=", dst.sizes());
  const Device device = kernels::common_device("copy_", {dst, src});
  LOOM_ASSERT(device.is_cuda(), "cuda::copy_: tensors on ", device);
  DeviceGuard guard(device.index);
  dst.bump_version();
  if (dst.numel() == 0) return;
  if (dst.data() == src.data() && dst.dtype() == src.dtype() && dst.sizes() == src.sizes() &&
      dst.strides() == src.strides())
    return;  // a tensor copied onto itself
  if (dst.dtype() == src.dtype() && kernels::same_dense_layout(dst, src)) {  // one memcpy
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                    stream_of(dst)),
                    device.index);
    return;
  }
  dispatch_all(dst.dtype(), "copy_", [&]<typename To>() {
    dispatch_all(src.dtype(), "copy_", [&]<typename From>() {
      gpu_map<To, From>("copy_", dst, Convert<To, From>{}, src);
    });
  });
}

void fill_(const Tensor& dst, double value) {
  LOOM_ASSERT(dst.is_cuda(), "cuda::fill_: tensor on ", dst.device());
  DeviceGuard guard(dst.device().index);
  dst.bump_version();
  dispatch_all(dst.dtype(), "fill_", [&]<typename T>() {
    gpu_map<T, T>("fill_", dst, Constant<T>{host_convert<T>(value)});
  });
}

}  // namespace loom::cuda

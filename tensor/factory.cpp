// tensor/factory.cpp — tensors made from nothing: empty, zeros, ranges, identity, random draws
// (from the Philox generator, see Note [Philox streams]; the front of the random fills, whose CPU
// loops are tensor/cpu/random.cpp), and from caller data.

#include <cmath>

#include "tensor/copy.h"
#include "tensor/cpu/random.h"
#include "tensor/cuda_backend.h"
#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace loom {

static void check_shape(const Shape& shape, const char* op) {
  for (int64_t s : shape) LOOM_CHECK(s >= 0, ShapeError, op, ": negative size in shape=", shape);
}

Tensor empty(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  check_shape(shape, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->strides = format_strides(shape, format);
  impl->storage = allocate_storage(static_cast<size_t>(shape_numel(shape)) * itemsize(dtype),
                                   device, dtype, shape);
  impl->sizes = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, device, MemoryFormat::kContiguous);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  kernels::fill_(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.dtype(), t.device()); }
Tensor empty_like_format(const Tensor& t) {
  return empty(t.sizes(), t.dtype(), t.device(), suggest_memory_format(t));
}
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.dtype(), t.device()); }
Tensor full_like(const Tensor& t, double value) {
  return full(t.sizes(), value, t.dtype(), t.device());
}

Tensor scalar_tensor(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

Tensor arange(double end) { return arange(0, end, 1); }

Tensor arange(double start, double end, double step) {
  const bool whole =
      start == std::floor(start) && end == std::floor(end) && step == std::floor(step);
  return arange(start, end, step, whole ? kInt64 : kFloat32);
}

Tensor arange(double start, double end, double step, DType dtype) {
  LOOM_CHECK(step != 0, ValueError, "arange: step must be non-zero");
  LOOM_CHECK((end - start) / step >= 0, ValueError, "arange: the range [", start, ", ", end,
             ") with step ", step, " is empty in the wrong direction");
  const int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor t = empty({n}, dtype);
  dispatch_numeric(dtype, "arange", [&]<typename T>() {
    T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
  });
  return t;
}

Tensor linspace(double start, double end, int64_t steps, DType dtype) {
  LOOM_CHECK(steps >= 0, ValueError, "linspace: steps must be non-negative; got ", steps);
  Tensor t = empty({steps}, dtype);
  dispatch_floating(dtype, "linspace", [&]<typename T>() {
    T* p = t.data_ptr<T>();
    const double delta = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
    // Fill symmetrically from both ends, so the last value is exactly `end`.
    for (int64_t i = 0; i < steps; ++i)
      p[i] = static_cast<T>(i < steps / 2 ? start + delta * static_cast<double>(i)
                                          : end - delta * static_cast<double>(steps - 1 - i));
  });
  return t;
}

Tensor eye(int64_t n, DType dtype) { return eye(n, n, dtype); }

Tensor eye(int64_t n, int64_t m, DType dtype) {
  Tensor t = zeros({n, m}, dtype);
  dispatch_all(dtype, "eye", [&]<typename T>() {
    T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < std::min(n, m); ++i) p[i * m + i] = static_cast<T>(1.0f);
  });
  return t;
}

// Uniform [0, 1): element i takes lane i%4 of counter first + i/4.
Tensor rand(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  const int64_t n = t.numel();
  const Generator::State g = default_generator().state();
  const uint64_t first = default_generator().reserve((n + 3) / 4);
  if (t.is_cuda()) {
    cuda_backend().fill_uniform_(t, g.seed, first, 0.0, 1.0);
    return t;
  }
  cpu::fill_uniform_(t, g.seed, first);
  return t;
}

// Standard normal by Box-Muller: element i uses lanes (0,1) or (2,3) of counter first + i/2.
Tensor randn(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  const int64_t n = t.numel();
  const Generator::State g = default_generator().state();
  const uint64_t first = default_generator().reserve((n + 1) / 2);
  if (t.is_cuda()) {
    cuda_backend().fill_normal_(t, g.seed, first, 0.0, 1.0);
    return t;
  }
  cpu::fill_normal_(t, g.seed, first);
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype, Device device) {
  LOOM_CHECK(low < high, ValueError, "randint: expected low < high; got low=", low, " high=", high);
  Tensor t = empty(shape, dtype, device);
  const int64_t n = t.numel();
  const Generator::State g = default_generator().state();
  const uint64_t first = default_generator().reserve((n + 1) / 2);
  if (t.is_cuda()) {
    cuda_backend().fill_randint_(t, g.seed, first, low, high);
    return t;
  }
  cpu::fill_randint_(t, g.seed, first, low, high);
  return t;
}

template <typename T>
Tensor tensor(const std::vector<T>& values, Shape shape) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  LOOM_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), ShapeError,
             "tensor: ", values.size(), " values do not fill shape=", shape);
  if constexpr (std::is_same_v<T, bool>) {
    Tensor t = empty(shape, kBool);
    for (size_t i = 0; i < values.size(); ++i) t.data_ptr<bool>()[i] = values[i];
    return t;
  } else {
    return from_data(values.data(), shape, dtype_of<T>::value);
  }
}
template Tensor tensor<float>(const std::vector<float>&, Shape);
template Tensor tensor<double>(const std::vector<double>&, Shape);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, Shape);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, Shape);
template Tensor tensor<uint8_t>(const std::vector<uint8_t>&, Shape);
template Tensor tensor<bool>(const std::vector<bool>&, Shape);

Tensor from_data(const void* data, const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes()) std::memcpy(t.data(), data, t.nbytes());
  return t;
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  check_shape(shape, "from_blob");
  LOOM_CHECK(data != nullptr || shape_numel(shape) == 0, ValueError,
             "from_blob: null pointer for shape=", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<StorageImpl>(
      data, static_cast<size_t>(shape_numel(shape)) * itemsize(dtype), device, nullptr);
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace loom

// tensor/tensor.h — loom::Tensor, the one user-facing type: a shared handle to a TensorImpl
// (storage, sizes, strides, offset, dtype, and an autograd slot that tensor/ never reads).
// Copies of a Tensor share the same impl, as in LibTorch; views share the storage.
//
// The structural methods (sizes, strides, data) are defined in tensor/. The methods that compute
// (view, add, sum, ...) are differentiable, so they are defined in autograd/ and forward to the
// free functions of autograd/ops.h; the kernels underneath live in namespace loom::kernels and
// know nothing of gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace loom {

namespace autograd {
struct AutogradMeta;  // defined in autograd/; tensor/ only carries the pointer
}

using Shape = std::vector<int64_t>;

// How the elements of a 4-D [N, C, H, W] tensor lie in memory (Note [Memory formats],
// tensor/tensor.cpp). kContiguous: row-major, W innermost. kChannelsLast: the order N, H, W, C,
// C innermost (PyTorch's torch.channels_last), the layout cuDNN's tensor-core convolutions
// prefer. Only 4-D tensors can be channels-last; every other tensor is kContiguous.
enum class MemoryFormat { kContiguous, kChannelsLast };
std::ostream& operator<<(std::ostream& os, MemoryFormat format);

struct TensorImpl {
  Storage storage;
  Shape sizes;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements, from storage->data
  DType dtype = kFloat32;
  std::shared_ptr<autograd::AutogradMeta> autograd;
};

class Tensor;
using PostAccumulateHook = std::function<void(Tensor& leaf)>;

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- structure (tensor/) ---
  bool defined() const { return impl_ != nullptr; }
  int64_t dim() const { return static_cast<int64_t>(impl().sizes.size()); }
  const Shape& sizes() const { return impl().sizes; }
  const Shape& shape() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;  // likewise
  int64_t numel() const;
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  size_t itemsize() const { return loom::itemsize(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  bool is_contiguous() const;
  // Dense in `format`'s order (size-1 dims may have any stride, as in is_contiguous()).
  bool is_contiguous(MemoryFormat format) const;
  const Storage& storage() const { return impl().storage; }
  bool is_alias_of(const Tensor& other) const { return storage() == other.storage(); }

  // Pointer to the first element (offset applied). data_ptr<T> checks that T matches the dtype.
  void* data() const;
  template <typename T>
  T* data_ptr() const {
    LOOM_CHECK(dtype_of<T>::value == dtype(), DTypeError, "data_ptr: tensor is ", dtype(),
               ", asked for ", dtype_of<T>::value);
    return static_cast<T*>(data());
  }
  // The value of a one-element tensor (any shape with numel 1), converted to T.
  template <typename T>
  T item() const;
  double item() const { return item<double>(); }
  // All elements in row-major order, converted to T (a copy; for tests and small data).
  template <typename T>
  std::vector<T> to_vector() const;

  // Each in-place write bumps the storage's version; autograd compares versions of saved tensors.
  uint64_t version() const { return storage()->version.load(); }
  void bump_version() const { storage()->version.fetch_add(1); }
  // Makes this tensor hold src's data (storage, shape, strides, dtype) while keeping its identity
  // and autograd slot: every handle to it sees the change. How Module::to moves a parameter to
  // another device or dtype without breaking the references layers and optimizers hold.
  void set_data(const Tensor& src) const;

  TensorImpl* unsafe_impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // Printing that looks like PyTorch's (defined in autograd/: it shows requires_grad and grad_fn).
  std::string str() const;

  // --- autograd (defined in autograd/) ---
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const;
  Tensor grad() const;                // undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad);  // replaces .grad (may be a view into a bucket buffer)
  std::string grad_fn_name() const;   // "" for leaves
  // Backpropagates from this tensor. A non-scalar needs `gradient` (same shape).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;
  // Keeps .grad on a non-leaf after backward.
  void retain_grad() const;
  // Called after a backward accumulated into this leaf's .grad (the DDP reducer hangs on it).
  // Returns a handle for remove_post_accumulate_grad_hook.
  int register_post_accumulate_grad_hook(PostAccumulateHook hook) const;
  void remove_post_accumulate_grad_hook(int handle) const;

  // --- views (differentiable; share storage) ---
  Tensor view(const Shape& shape) const;  // one dim may be -1
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a size
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  Tensor contiguous(MemoryFormat format) const;  // itself when already in that format
  Tensor operator[](int64_t index) const { return select(0, index); }

  // --- conversions ---
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor clone() const;

  // --- arithmetic (differentiable) ---
  Tensor add(const Tensor& other, double alpha = 1.0) const;
  Tensor sub(const Tensor& other, double alpha = 1.0) const;
  Tensor mul(const Tensor& other) const;
  Tensor div(const Tensor& other) const;
  Tensor pow(double exponent) const;
  Tensor neg() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor abs() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor matmul(const Tensor& other) const;
  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;

  // --- in place (bump the version; forbidden on leaves that require grad, under grad mode) ---
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& sub_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& div_(const Tensor& other);
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // broadcasts src; converts dtype and device

 private:
  const TensorImpl& impl() const {
    LOOM_CHECK(impl_ != nullptr, ValueError, "tensor: use of an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);  // t.str(), in autograd/

namespace detail {
// Tensor::str() without autograd's part: the values, dtype, device and size, then `grad_note`
// (", requires_grad=True" or ", grad_fn=<...>" where autograd has one).
std::string tensor_repr(const Tensor& t, const std::string& grad_note);
}  // namespace detail

// --- shape helpers used across loom ---
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
// The strides of a dense `shape` stored in `format`; ShapeError when kChannelsLast meets a
// shape that is not 4-D.
Shape format_strides(const Shape& shape, MemoryFormat format);
// kChannelsLast for a 4-D tensor dense in channels-last order and not in row-major order;
// kContiguous otherwise. A tensor with C = 1 or H = W = 1 is dense in both: it reads as
// channels-last only when its strides are exactly format_strides(sizes, kChannelsLast) (what
// contiguous(kChannelsLast) makes of it), as PyTorch tells the two apart.
MemoryFormat suggest_memory_format(const Tensor& t);
// t is in `format` as it stands, no copy needed: contiguous for kContiguous, a
// suggest_memory_format of kChannelsLast for kChannelsLast (kernels::contiguous(t, format)
// returns t itself exactly then).
bool has_memory_format(const Tensor& t, MemoryFormat format);
// The format of an op's result of `shape` computed elementwise from `operands`, as PyTorch's
// TensorIterator chooses it for these two formats: the first defined operand of the result's
// shape decides (its suggest_memory_format); kContiguous when none has that shape.
MemoryFormat result_format(const Shape& shape, std::initializer_list<Tensor> operands);
// Wraps a possibly negative dim into [0, ndim); IndexError names the op otherwise.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; ShapeError names the op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// --- factories (tensor/factory.cpp) ---
Tensor empty(const Shape& shape, DType dtype = kFloat32, Device device = kCPU);
// A dense tensor stored in `format` (see format_strides).
Tensor empty(const Shape& shape, DType dtype, Device device, MemoryFormat format);
Tensor zeros(const Shape& shape, DType dtype = kFloat32, Device device = kCPU);
Tensor ones(const Shape& shape, DType dtype = kFloat32, Device device = kCPU);
Tensor full(const Shape& shape, double value, DType dtype = kFloat32, Device device = kCPU);
Tensor empty_like(const Tensor& t);  // contiguous, whatever t's format (see empty_like_format)
// An empty tensor of t's shape, dtype and device in t's suggest_memory_format.
Tensor empty_like_format(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// [start, end) with step; int64 when all three are whole numbers, float32 otherwise (as PyTorch).
Tensor arange(double end);
Tensor arange(double start, double end, double step = 1.0);
Tensor arange(double start, double end, double step, DType dtype);
Tensor linspace(double start, double end, int64_t steps, DType dtype = kFloat32);
Tensor eye(int64_t n, DType dtype = kFloat32);
Tensor eye(int64_t n, int64_t m, DType dtype = kFloat32);
// Random factories draw from the default generator (see tensor/random.h).
// On a CUDA device the same (seed, counter) streams give the same numbers as on the CPU
// (randn's float64 values may differ in the last bit: the device's log and cos).
Tensor rand(const Shape& shape, DType dtype = kFloat32, Device device = kCPU);   // uniform [0, 1)
Tensor randn(const Shape& shape, DType dtype = kFloat32, Device device = kCPU);  // standard normal
Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = kInt64,
               Device device = kCPU);
// Copies values into a new tensor (shape defaults to 1-D, as torch.tensor([...]); for a 0-d
// tensor use scalar_tensor).
template <typename T>
Tensor tensor(const std::vector<T>& values, Shape shape = {});
template <typename T>
Tensor tensor(std::initializer_list<T> values, Shape shape = {}) {
  return tensor(std::vector<T>(values), std::move(shape));
}
Tensor from_data(const void* data, const Shape& shape, DType dtype);  // copies
// Wraps memory that the caller owns and keeps alive; no copy.
Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = kCPU);
Tensor scalar_tensor(double value, DType dtype = kFloat32, Device device = kCPU);

}  // namespace loom

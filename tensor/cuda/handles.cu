// tensor/cuda/handles.cu — cuBLAS and cuDNN handles per (device, thread), pooled across threads,
// and the strided copy that lays out operands densely for the libraries (handles.h).

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/handles.h"

namespace loom::cuda {

namespace {

// ---------------------------------------------------------------- handles

// Handles no thread holds, per device. Leaked on purpose (handles.h): the pool outlives every
// thread_local that returns handles to it.
template <typename Handle>
class HandlePool {
 public:
  static HandlePool& instance() {
    static HandlePool* pool = new HandlePool();
    return *pool;
  }
  // A free handle of `device`, or a new one from create(device).
  Handle acquire(int device, Handle (*create)(int)) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<Handle>& free = free_[device];
      if (!free.empty()) {
        Handle handle = free.back();
        free.pop_back();
        return handle;
      }
    }
    return create(device);
  }
  void release(int device, Handle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(handle);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int, std::vector<Handle>> free_;
};

// The handles one thread holds, per device; they go back to the pool when the thread ends.
template <typename Handle>
class ThreadHandles {
 public:
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    for (const auto& [device, handle] : held_)
      HandlePool<Handle>::instance().release(device, handle);
  }
  Handle get(int device, Handle (*create)(int)) {
    auto it = held_.find(device);
    if (it != held_.end()) return it->second;
    const Handle handle = HandlePool<Handle>::instance().acquire(device, create);
    held_.emplace(device, handle);
    return handle;
  }

 private:
  std::unordered_map<int, Handle> held_;
};

cublasHandle_t create_cublas(int device) {
  DeviceGuard guard(device);  // a handle belongs to the device current at creation
  cublasHandle_t handle = nullptr;
  LOOM_CUBLAS_CHECK(cublasCreate(&handle), device);
  return handle;
}

cudnnHandle_t create_cudnn(int device) {
  DeviceGuard guard(device);
  cudnnHandle_t handle = nullptr;
  LOOM_CUDNN_CHECK(cudnnCreate(&handle), device);
  return handle;
}

// ---------------------------------------------------------------- strided copy

constexpr int kCopyDims = 8;  // dims a copy may have after dropping size-1 dims and merging

// The copy as a loop nest: dim ndim-1 innermost (smallest destination stride).
struct CopyPlan {
  int ndim = 0;
  int64_t sizes[kCopyDims];
  int64_t dst_strides[kCopyDims];
  int64_t src_strides[kCopyDims];
};

// One element per thread, grid-stride: thread i turns its index in the loop nest into one
// offset per side. Elements are moved as raw words of the dtype's size.
template <typename Word>
__global__ void copy_strided_kernel(Word* dst, const Word* src, CopyPlan plan, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t rest = i, dst_offset = 0, src_offset = 0;
    for (int d = plan.ndim - 1; d >= 0; --d) {
      const int64_t index = rest % plan.sizes[d];
      rest /= plan.sizes[d];
      dst_offset += index * plan.dst_strides[d];
      src_offset += index * plan.src_strides[d];
    }
    dst[dst_offset] = src[src_offset];
  }
}

CopyPlan plan_copy(const Tensor& dst, const Tensor& src) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < dst.dim(); ++d)
    if (dst.size(d) != 1) dims.push_back(d);
  // Outermost first by destination stride, so consecutive threads write consecutive elements.
  std::stable_sort(dims.begin(), dims.end(),
                   [&](int64_t a, int64_t b) { return dst.stride(a) > dst.stride(b); });
  std::vector<int64_t> sizes, dst_strides, src_strides;
  for (const int64_t d : dims) {
    const int64_t size = dst.size(d), ds = dst.stride(d), ss = src.stride(d);
    // Merge into the previous (outer) dim when both sides step through them as one.
    if (!sizes.empty() && dst_strides.back() == ds * size && src_strides.back() == ss * size) {
      sizes.back() *= size;
      dst_strides.back() = ds;
      src_strides.back() = ss;
      continue;
    }
    sizes.push_back(size);
    dst_strides.push_back(ds);
    src_strides.push_back(ss);
  }
  LOOM_CHECK(sizes.size() <= static_cast<size_t>(kCopyDims), NotImplementedError,
             "copy_strided: more than ", kCopyDims, " dims after merging; got shape=", dst.sizes(),
             " dst strides=", dst.strides(), " src strides=", src.strides());
  CopyPlan plan;
  plan.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < plan.ndim; ++d) {
    plan.sizes[d] = sizes[d];
    plan.dst_strides[d] = dst_strides[d];
    plan.src_strides[d] = src_strides[d];
  }
  return plan;
}

template <typename Word>
void launch_copy(const Tensor& dst, const Tensor& src, const CopyPlan& plan, int64_t n) {
  const int device = dst.device().index;
  copy_strided_kernel<Word><<<blocks_for(n), kThreads, 0, stream_of(dst)>>>(
      static_cast<Word*>(dst.data()), static_cast<const Word*>(src.data()), plan, n);
  check_launch("copy_strided_kernel", device);
}

}  // namespace

cublasHandle_t cublas_handle(int device) {
  thread_local ThreadHandles<cublasHandle_t> handles;
  const cublasHandle_t handle = handles.get(device, create_cublas);
  check_cublas(cublasSetStream(handle, current_stream(device)), device, "cublasSetStream");
  return handle;
}

cudnnHandle_t cudnn_handle(int device) {
  thread_local ThreadHandles<cudnnHandle_t> handles;
  const cudnnHandle_t handle = handles.get(device, create_cudnn);
  check_cudnn(cudnnSetStream(handle, current_stream(device)), device, "cudnnSetStream");
  return handle;
}

void copy_strided(const Tensor& dst, const Tensor& src) {
  LOOM_ASSERT(dst.sizes() == src.sizes() && dst.dtype() == src.dtype() &&
                  dst.device() == src.device() && dst.is_cuda(),
              "copy_strided: dst=", dst.sizes(), " src=", src.sizes());
  const int64_t n = dst.numel();
  if (n == 0) return;
  const CopyPlan plan = plan_copy(dst, src);
  switch (dst.itemsize()) {
    case 1:
      return launch_copy<uint8_t>(dst, src, plan, n);
    case 2:
      return launch_copy<uint16_t>(dst, src, plan, n);
    case 4:
      return launch_copy<uint32_t>(dst, src, plan, n);
    case 8:
      return launch_copy<uint64_t>(dst, src, plan, n);
    default:
      LOOM_ASSERT(false, "copy_strided: element size ", dst.itemsize());
  }
}

Tensor contiguous_on_device(const Tensor& src) {
  if (src.is_contiguous()) return src;
  Tensor out = empty(src.sizes(), src.dtype(), src.device());
  copy_strided(out, src);
  return out;
}

}  // namespace loom::cuda

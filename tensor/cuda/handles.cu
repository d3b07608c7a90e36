// tensor/cuda/handles.cu — cuBLAS and cuDNN handles per (device, thread), pooled across threads
// (handles.h).

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

}  // namespace loom::cuda

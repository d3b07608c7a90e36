// tensor/accelerator.h — what the layers above tensor/ (dist/, optim/, the apps) need of the
// devices, without naming a CUDA header: whether loom has CUDA and how many GPUs it sees, the
// current GPU, waiting for a device, holding Note [Deferred device checks], and uploading
// batches without stopping the host (Note [Uploading batches]). Without CUDA or a GPU the
// counts are 0 and the CPU calls do nothing. All of it goes through the CUDA backend library
// (Note [The CUDA backend library] in tensor/cuda_backend.h).
#pragma once

#include <string>

#include "tensor/tensor.h"

namespace loom {

bool cuda_is_built();     // loom was compiled with CUDA
int cuda_device_count();  // visible GPUs; 0 without CUDA, its libraries, a driver or a GPU
// Why cuda_device_count() is 0: loom built without CUDA, a CUDA library that cannot be loaded
// (named), or no GPU that the driver sees.
std::string why_no_cuda_device();
Device current_cuda_device();  // the GPU this thread launches on
void set_cuda_device(Device device);
void synchronize(Device device);  // waits for all work queued on `device` (a CPU: nothing)
// A GPU's dense peak FLOP/s for products in `dtype` (tensor cores for 16-bit dtypes), from its
// architecture, SM count and clock: the denominator of MFU there. DeviceError for a CPU device
// (whose peak is measured: fma_peak_gflops in tensor/cpu_info.h) or without CUDA.
double dense_peak_flops(Device device, DType dtype);
// Whether cuDNN keeps to deterministic convolution algorithms (default true; PyTorch's default
// is false): Note [conv2d on cuDNN].
void set_cudnn_deterministic(bool deterministic);

// While one lives, an earlier op's deferred device check cannot throw on this thread (Note
// [Deferred device checks] in tensor/cuda/runtime.h): for library code that waits for the
// device in the middle of changing its own state, so that it is never left half changed.
class DeferredChecksHold {
 public:
  DeferredChecksHold();
  ~DeferredChecksHold();
  DeferredChecksHold(const DeferredChecksHold&) = delete;
  DeferredChecksHold& operator=(const DeferredChecksHold&) = delete;

 private:
  bool held_ = false;  // a CUDA backend is loaded and counts this hold
};

// Copies training batches to a GPU through a ring of pinned buffers, so that the host does not
// wait for each copy (Note [Uploading batches] in tensor/cuda/upload.h). On a CPU device it
// returns kernels::contiguous(t, format).
class BatchUploader {
 public:
  explicit BatchUploader(int ring_size = 4);
  ~BatchUploader();  // waits for the copies still reading its buffers
  BatchUploader(const BatchUploader&) = delete;
  BatchUploader& operator=(const BatchUploader&) = delete;
  // `t` (a CPU tensor) on `device`, stored in `format`.
  Tensor operator()(const Tensor& t, Device device,
                    MemoryFormat format = MemoryFormat::kContiguous);

 private:
  int ring_size_;
  void* uploader_ = nullptr;  // the backend's, made at the first upload to a GPU
};

}  // namespace loom

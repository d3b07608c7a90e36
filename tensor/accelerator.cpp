// tensor/accelerator.cpp — tensor/accelerator.h over the CUDA backend's table (Note [The CUDA
// backend library]).

#include "tensor/accelerator.h"

#include "tensor/copy.h"
#include "tensor/cuda_backend.h"

namespace loom {

bool cuda_is_built() {
#ifdef LOOM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
  const CudaBackend* backend = cuda_backend_if_available();
  return backend ? backend->device_count() : 0;
}

double dense_peak_flops(Device device, DType dtype) {
  LOOM_CHECK(device.is_cuda(), DeviceError, "dense_peak_flops: ", device,
             " is not a GPU (a CPU's peak is measured: fma_peak_gflops)");
  return cuda_backend("dense_peak_flops").dense_peak_flops(device.index, dtype);
}

std::string why_no_cuda_device() {
  if (cuda_backend_if_available() == nullptr) return cuda_backend_unavailable_reason();
  return "the CUDA driver sees no GPU";
}

Device current_cuda_device() {
  return Device{DeviceType::CUDA, cuda_backend("current_cuda_device").current_device()};
}

void set_cuda_device(Device device) {
  LOOM_CHECK(device.is_cuda(), DeviceError, "set_cuda_device: expected a CUDA device; got ",
             device);
  cuda_backend("set_cuda_device").set_device(device.index);
}

void synchronize(Device device) {
  if (device.is_cuda()) cuda_backend("synchronize").synchronize(device.index);
}

void set_cudnn_deterministic(bool deterministic) {
  cuda_backend("set_cudnn_deterministic").set_cudnn_deterministic(deterministic);
}

// Before the backend is loaded no device check can be pending, so there is nothing to hold (and
// CPU programs never load it for a hold).
DeferredChecksHold::DeferredChecksHold() {
  if (const CudaBackend* backend = cuda_backend_if_loaded()) {
    backend->hold_deferred_checks(+1);
    held_ = true;
  }
}

DeferredChecksHold::~DeferredChecksHold() {
  if (held_) cuda_backend_if_loaded()->hold_deferred_checks(-1);
}

BatchUploader::BatchUploader(int ring_size) : ring_size_(ring_size) {}

BatchUploader::~BatchUploader() {
  if (uploader_) cuda_backend_if_loaded()->free_uploader(uploader_);
}

Tensor BatchUploader::operator()(const Tensor& t, Device device, MemoryFormat format) {
  LOOM_CHECK(t.is_cpu(), DeviceError, "BatchUploader: expected a CPU tensor; got one on ",
             t.device(), " of shape=", t.sizes());
  if (device.is_cpu()) return kernels::contiguous(t, format);
  const CudaBackend& backend = cuda_backend("BatchUploader");
  if (!uploader_) uploader_ = backend.make_uploader(ring_size_);
  return backend.upload(uploader_, t, device, format);
}

}  // namespace loom

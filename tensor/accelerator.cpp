// tensor/accelerator.cpp — tensor/accelerator.h over the CUDA runtime's calls (which raise
// DeviceError, or report no GPU, in a build without CUDA).

#include "tensor/accelerator.h"

#include "tensor/cuda/runtime.h"
#include "tensor/cuda/upload.h"

namespace loom {

bool cuda_is_built() { return cuda::is_built(); }
int cuda_device_count() { return cuda::device_count(); }
Device current_cuda_device() { return Device{DeviceType::CUDA, cuda::current_device()}; }

void set_cuda_device(Device device) {
  LOOM_CHECK(device.is_cuda(), DeviceError, "set_cuda_device: expected a CUDA device; got ",
             device);
  cuda::set_device(device.index);
}

void synchronize(Device device) {
  if (device.is_cuda()) cuda::synchronize(device.index);
}

DeferredChecksHold::DeferredChecksHold() : hold_(std::make_unique<cuda::DeferredChecksHold>()) {}
DeferredChecksHold::~DeferredChecksHold() = default;

BatchUploader::BatchUploader(int ring_size)
    : uploader_(std::make_unique<cuda::Uploader>(ring_size)) {}
BatchUploader::~BatchUploader() = default;

Tensor BatchUploader::operator()(const Tensor& t, Device device, MemoryFormat format) {
  return (*uploader_)(t, device, format);
}

}  // namespace loom

// tensor/cuda/upload.cpp — Uploader (Note [Uploading batches] in tensor/cuda/upload.h). Compiled
// in every build: on the host side it is runtime.h's calls, which a build without CUDA stubs.

#include "tensor/cuda/upload.h"

#include "tensor/copy.h"

namespace loom::cuda {

Uploader::Uploader(int ring_size) : ring_(static_cast<size_t>(ring_size)) {
  LOOM_CHECK(ring_size >= 1, ValueError, "Uploader: the ring needs at least one buffer; got ",
             ring_size);
}

Tensor Uploader::operator()(const Tensor& t, Device device) {
  LOOM_CHECK(t.is_cpu(), DeviceError, "Uploader: expected a CPU tensor; got one on ", t.device(),
             " of shape=", t.sizes());
  if (device.is_cpu()) return t;
  if (device_ < 0) device_ = device.index;
  LOOM_CHECK(device.index == device_, DeviceError, "Uploader: this one serves cuda:", device_,
             "; asked for ", device, " (shape=", t.sizes(), ")");
  const size_t nbytes = t.nbytes();
  Tensor out = empty(t.sizes(), t.dtype(), device);
  if (nbytes == 0) return out;

  Slot& slot = ring_[next_];
  next_ = (next_ + 1) % ring_.size();
  if (slot.copied.recorded()) slot.copied.synchronize();  // its last copy has left the buffer
  if (slot.buffer.nbytes() < nbytes) slot.buffer = PinnedBuffer(nbytes);
  // One pass into the pinned buffer, whatever t's strides: a dense view of it is copy_'s dst.
  kernels::copy_(from_blob(slot.buffer.data(), t.sizes(), t.dtype()), t);

  const Stream stream = Stream::current(device.index);  // the stream `out` was allocated for
  copy_bytes_async(out.data(), slot.buffer.data(), nbytes, CopyKind::HostToDevice, stream);
  slot.copied.record(stream);
  return out;
}

}  // namespace loom::cuda

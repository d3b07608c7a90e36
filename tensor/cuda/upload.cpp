// tensor/cuda/upload.cpp — Uploader (Note [Uploading batches] in tensor/cuda/upload.h), over
// runtime.h's pinned buffers, events and asynchronous copies.

#include "tensor/cuda/upload.h"

#include "tensor/copy.h"
#include "tensor/view.h"

namespace loom::cuda {

Uploader::Uploader(int ring_size) : ring_(static_cast<size_t>(ring_size)) {
  LOOM_CHECK(ring_size >= 1, ValueError, "Uploader: the ring needs at least one buffer; got ",
             ring_size);
}

Uploader::~Uploader() {
  for (const Slot& slot : ring_) {
    try {
      slot.copied.synchronize();
    } catch (const std::exception&) {  // a failed device: nothing left to wait for
    }
  }
}

Tensor Uploader::operator()(const Tensor& t, Device device, MemoryFormat format) {
  LOOM_CHECK(t.is_cpu(), DeviceError, "Uploader: expected a CPU tensor; got one on ", t.device(),
             " of shape=", t.sizes());
  if (device.is_cpu()) return kernels::contiguous(t, format);
  if (device_ < 0) device_ = device.index;
  LOOM_CHECK(device.index == device_, DeviceError, "Uploader: this one serves cuda:", device_,
             "; asked for ", device, " (shape=", t.sizes(), ")");
  const size_t nbytes = t.nbytes();
  Tensor out = empty(t.sizes(), t.dtype(), device, format);
  if (nbytes == 0) return out;

  Slot& slot = ring_[next_];
  next_ = (next_ + 1) % ring_.size();
  if (slot.copied.recorded()) slot.copied.synchronize();  // its last copy has left the buffer
  if (slot.buffer.nbytes() < nbytes) slot.buffer = PinnedBuffer(nbytes);
  // One pass into the pinned buffer, whatever t's strides: a view of it with out's strides is
  // copy_'s dst, so the bytes that go over are already in out's format.
  kernels::copy_(kernels::as_strided(from_blob(slot.buffer.data(), {t.numel()}, t.dtype()),
                                     t.sizes(), out.strides(), 0),
                 t);

  const Stream stream = Stream::current(device.index);  // the stream `out` was allocated for
  copy_bytes_async(out.data(), slot.buffer.data(), nbytes, CopyKind::HostToDevice, stream);
  slot.copied.record(stream);
  return out;
}

}  // namespace loom::cuda

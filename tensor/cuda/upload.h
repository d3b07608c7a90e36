// tensor/cuda/upload.h — host-to-GPU copies of training batches that do not stop the host.
//
// Note [Uploading batches]
// A copy from ordinary (pageable) host memory cannot run asynchronously: kernels::copy_ waits
// until the bytes have arrived, and with them every kernel queued before, so each training step
// would begin with the GPU idle and the host waiting. An Uploader first copies the batch into
// page-locked memory on the host, then queues the copy to the GPU on the device's current stream
// and returns: the step's kernels queue behind it while the GPU still works on the previous
// step. Its pinned buffers form a ring; a buffer is written again only after the event recorded
// behind its last copy has happened, so with a ring of 4 and two tensors a step (images and
// labels), the host waits at most for the copies of the step before the previous one.
// PyTorch reaches the same with DataLoader(pin_memory=True) and .to(device, non_blocking=True).
#pragma once

#include <vector>

#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"

namespace loom::cuda {

class Uploader {
 public:
  explicit Uploader(int ring_size = 4);
  ~Uploader();  // waits for the copies still reading its buffers
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // `t` (a CPU tensor) on `device` stored in `format`, as t.to(device).contiguous(format)
  // returns it (the reordering is done by the host's copy into pinned memory). A CPU device
  // returns kernels::contiguous(t, format). One Uploader serves one GPU.
  Tensor operator()(const Tensor& t, Device device,
                    MemoryFormat format = MemoryFormat::kContiguous);

 private:
  struct Slot {
    PinnedBuffer buffer;
    Event copied;  // recorded behind the last copy out of `buffer`
  };
  std::vector<Slot> ring_;
  size_t next_ = 0;
  int device_ = -1;  // the GPU of the first upload
};

}  // namespace loom::cuda

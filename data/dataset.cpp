// data/dataset.cpp — TensorDataset: validation at construction, views at get().

#include "data/dataset.h"

#include <utility>

#include "tensor/copy.h"
#include "tensor/view.h"

namespace loom::data {

TensorDataset::TensorDataset(Tensor images, Tensor labels, int64_t num_classes, std::string name)
    : name_(std::move(name)) {
  LOOM_CHECK(images.defined() && labels.defined(), ValueError, name_,
             ": expected images and labels; got an undefined tensor");
  LOOM_CHECK(images.is_cpu() && labels.is_cpu(), DeviceError, name_,
             ": images and labels must be CPU tensors");
  LOOM_CHECK(images.dtype() == kUInt8, DTypeError, name_, ": expected uint8 images; got ",
             images.dtype());
  LOOM_CHECK(labels.dtype() == kInt64, DTypeError, name_, ": expected int64 labels; got ",
             labels.dtype());
  LOOM_CHECK(images.dim() == 4 && labels.dim() == 1 && images.size(0) == labels.size(0), ShapeError,
             name_, ": expected images [N, C, H, W] and labels [N]; got images=", images.sizes(),
             " labels=", labels.sizes());
  LOOM_CHECK(num_classes >= 1, ValueError, name_, ": expected at least one class; got ",
             num_classes);
  images_ = kernels::contiguous(images);
  labels_ = kernels::contiguous(labels);
  size_ = images_.size(0);
  num_classes_ = num_classes;
  const int64_t* label = labels_.data_ptr<int64_t>();
  for (int64_t i = 0; i < size_; ++i)
    LOOM_CHECK(label[i] >= 0 && label[i] < num_classes_, ValueError, name_, ": label ", label[i],
               " of example ", i, " is outside [0, ", num_classes_, ")");
}

Example TensorDataset::get(int64_t index) const {
  LOOM_CHECK(index >= 0 && index < size_, IndexError, name_, ": index ", index,
             " is out of range for ", size_, " examples");
  return {kernels::select(images_, 0, index), labels_.data_ptr<int64_t>()[index]};
}

Shape TensorDataset::image_shape() const {
  return {images_.size(1), images_.size(2), images_.size(3)};
}

}  // namespace loom::data

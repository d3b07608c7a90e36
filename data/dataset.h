// data/dataset.h — what the loader reads from: a Dataset maps an index to one Example, a raw
// uint8 image [C, H, W] and an int64 label. TensorDataset keeps a whole split in memory as one
// uint8 tensor [N, C, H, W]; the readers (Cifar10, FashionMnist, ImageFolder) and Synthetic are
// TensorDatasets filled from files or from Philox.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace loom::data {

struct Example {
  Tensor image;  // uint8 [C, H, W], raw pixels
  int64_t label;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The example at `index`; IndexError outside [0, size()). Thread-safe: loader workers call it
  // concurrently.
  virtual Example get(int64_t index) const = 0;
  virtual Shape image_shape() const = 0;  // [C, H, W], the same for every example
  virtual int64_t num_classes() const = 0;
};

// A split read into memory: images uint8 [N, C, H, W] and labels int64 [N].
struct ImagesAndLabels {
  Tensor images;
  Tensor labels;
};

// Images uint8 [N, C, H, W] and labels int64 [N] in [0, num_classes), held in memory (made
// contiguous); get() returns a view of one image, no copy. `name` prefixes error messages.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor images, Tensor labels, int64_t num_classes,
                std::string name = "TensorDataset");
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  Shape image_shape() const override;
  int64_t num_classes() const override { return num_classes_; }
  const Tensor& images() const { return images_; }
  const Tensor& labels() const { return labels_; }
  const std::string& name() const { return name_; }

 private:
  Tensor images_;
  Tensor labels_;
  int64_t size_;
  int64_t num_classes_;
  std::string name_;
};

}  // namespace loom::data

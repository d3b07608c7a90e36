// data/idx.h — the IDX format of MNIST and Fashion-MNIST (gzip-compressed or not):
// a 4-byte magic (0, 0, element type, number of dims), one big-endian uint32 per dim, then the
// elements in row-major order. Debian's dataset-fashion-mnist installs the gzipped files under
// /usr/share/datasets/fashion-mnist. FashionMnist holds a split as a Dataset.
#pragma once

#include <string>

#include "data/dataset.h"
#include "tensor/tensor.h"

namespace loom::data {

// The file's contents as a uint8 tensor with the file's dims. Raises IOError naming the file
// and what was expected when it is missing, truncated, not IDX, or not of unsigned bytes.
Tensor read_idx(const std::string& path);

// The Fashion-MNIST (or MNIST) split in `dir`: images uint8 [N, 28, 28], labels int64 [N].
ImagesAndLabels read_mnist(const std::string& dir, bool train);

// That split as a Dataset: images [1, 28, 28], 10 classes.
class FashionMnist : public TensorDataset {
 public:
  FashionMnist(const std::string& dir, bool train);

 private:
  explicit FashionMnist(ImagesAndLabels split);
};

}  // namespace loom::data

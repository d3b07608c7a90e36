// data/idx.h — the IDX format of MNIST and Fashion-MNIST (gzip-compressed or not):
// a 4-byte magic (0, 0, element type, number of dims), one big-endian uint32 per dim, then the
// elements in row-major order. Debian's dataset-fashion-mnist installs the gzipped files under
// /usr/share/datasets/fashion-mnist.
#pragma once

#include <string>

#include "tensor/tensor.h"

namespace loom::data {

// The file's contents as a uint8 tensor with the file's dims. Raises IOError naming the file
// and what was expected when it is missing, truncated, not IDX, or not of unsigned bytes.
Tensor read_idx(const std::string& path);

// The Fashion-MNIST (or MNIST) split in `dir`: images uint8 [N, 28, 28], labels int64 [N].
struct ImagesAndLabels {
  Tensor images;
  Tensor labels;
};
ImagesAndLabels read_mnist(const std::string& dir, bool train);

}  // namespace loom::data

// data/synthetic.h — random images and labels, deterministic from a seed: a dataset for
// benchmarks and tests that needs no files (the loader's cost without the disk's).
#pragma once

#include <utility>

#include "data/dataset.h"

namespace loom::data {

// n uniform random uint8 images of `shape` [C, H, W] and uniform labels in [0, num_classes),
// all from Philox keyed by `seed` (image i's bytes from counters of its own, so the contents
// do not depend on the thread count). Held in memory: n * C * H * W bytes.
class Synthetic : public TensorDataset {
 public:
  Synthetic(int64_t n, const Shape& shape, int64_t num_classes, uint64_t seed = 0);

 private:
  explicit Synthetic(std::pair<ImagesAndLabels, int64_t> data);
};

}  // namespace loom::data

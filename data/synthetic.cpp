// data/synthetic.cpp — Philox bytes: image i takes counters i * blocks .. (i + 1) * blocks - 1
// of subsequence 0 (16 bytes each), its label lane 0 of counter i in subsequence 1.

#include "data/synthetic.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tensor/parallel.h"
#include "tensor/random.h"

namespace loom::data {

namespace {

std::pair<ImagesAndLabels, int64_t> generate(int64_t n, const Shape& shape, int64_t num_classes,
                                             uint64_t seed) {
  LOOM_CHECK(n >= 0, ValueError, "Synthetic: expected n >= 0; got ", n);
  LOOM_CHECK(shape.size() == 3 && shape[0] >= 1 && shape[1] >= 1 && shape[2] >= 1, ShapeError,
             "Synthetic: expected an image shape [C, H, W] of positive sizes; got ", shape);
  LOOM_CHECK(num_classes >= 1 && num_classes <= (int64_t{1} << 32), ValueError,
             "Synthetic: expected num_classes in [1, 2^32]; got ", num_classes);
  const int64_t image_bytes = shape_numel(shape);
  const int64_t blocks = (image_bytes + 15) / 16;
  Tensor images = empty({n, shape[0], shape[1], shape[2]}, kUInt8);
  Tensor labels = empty({n}, kInt64);
  uint8_t* pixels = images.data_ptr<uint8_t>();
  int64_t* label = labels.data_ptr<int64_t>();
  parallel_for(0, n, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      uint8_t* image = pixels + i * image_bytes;
      for (int64_t b = 0; b < blocks; ++b) {
        const auto lanes = philox4x32(seed, static_cast<uint64_t>(i * blocks + b), 0);
        const int64_t count = std::min<int64_t>(16, image_bytes - b * 16);
        std::memcpy(image + b * 16, lanes.data(), static_cast<size_t>(count));
      }
      const uint32_t bits = philox4x32(seed, static_cast<uint64_t>(i), 1)[0];
      label[i] = static_cast<int64_t>((uint64_t{bits} * static_cast<uint64_t>(num_classes)) >> 32);
    }
  });
  return {{images, labels}, num_classes};
}

}  // namespace

Synthetic::Synthetic(int64_t n, const Shape& shape, int64_t num_classes, uint64_t seed)
    : Synthetic(generate(n, shape, num_classes, seed)) {}

Synthetic::Synthetic(std::pair<ImagesAndLabels, int64_t> data)
    : TensorDataset(data.first.images, data.first.labels, data.second, "Synthetic") {}

}  // namespace loom::data

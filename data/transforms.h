// data/transforms.h — per-sample augmentations in torchvision's shape (Pad, RandomCrop,
// RandomHorizontalFlip, ToFloat = ToTensor, Normalize) and the Pipeline that runs them: the
// geometric steps work on uint8 images, then ToFloat and Normalize, folded into one 256-entry
// table per channel, write float32 once, straight into the batch.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace loom::data {

// Note [Sample randomness]
// Every random choice about dataset example `index` in epoch `epoch` comes from its own
// SampleRng: Philox4x32-10 keyed by the loader's seed (through philox_key, so the augmentation
// and shuffling streams of one seed differ), with counter (block | epoch << 32, index). The
// draws depend on nothing else: not the worker thread, the number of workers, the rank that got
// the example, or the order examples were processed in. A run resumed mid-epoch, or spread over
// more machines, augments every image exactly as the original run did.

// A 64-bit Philox key for a purpose (augmentation, shuffling, ...) of a user seed.
uint64_t philox_key(uint64_t seed, uint64_t purpose);
inline constexpr uint64_t kAugmentPurpose = 1;
inline constexpr uint64_t kShufflePurpose = 2;

// Counter-based random numbers: lanes of philox4x32(key, counter, subsequence), the counter
// advancing by one every four 32-bit draws.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t key, uint64_t counter, uint64_t subsequence)
      : key_(key), counter_(counter), subsequence_(subsequence) {}
  uint32_t next_u32();
  uint64_t next_u64() { return (uint64_t{next_u32()} << 32) | next_u32(); }
  float uniform() { return (next_u32() >> 8) * (1.0f / 16777216.0f); }  // [0, 1), 24 bits
  // Uniform in [0, high) without bias (Lemire's multiply-and-reject); high >= 1.
  int64_t randint(int64_t high);

 private:
  uint64_t key_, counter_, subsequence_;
  std::array<uint32_t, 4> lanes_{};
  int next_lane_ = 4;
};

// The stream of one example in one epoch; see Note [Sample randomness].
class SampleRng : public PhiloxStream {
 public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t index);
};

// ---------------------------------------------------------------- steps

class Transform {
 public:
  virtual ~Transform() = default;
  virtual std::string repr() const = 0;  // "RandomCrop(size=[32, 32], padding=4)"
};

// A geometric step on uint8 images [C, H, W] (contiguous).
class ImageTransform : public Transform {
 public:
  // The output shape for input `in`; ShapeError naming the step when it cannot apply.
  virtual Shape output_shape(const Shape& in) const = 0;
  // Writes the output (output_shape(in) bytes) into dst and returns true, or returns false
  // without touching dst when this sample passes through unchanged.
  virtual bool apply(const uint8_t* src, const Shape& in, uint8_t* dst, SampleRng& rng) const = 0;
};

// A per-channel map of values, after the geometric steps (ToFloat, Normalize). The Pipeline
// tabulates it for the 256 byte values, so it must not be random.
class ValueTransform : public Transform {
 public:
  virtual float map(float value, int64_t channel) const = 0;
  // The channel count its parameters are for; 0 when it takes any.
  virtual int64_t channels() const { return 0; }
};

// Pads with `fill`: by `padding` on every side, by (left, top, right, bottom) as torchvision's
// 4-tuple, or (Pad::to) up to height x width, centred, the odd pixel going bottom/right.
class Pad : public ImageTransform {
 public:
  explicit Pad(int64_t padding, uint8_t fill = 0);
  Pad(int64_t left, int64_t top, int64_t right, int64_t bottom, uint8_t fill = 0);
  static Pad to(int64_t height, int64_t width, uint8_t fill = 0);
  Shape output_shape(const Shape& in) const override;
  bool apply(const uint8_t* src, const Shape& in, uint8_t* dst, SampleRng& rng) const override;
  std::string repr() const override;

 private:
  Pad() = default;
  // Top and left padding for an input [C, H, W].
  std::array<int64_t, 2> offsets(const Shape& in) const;
  int64_t left_ = 0, top_ = 0, right_ = 0, bottom_ = 0;
  int64_t to_height_ = -1, to_width_ = -1;  // >= 0 in Pad::to mode
  uint8_t fill_ = 0;
};

// torchvision's RandomCrop(size, padding): pads every side by `padding` with `fill`, then cuts a
// height x width window at a uniformly drawn top (drawn first) and left.
class RandomCrop : public ImageTransform {
 public:
  explicit RandomCrop(int64_t size, int64_t padding = 0, uint8_t fill = 0);
  RandomCrop(std::array<int64_t, 2> size, int64_t padding = 0, uint8_t fill = 0);
  Shape output_shape(const Shape& in) const override;
  bool apply(const uint8_t* src, const Shape& in, uint8_t* dst, SampleRng& rng) const override;
  std::string repr() const override;

 private:
  int64_t height_, width_, padding_;
  uint8_t fill_;
};

// Mirrors left-right when a uniform draw is below p.
class RandomHorizontalFlip : public ImageTransform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Shape output_shape(const Shape& in) const override;
  bool apply(const uint8_t* src, const Shape& in, uint8_t* dst, SampleRng& rng) const override;
  std::string repr() const override;

 private:
  float p_;
};

// value / 255, as torchvision's ToTensor on a uint8 image (float32 division).
class ToFloat : public ValueTransform {
 public:
  float map(float value, int64_t) const override { return value / 255.0f; }
  std::string repr() const override { return "ToFloat()"; }
};

// (value - mean[c]) / std[c] in float32, as torchvision's Normalize. One mean and std apply to
// every channel.
class Normalize : public ValueTransform {
 public:
  Normalize(std::vector<float> mean, std::vector<float> stddev);
  float map(float value, int64_t channel) const override;
  int64_t channels() const override;
  std::string repr() const override;

 private:
  std::vector<float> mean_, stddev_;
};

// ---------------------------------------------------------------- the pipeline

// The steps of one sample, in order: image steps first, then value steps (an image step after a
// value step raises ValueError: geometry runs on bytes). Without ToFloat the values are the raw
// bytes as floats. Immutable after construction; apply is thread-safe.
class Pipeline {
 public:
  Pipeline() : Pipeline(std::vector<std::shared_ptr<const Transform>>{}) {}
  explicit Pipeline(std::vector<std::shared_ptr<const Transform>> steps);

  // The output [C, H, W] for an input image shape; ShapeError naming the step that cannot take
  // it (including a Normalize with 3 means for a 1-channel image).
  Shape output_shape(const Shape& in) const;
  // Runs the steps on example.image (uint8 [C, H, W]) and writes shape_numel(output_shape)
  // floats to dst.
  void apply(const Example& example, SampleRng& rng, float* dst) const;
  // The same into a new float32 tensor [C, H, W] (tests, inspection).
  Tensor apply(const Example& example, SampleRng& rng) const;
  std::string repr() const;  // "Pipeline(RandomCrop(...), RandomHorizontalFlip(p=0.5), ...)"

 private:
  std::vector<std::shared_ptr<const ImageTransform>> image_steps_;
  std::vector<std::shared_ptr<const ValueTransform>> value_steps_;
  int64_t table_channels_ = 1;  // rows of table_: 1 (any image) or the Normalize's channels
  std::vector<float> table_;    // [table_channels_, 256]: the value steps applied to each byte
};

// compose(RandomCrop(32, 4), RandomHorizontalFlip(), ToFloat(), Normalize(mean, std))
template <typename... Steps>
Pipeline compose(Steps... steps) {
  return Pipeline(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<const Steps>(std::move(steps))...});
}

}  // namespace loom::data

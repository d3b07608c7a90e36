// data/transforms.cpp — the steps and the pipeline. Image steps copy whole rows (memcpy,
// memset, reverse_copy); the value steps become a [channels, 256] float table, so the one pass
// that writes the batch is a lookup per pixel.

#include "data/transforms.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "tensor/copy.h"
#include "tensor/random.h"

namespace loom::data {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// `step` names the check in the message (null: the Pipeline); repr() only runs on failure.
void check_image_shape(const Shape& in, const Transform* step) {
  LOOM_CHECK(in.size() == 3 && in[0] >= 1 && in[1] >= 1 && in[2] >= 1, ShapeError,
             step ? step->repr() : std::string("Pipeline"), ": expected an image [C, H, W]; got ",
             in);
}

// dst [C, out_h, out_w] at (y, x) = src [C, h, w] at (y + top, x + left) where that lies inside
// src, `fill` elsewhere. Pad and RandomCrop are both this with different offsets.
void copy_window(const uint8_t* src, const Shape& in, uint8_t* dst, int64_t out_h, int64_t out_w,
                 int64_t top, int64_t left, uint8_t fill) {
  const int64_t channels = in[0], h = in[1], w = in[2];
  // Output columns [x0, x1) come from the source; the rest are fill.
  const int64_t x0 = std::clamp<int64_t>(-left, 0, out_w);
  const int64_t x1 = std::clamp<int64_t>(w - left, x0, out_w);
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t y = 0; y < out_h; ++y) {
      uint8_t* row = dst + (c * out_h + y) * out_w;
      const int64_t sy = y + top;
      if (sy < 0 || sy >= h || x1 == x0) {
        std::memset(row, fill, static_cast<size_t>(out_w));
        continue;
      }
      std::memset(row, fill, static_cast<size_t>(x0));
      std::memcpy(row + x0, src + (c * h + sy) * w + x0 + left, static_cast<size_t>(x1 - x0));
      std::memset(row + x1, fill, static_cast<size_t>(out_w - x1));
    }
  }
}

}  // namespace

uint64_t philox_key(uint64_t seed, uint64_t purpose) {
  return splitmix64(splitmix64(seed) ^ purpose);
}

uint32_t PhiloxStream::next_u32() {
  if (next_lane_ == 4) {
    lanes_ = philox4x32(key_, counter_++, subsequence_);
    next_lane_ = 0;
  }
  return lanes_[next_lane_++];
}

int64_t PhiloxStream::randint(int64_t high) {
  LOOM_ASSERT(high >= 1, "randint: high=", high);
  if (high < (int64_t{1} << 32)) {
    const uint32_t range = static_cast<uint32_t>(high);
    uint64_t product = uint64_t{next_u32()} * range;
    if (static_cast<uint32_t>(product) < range) {
      const uint32_t threshold = static_cast<uint32_t>(0u - range) % range;  // 2^32 mod range
      while (static_cast<uint32_t>(product) < threshold) product = uint64_t{next_u32()} * range;
    }
    return static_cast<int64_t>(product >> 32);
  }
  const uint64_t range = static_cast<uint64_t>(high);
  unsigned __int128 product = static_cast<unsigned __int128>(next_u64()) * range;
  if (static_cast<uint64_t>(product) < range) {
    const uint64_t threshold = (0ull - range) % range;
    while (static_cast<uint64_t>(product) < threshold)
      product = static_cast<unsigned __int128>(next_u64()) * range;
  }
  return static_cast<int64_t>(product >> 64);
}

SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t index)
    : PhiloxStream(philox_key(seed, kAugmentPurpose), static_cast<uint64_t>(epoch) << 32,
                   static_cast<uint64_t>(index)) {
  LOOM_CHECK(epoch >= 0 && epoch < (int64_t{1} << 32) && index >= 0, ValueError,
             "SampleRng: expected epoch in [0, 2^32) and index >= 0; got epoch=", epoch,
             " index=", index);
}

// ---------------------------------------------------------------- Pad

Pad::Pad(int64_t padding, uint8_t fill) : Pad(padding, padding, padding, padding, fill) {}

Pad::Pad(int64_t left, int64_t top, int64_t right, int64_t bottom, uint8_t fill)
    : left_(left), top_(top), right_(right), bottom_(bottom), fill_(fill) {
  LOOM_CHECK(left >= 0 && top >= 0 && right >= 0 && bottom >= 0, ValueError,
             "Pad: expected non-negative padding; got left=", left, " top=", top, " right=", right,
             " bottom=", bottom);
}

Pad Pad::to(int64_t height, int64_t width, uint8_t fill) {
  LOOM_CHECK(height >= 1 && width >= 1, ValueError, "Pad.to: expected a positive size; got ",
             Shape{height, width});
  Pad pad;
  pad.to_height_ = height;
  pad.to_width_ = width;
  pad.fill_ = fill;
  return pad;
}

std::array<int64_t, 2> Pad::offsets(const Shape& in) const {
  if (to_height_ < 0) return {top_, left_};
  return {(to_height_ - in[1]) / 2, (to_width_ - in[2]) / 2};
}

Shape Pad::output_shape(const Shape& in) const {
  check_image_shape(in, this);
  if (to_height_ < 0) return {in[0], in[1] + top_ + bottom_, in[2] + left_ + right_};
  LOOM_CHECK(in[1] <= to_height_ && in[2] <= to_width_, ShapeError, repr(),
             ": the image is larger than the target; got ", in);
  return {in[0], to_height_, to_width_};
}

bool Pad::apply(const uint8_t* src, const Shape& in, uint8_t* dst, SampleRng&) const {
  const Shape out = output_shape(in);
  const auto [top, left] = offsets(in);
  copy_window(src, in, dst, out[1], out[2], -top, -left, fill_);
  return true;
}

std::string Pad::repr() const {
  if (to_height_ >= 0)
    return detail::str("Pad.to(height=", to_height_, ", width=", to_width_, ", fill=", int{fill_},
                       ")");
  return detail::str("Pad(padding=", Shape{left_, top_, right_, bottom_}, ", fill=", int{fill_},
                     ")");
}

// ---------------------------------------------------------------- RandomCrop

RandomCrop::RandomCrop(int64_t size, int64_t padding, uint8_t fill)
    : RandomCrop({size, size}, padding, fill) {}

RandomCrop::RandomCrop(std::array<int64_t, 2> size, int64_t padding, uint8_t fill)
    : height_(size[0]), width_(size[1]), padding_(padding), fill_(fill) {
  LOOM_CHECK(height_ >= 1 && width_ >= 1 && padding_ >= 0, ValueError,
             "RandomCrop: expected a positive size and padding >= 0; got size=",
             Shape{height_, width_}, " padding=", padding_);
}

Shape RandomCrop::output_shape(const Shape& in) const {
  check_image_shape(in, this);
  LOOM_CHECK(in[1] + 2 * padding_ >= height_ && in[2] + 2 * padding_ >= width_, ShapeError, repr(),
             ": the crop is larger than the padded image; got an image ", in);
  return {in[0], height_, width_};
}

bool RandomCrop::apply(const uint8_t* src, const Shape& in, uint8_t* dst, SampleRng& rng) const {
  output_shape(in);
  const int64_t top = rng.randint(in[1] + 2 * padding_ - height_ + 1);
  const int64_t left = rng.randint(in[2] + 2 * padding_ - width_ + 1);
  copy_window(src, in, dst, height_, width_, top - padding_, left - padding_, fill_);
  return true;
}

std::string RandomCrop::repr() const {
  return detail::str("RandomCrop(size=", Shape{height_, width_}, ", padding=", padding_,
                     fill_ ? detail::str(", fill=", int{fill_}) : "", ")");
}

// ---------------------------------------------------------------- RandomHorizontalFlip

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(static_cast<float>(p)) {
  LOOM_CHECK(p >= 0 && p <= 1, ValueError, "RandomHorizontalFlip: expected p in [0, 1]; got ", p);
}

Shape RandomHorizontalFlip::output_shape(const Shape& in) const {
  check_image_shape(in, this);
  return in;
}

bool RandomHorizontalFlip::apply(const uint8_t* src, const Shape& in, uint8_t* dst,
                                 SampleRng& rng) const {
  if (!(rng.uniform() < p_)) return false;
  const int64_t rows = in[0] * in[1], w = in[2];
  for (int64_t r = 0; r < rows; ++r) std::reverse_copy(src + r * w, src + (r + 1) * w, dst + r * w);
  return true;
}

std::string RandomHorizontalFlip::repr() const {
  return detail::str("RandomHorizontalFlip(p=", p_, ")");
}

// ---------------------------------------------------------------- Normalize

Normalize::Normalize(std::vector<float> mean, std::vector<float> stddev)
    : mean_(std::move(mean)), stddev_(std::move(stddev)) {
  LOOM_CHECK(!mean_.empty() && mean_.size() == stddev_.size(), ValueError,
             "Normalize: expected as many means as standard deviations (at least one); got ",
             mean_.size(), " and ", stddev_.size());
  for (float s : stddev_)
    LOOM_CHECK(s != 0.0f, ValueError, "Normalize: a standard deviation is zero; got ", repr());
}

float Normalize::map(float value, int64_t channel) const {
  const size_t c = mean_.size() == 1 ? 0 : static_cast<size_t>(channel);
  return (value - mean_[c]) / stddev_[c];
}

int64_t Normalize::channels() const {
  return mean_.size() == 1 ? 0 : static_cast<int64_t>(mean_.size());
}

std::string Normalize::repr() const {
  std::ostringstream os;
  auto list = [&](const std::vector<float>& v) {
    os << '[';
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    os << ']';
  };
  os << "Normalize(mean=";
  list(mean_);
  os << ", std=";
  list(stddev_);
  os << ')';
  return os.str();
}

// ---------------------------------------------------------------- Pipeline

Pipeline::Pipeline(std::vector<std::shared_ptr<const Transform>> steps) {
  for (const auto& step : steps) {
    LOOM_CHECK(step != nullptr, ValueError, "Pipeline: a step is null");
    if (auto image_step = std::dynamic_pointer_cast<const ImageTransform>(step)) {
      LOOM_CHECK(value_steps_.empty(), ValueError, "Pipeline: ", step->repr(), " comes after ",
                 value_steps_.back()->repr(),
                 "; image steps run on bytes and must come before ToFloat and Normalize");
      image_steps_.push_back(std::move(image_step));
    } else if (auto value_step = std::dynamic_pointer_cast<const ValueTransform>(step)) {
      const int64_t c = value_step->channels();
      LOOM_CHECK(c == 0 || table_channels_ == 1 || c == table_channels_, ValueError,
                 "Pipeline: ", value_step->repr(), " is for ", c,
                 " channels but an earlier step is for ", table_channels_);
      if (c > 0) table_channels_ = c;
      value_steps_.push_back(std::move(value_step));
    } else {
      throw ValueError(detail::str("Pipeline: ", step->repr(),
                                   " is neither an ImageTransform nor a ValueTransform"));
    }
  }
  table_.resize(static_cast<size_t>(table_channels_ * 256));
  for (int64_t c = 0; c < table_channels_; ++c) {
    for (int v = 0; v < 256; ++v) {
      float value = static_cast<float>(v);
      for (const auto& step : value_steps_) value = step->map(value, c);
      table_[c * 256 + v] = value;
    }
  }
}

Shape Pipeline::output_shape(const Shape& in) const {
  check_image_shape(in, nullptr);
  Shape shape = in;
  for (const auto& step : image_steps_) shape = step->output_shape(shape);
  if (table_channels_ > 1 && shape[0] != table_channels_) {
    std::string step;
    for (const auto& s : value_steps_)
      if (s->channels() > 0) step = s->repr();
    throw ShapeError(detail::str("Pipeline: ", step, " is for ", table_channels_,
                                 " channels; got images ", shape));
  }
  return shape;
}

void Pipeline::apply(const Example& example, SampleRng& rng, float* dst) const {
  const Tensor& image = example.image;
  LOOM_CHECK(image.defined() && image.is_cpu() && image.dtype() == kUInt8 && image.dim() == 3,
             ValueError, "Pipeline: expected a uint8 CPU image [C, H, W]; got ",
             image.defined() ? detail::str(image.dtype(), " ", image.sizes()) : "undefined");
  const Tensor source = kernels::contiguous(image);
  // Two buffers per thread, reused from sample to sample: each image step reads one, writes the
  // other (or passes its input through).
  thread_local std::vector<uint8_t> scratch[2];
  const uint8_t* current = source.data_ptr<uint8_t>();
  Shape shape = image.sizes();
  int target = 0;
  for (const auto& step : image_steps_) {
    const Shape out = step->output_shape(shape);
    std::vector<uint8_t>& buffer = scratch[target];
    if (buffer.size() < static_cast<size_t>(shape_numel(out)))
      buffer.resize(static_cast<size_t>(shape_numel(out)));
    if (step->apply(current, shape, buffer.data(), rng)) {
      current = buffer.data();
      target ^= 1;
    } else {
      LOOM_ASSERT(out == shape, step->repr(), " passed its input through but changes the shape");
    }
    shape = out;
  }
  LOOM_CHECK(table_channels_ == 1 || shape[0] == table_channels_, ShapeError,
             "Pipeline: ", "the value steps are for ", table_channels_, " channels; got images ",
             shape);
  const int64_t plane = shape[1] * shape[2];
  for (int64_t c = 0; c < shape[0]; ++c) {
    const float* table = table_.data() + (table_channels_ == 1 ? 0 : c * 256);
    const uint8_t* in = current + c * plane;
    float* out = dst + c * plane;
    for (int64_t p = 0; p < plane; ++p) out[p] = table[in[p]];
  }
}

Tensor Pipeline::apply(const Example& example, SampleRng& rng) const {
  LOOM_CHECK(example.image.defined(), ValueError, "Pipeline: the example has no image");
  Tensor out = empty(output_shape(example.image.sizes()), kFloat32);
  apply(example, rng, out.data_ptr<float>());
  return out;
}

std::string Pipeline::repr() const {
  std::string out = "Pipeline(";
  bool first = true;
  for (const auto& step : image_steps_) out += (first ? "" : ", ") + step->repr(), first = false;
  for (const auto& step : value_steps_) out += (first ? "" : ", ") + step->repr(), first = false;
  return out + ")";
}

}  // namespace loom::data

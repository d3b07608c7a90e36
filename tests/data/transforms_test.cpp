// tests/data/transforms_test.cpp — the per-sample steps against naive references (pad, crop,
// flip by index arithmetic; ToFloat and Normalize as torchvision's float32 expressions), the
// randomness contract of Note [Sample randomness], and the pipeline's error paths.

#include "data/transforms.h"

#include <set>

#include "test_util.h"

using namespace loom;
using data::Example;
using data::SampleRng;

namespace {

// A uint8 image [C, H, W] whose element (c, y, x) is 100 c + 10 y + x (mod 256).
Tensor ramp(int64_t c, int64_t h, int64_t w) {
  std::vector<uint8_t> v;
  for (int64_t k = 0; k < c; ++k)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) v.push_back(static_cast<uint8_t>(100 * k + 10 * y + x));
  return tensor<uint8_t>(v, {c, h, w});
}

// Runs the pipeline on one image as example `index` of `epoch`, seed 0.
Tensor run(const data::Pipeline& pipeline, const Tensor& image, int64_t epoch = 0,
           int64_t index = 0, uint64_t seed = 0) {
  SampleRng rng(seed, epoch, index);
  return pipeline.apply(Example{image, 0}, rng);
}

double at(const Tensor& t, int64_t c, int64_t y, int64_t x) {
  return t.to_vector<double>()[(c * t.size(1) + y) * t.size(2) + x];
}

}  // namespace

TEST(SampleRng, DependsOnSeedEpochAndIndexOnly) {
  auto draws = [](uint64_t seed, int64_t epoch, int64_t index) {
    SampleRng rng(seed, epoch, index);
    std::vector<uint32_t> out;
    for (int i = 0; i < 9; ++i) out.push_back(rng.next_u32());
    return out;
  };
  EXPECT_EQ(draws(1, 2, 3), draws(1, 2, 3));
  EXPECT_NE(draws(1, 2, 3), draws(1, 3, 3));
  EXPECT_NE(draws(1, 2, 3), draws(1, 2, 4));
  EXPECT_NE(draws(1, 2, 3), draws(2, 2, 3));
  // Pinned: the same numbers on every machine and in every later version.
  SampleRng rng(0, 0, 0);
  const std::array<uint32_t, 4> lanes =
      philox4x32(data::philox_key(0, data::kAugmentPurpose), 0, 0);
  for (uint32_t lane : lanes) EXPECT_EQ(rng.next_u32(), lane);
  EXPECT_LOOM_ERROR(SampleRng(0, -1, 0), ValueError, {"epoch"});
}

TEST(SampleRng, RandintIsUniformAndInRange) {
  data::PhiloxStream stream(5, 0, 0);
  std::vector<int> counts(9);
  for (int i = 0; i < 18000; ++i) {
    const int64_t v = stream.randint(9);
    ASSERT_TRUE(v >= 0 && v < 9);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 2000, 200);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(stream.randint(1), 0);
  const int64_t big = (int64_t{1} << 40) + 3;
  for (int i = 0; i < 100; ++i) {
    const int64_t v = stream.randint(big);
    EXPECT_TRUE(v >= 0 && v < big);
  }
}

TEST(Transforms, PadExact) {
  const Tensor image = ramp(2, 2, 3);
  const Tensor out = run(data::compose(data::Pad(1, 2, 3, 0, /*fill=*/7)), image);
  ASSERT_EQ(out.sizes(), (Shape{2, 4, 7}));
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t y = 0; y < 4; ++y)
      for (int64_t x = 0; x < 7; ++x) {
        const int64_t sy = y - 2, sx = x - 1;
        const double expected =
            (sy >= 0 && sy < 2 && sx >= 0 && sx < 3) ? 100 * c + 10 * sy + sx : 7;
        ASSERT_EQ(at(out, c, y, x), expected) << c << " " << y << " " << x;
      }
  EXPECT_EQ(run(data::compose(data::Pad(4)), image).sizes(), (Shape{2, 10, 11}));
  // Fashion-MNIST's 28 -> 32: two black pixels on every side.
  const Tensor fashion = run(data::compose(data::Pad::to(32, 32)), ramp(1, 28, 28));
  ASSERT_EQ(fashion.sizes(), (Shape{1, 32, 32}));
  EXPECT_EQ(at(fashion, 0, 1, 5), 0);
  EXPECT_EQ(at(fashion, 0, 2, 2), 0);
  EXPECT_EQ(at(fashion, 0, 29, 29), static_cast<uint8_t>(270 + 27));
  EXPECT_EQ(at(fashion, 0, 30, 29), 0);
  // Odd difference: the extra row and column go bottom/right.
  const Tensor odd = run(data::compose(data::Pad::to(5, 4, 9)), ramp(1, 2, 2));
  EXPECT_EQ(at(odd, 0, 1, 1), 0);  // source (0, 0)
  EXPECT_EQ(at(odd, 0, 0, 1), 9);
  EXPECT_EQ(at(odd, 0, 3, 3), 9);
  EXPECT_EQ(at(odd, 0, 2, 2), 11);  // source (1, 1)
  EXPECT_LOOM_ERROR(run(data::compose(data::Pad::to(2, 2)), image), ShapeError,
                    {"Pad.to", "[2, 2, 3]"});
  EXPECT_LOOM_ERROR(data::Pad(-1), ValueError, {"Pad"});
}

TEST(Transforms, RandomCropMatchesPadThenCropAtTheDrawnOffsets) {
  const Tensor image = ramp(3, 6, 5);
  const auto pipeline = data::compose(data::RandomCrop({4, 3}, /*padding=*/2));
  std::set<int64_t> tops, lefts;
  for (int64_t index = 0; index < 200; ++index) {
    const Tensor out = run(pipeline, image, 1, index);
    ASSERT_EQ(out.sizes(), (Shape{3, 4, 3}));
    SampleRng replay(0, 1, index);
    const int64_t top = replay.randint(6 + 4 - 4 + 1), left = replay.randint(5 + 4 - 3 + 1);
    tops.insert(top);
    lefts.insert(left);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 4; ++y)
        for (int64_t x = 0; x < 3; ++x) {
          const int64_t sy = y + top - 2, sx = x + left - 2;
          const double expected =
              (sy >= 0 && sy < 6 && sx >= 0 && sx < 5) ? 100 * c + 10 * sy + sx : 0;
          ASSERT_EQ(at(out, c, y, x), expected) << index;
        }
  }
  EXPECT_EQ(tops.size(), 7u);  // every offset of the padded image is reachable
  EXPECT_EQ(lefts.size(), 7u);
  EXPECT_LOOM_ERROR(run(data::compose(data::RandomCrop(11, 2)), image), ShapeError,
                    {"RandomCrop", "[3, 6, 5]"});
}

TEST(Transforms, HorizontalFlip) {
  const Tensor image = ramp(2, 3, 4);
  const Tensor flipped = run(data::compose(data::RandomHorizontalFlip(1.0)), image);
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t y = 0; y < 3; ++y)
      for (int64_t x = 0; x < 4; ++x) EXPECT_EQ(at(flipped, c, y, x), 100 * c + 10 * y + (3 - x));
  EXPECT_TRUE(test::tensors_close(run(data::compose(data::RandomHorizontalFlip(0.0)), image),
                                  image.to(kFloat32)));
  const auto half = data::compose(data::RandomHorizontalFlip());
  int flips = 0;
  for (int64_t index = 0; index < 1000; ++index)
    flips += at(run(half, image, 0, index), 0, 0, 0) == 3;
  EXPECT_NEAR(flips, 500, 60);
  EXPECT_LOOM_ERROR(data::RandomHorizontalFlip(1.5), ValueError, {"p in [0, 1]"});
}

TEST(Transforms, ToFloatAndNormalizeAsTorchvision) {
  std::vector<uint8_t> bytes(2 * 256);
  for (int v = 0; v < 256; ++v) bytes[v] = bytes[256 + v] = static_cast<uint8_t>(v);
  const Tensor image = tensor<uint8_t>(bytes, {2, 16, 16});
  const std::vector<float> mean = {0.4914f, 0.4822f}, stddev = {0.2470f, 0.2435f};
  const Tensor out = run(data::compose(data::ToFloat(), data::Normalize(mean, stddev)), image);
  const std::vector<float> values = out.to_vector<float>();
  for (int c = 0; c < 2; ++c)
    for (int v = 0; v < 256; ++v) {
      // torchvision: img.float().div(255), then tensor.sub_(mean).div_(std), all in float32.
      const float expected = (static_cast<float>(v) / 255.0f - mean[c]) / stddev[c];
      ASSERT_EQ(values[c * 256 + v], expected) << c << " " << v;
    }
  EXPECT_NEAR(values[128], (128 / 255.0 - 0.4914) / 0.2470, 1e-6);
  // Raw values without ToFloat; ToFloat alone is / 255.
  EXPECT_TRUE(test::tensors_close(run(data::Pipeline(), image), image.to(kFloat32)));
  EXPECT_FLOAT_EQ(run(data::compose(data::ToFloat()), image).to_vector<float>()[51], 0.2f);
  // One mean and std apply to every channel.
  const Tensor single = run(data::compose(data::ToFloat(), data::Normalize({0.5f}, {0.5f})), image);
  EXPECT_EQ(single.to_vector<float>()[256 + 255], 1.0f);
  EXPECT_EQ(single.to_vector<float>()[0], -1.0f);
}

TEST(Transforms, CifarPipelineIsAFunctionOfSeedEpochAndIndex) {
  const auto pipeline =
      data::compose(data::RandomCrop(32, 4), data::RandomHorizontalFlip(), data::ToFloat(),
                    data::Normalize({0.49f, 0.48f, 0.45f}, {0.25f, 0.24f, 0.26f}));
  manual_seed(3);
  const Tensor image = randint(0, 256, {3, 32, 32}, kUInt8);
  int epoch_differs = 0, seed_differs = 0;
  for (int64_t index = 0; index < 20; ++index) {
    const Tensor a = run(pipeline, image, 4, index);
    EXPECT_EQ(a.sizes(), (Shape{3, 32, 32}));
    EXPECT_EQ(a.to_vector<float>(), run(pipeline, image, 4, index).to_vector<float>());
    epoch_differs += a.to_vector<float>() != run(pipeline, image, 5, index).to_vector<float>();
    seed_differs += a.to_vector<float>() != run(pipeline, image, 4, index, 9).to_vector<float>();
  }
  EXPECT_GE(epoch_differs, 18);
  EXPECT_GE(seed_differs, 18);
  EXPECT_EQ(pipeline.repr(),
            "Pipeline(RandomCrop(size=[32, 32], padding=4), RandomHorizontalFlip(p=0.5), "
            "ToFloat(), Normalize(mean=[0.49, 0.48, 0.45], std=[0.25, 0.24, 0.26]))");
  // The float output of a transposed (non-contiguous) image equals that of its copy.
  const Tensor transposed = image.transpose(1, 2);
  EXPECT_EQ(run(pipeline, transposed, 1, 1).to_vector<float>(),
            run(pipeline, transposed.contiguous(), 1, 1).to_vector<float>());
}

TEST(Transforms, PipelineErrors) {
  EXPECT_LOOM_ERROR(data::compose(data::ToFloat(), data::RandomHorizontalFlip()), ValueError,
                    {"RandomHorizontalFlip", "after ToFloat()"});
  EXPECT_LOOM_ERROR(
      data::compose(data::Normalize({1, 2, 3}, {1, 1, 1}), data::Normalize({1, 2}, {1, 1})),
      ValueError, {"Normalize", "2 channels", "3"});
  const auto three = data::compose(data::ToFloat(), data::Normalize({1, 2, 3}, {1, 1, 1}));
  EXPECT_LOOM_ERROR(three.output_shape({1, 28, 28}), ShapeError,
                    {"Normalize(mean=[1, 2, 3]", "3 channels", "[1, 28, 28]"});
  EXPECT_LOOM_ERROR(run(three, ramp(1, 4, 4)), ShapeError, {"3 channels", "[1, 4, 4]"});
  EXPECT_LOOM_ERROR(three.output_shape({28, 28}), ShapeError, {"[C, H, W]", "[28, 28]"});
  EXPECT_LOOM_ERROR(data::Normalize({1, 2}, {1}), ValueError, {"Normalize"});
  EXPECT_LOOM_ERROR(data::Normalize({1}, {0}), ValueError, {"zero"});
  EXPECT_LOOM_ERROR(run(three, zeros({3, 4, 4})), ValueError, {"uint8", "[3, 4, 4]"});
  EXPECT_LOOM_ERROR(data::RandomCrop(0), ValueError, {"RandomCrop"});
}

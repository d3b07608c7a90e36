// tests/data/dataset_test.cpp — the datasets: CIFAR-10 batch files and image folders written by
// the test (and every malformed case, whose message must name the file), Fashion-MNIST where
// Debian's package is installed, Synthetic and TensorDataset.

#include "data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "data/cifar10.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/synthetic.h"
#include "scratch_dir.h"
#include "test_util.h"

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

using namespace loom;
namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

// Pixel c, y, x of CIFAR record r in file f, and its label.
uint8_t cifar_pixel(int f, int r, int c, int y, int x) {
  return static_cast<uint8_t>(f * 37 + r * 11 + c * 5 + y * 3 + x);
}
uint8_t cifar_label(int f, int r) { return static_cast<uint8_t>((f * 3 + r) % 10); }

std::vector<uint8_t> cifar_file(int f, int records) {
  std::vector<uint8_t> bytes;
  for (int r = 0; r < records; ++r) {
    bytes.push_back(cifar_label(f, r));
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 32; ++x) bytes.push_back(cifar_pixel(f, r, c, y, x));
  }
  return bytes;
}

// The five training files and the test file, `records` records each, written into `dir`.
fs::path cifar_dir(const fs::path& dir, int records) {
  for (int f = 1; f <= 5; ++f)
    write_file(dir / ("data_batch_" + std::to_string(f) + ".bin"), cifar_file(f, records));
  write_file(dir / "test_batch.bin", cifar_file(0, records));
  return dir;
}

// A w x h PNG whose pixel (y, x) channel c is base + 10 y + 3 x + c.
void write_png(const fs::path& path, int w, int h, int channels, int base) {
  std::vector<uint8_t> pixels;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c)
        pixels.push_back(static_cast<uint8_t>(base + 10 * y + 3 * x + c));
  ASSERT_TRUE(stbi_write_png(path.c_str(), w, h, channels, pixels.data(), w * channels));
}

}  // namespace

TEST(Cifar10, ReadsRecordsInFileOrder) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = cifar_dir(scratch.path(), 3);
  data::Cifar10 train(dir.string(), /*train=*/true, /*records_per_file=*/3);
  EXPECT_EQ(train.size(), 15);
  EXPECT_EQ(train.image_shape(), (Shape{3, 32, 32}));
  EXPECT_EQ(train.num_classes(), 10);
  for (int f = 1; f <= 5; ++f) {
    for (int r = 0; r < 3; ++r) {
      const data::Example example = train.get((f - 1) * 3 + r);
      EXPECT_EQ(example.label, cifar_label(f, r));
      ASSERT_EQ(example.image.sizes(), (Shape{3, 32, 32}));
      ASSERT_EQ(example.image.dtype(), kUInt8);
      const uint8_t* p = example.image.data_ptr<uint8_t>();
      for (int c : {0, 2})
        for (int y : {0, 17, 31})
          for (int x : {0, 5, 31}) EXPECT_EQ(p[(c * 32 + y) * 32 + x], cifar_pixel(f, r, c, y, x));
    }
  }
  data::Cifar10 test(dir.string(), /*train=*/false, 3);
  EXPECT_EQ(test.size(), 3);
  EXPECT_EQ(test.get(2).label, cifar_label(0, 2));
  EXPECT_LOOM_ERROR(test.get(3), IndexError, {"Cifar10", "index 3", "3 examples"});
  EXPECT_LOOM_ERROR(test.get(-1), IndexError, {"index -1"});
}

TEST(Cifar10, FindsTheArchiveFolder) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = scratch.path();
  fs::create_directories(dir / "cifar-10-batches-bin");
  write_file(dir / "cifar-10-batches-bin" / "test_batch.bin", cifar_file(0, 2));
  EXPECT_EQ(data::Cifar10(dir.string(), false, 2).size(), 2);
}

TEST(Cifar10, BadFilesRaiseIOErrorNamingThePath) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = cifar_dir(scratch.path(), 2);
  // The real files have 10000 records: 30,730,000 bytes each.
  const std::string test_path = (dir / "test_batch.bin").string();
  EXPECT_LOOM_ERROR(data::Cifar10(dir.string(), false), IOError,
                    {test_path, "expected 30730000 bytes", "got 6146 bytes"});
  fs::remove(dir / "data_batch_3.bin");
  EXPECT_LOOM_ERROR(data::Cifar10(dir.string(), true, 2), IOError,
                    {(dir / "data_batch_3.bin").string(), "no such file"});
  std::vector<uint8_t> bytes = cifar_file(0, 2);
  bytes.pop_back();
  write_file(dir / "test_batch.bin", bytes);
  EXPECT_LOOM_ERROR(data::Cifar10(dir.string(), false, 2), IOError,
                    {test_path, "expected 6146 bytes", "got 6145 bytes"});
  bytes = cifar_file(0, 2);
  bytes[3073] = 10;  // record 1's label
  write_file(dir / "test_batch.bin", bytes);
  EXPECT_LOOM_ERROR(data::Cifar10(dir.string(), false, 2), IOError,
                    {test_path, "record 1", "label 10"});
  EXPECT_LOOM_ERROR(data::Cifar10("/nonexistent/cifar", false), IOError,
                    {"/nonexistent/cifar/test_batch.bin"});
}

TEST(FashionMnist, FromDebian) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  data::FashionMnist test(dir, /*train=*/false);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(test.image_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(test.num_classes(), 10);
  const auto raw = data::read_mnist(dir, false);
  for (int64_t i : {0, 1234, 9999}) {
    const data::Example example = test.get(i);
    EXPECT_EQ(example.label, raw.labels.data_ptr<int64_t>()[i]);
    EXPECT_EQ(example.image.sizes(), (Shape{1, 28, 28}));
    EXPECT_EQ(example.image.to_vector<int>(), raw.images.select(0, i).to_vector<int>());
  }
  EXPECT_LOOM_ERROR(data::FashionMnist("/nonexistent", true), IOError, {"/nonexistent"});
}

TEST(ImageFolder, ClassesInSortedOrderAndPixelsAsCHW) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = scratch.path();
  for (const char* name : {"dog", "cat", ".hidden"}) fs::create_directories(dir / name);
  write_png(dir / "dog" / "b.png", 4, 3, 3, 0);
  write_png(dir / "dog" / "a.png", 4, 3, 3, 100);
  write_png(dir / "cat" / "z.png", 4, 3, 3, 50);
  write_png(dir / ".hidden" / "x.png", 4, 3, 3, 0);
  write_file(dir / "dog" / "notes.txt", {1, 2, 3});  // not an image: skipped
  write_file(dir / "README", {1});                   // not a class folder

  data::ImageFolder folder(dir.string());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(folder.num_classes(), 2);
  EXPECT_EQ(folder.size(), 3);
  EXPECT_EQ(folder.image_shape(), (Shape{3, 3, 4}));
  EXPECT_EQ(folder.files()[1], (dir / "dog" / "a.png").string());
  const int bases[] = {50, 100, 0};
  const int64_t labels[] = {0, 1, 1};
  for (int i = 0; i < 3; ++i) {
    const data::Example example = folder.get(i);
    EXPECT_EQ(example.label, labels[i]);
    const uint8_t* p = example.image.data_ptr<uint8_t>();
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 3; ++y)
        for (int x = 0; x < 4; ++x)
          ASSERT_EQ(p[(c * 3 + y) * 4 + x], bases[i] + 10 * y + 3 * x + c) << i;
  }
  // Forced to one channel: stb's luma of each pixel.
  data::ImageFolder grey(dir.string(), /*channels=*/1);
  EXPECT_EQ(grey.image_shape(), (Shape{1, 3, 4}));
}

TEST(ImageFolder, DecodesJpeg) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = scratch.path();
  fs::create_directories(dir / "only");
  std::vector<uint8_t> pixels(8 * 6 * 3, 128);
  ASSERT_TRUE(stbi_write_jpg((dir / "only" / "a.JPG").c_str(), 8, 6, 3, pixels.data(), 95));
  data::ImageFolder folder(dir.string());
  EXPECT_EQ(folder.image_shape(), (Shape{3, 6, 8}));
  EXPECT_NEAR(folder.get(0).image.to_vector<double>()[20], 128, 2);
}

// A progressive JPEG (cjpeg -progressive) decodes, though its first scan names an AC table that
// the file defines only later: a first DC scan uses only the DC tables.
TEST(ImageFolder, DecodesProgressiveJpeg) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = scratch.path();
  fs::create_directories(dir / "only");
  fs::copy_file(fs::path(LOOM_SOURCE_DIR) / "fuzz" / "corpus" / "image" / "progressive.jpg",
                dir / "only" / "p.jpg");
  data::ImageFolder folder(dir.string());
  ASSERT_EQ(folder.image_shape(), (Shape{3, 8, 16}));
  // The picture cjpeg was given: (16x + 7y + 60c) mod 256 at column x, row y, channel c.
  const std::vector<double> image = folder.get(0).image.to_vector<double>();
  EXPECT_NEAR(image[(0 * 8 + 2) * 16 + 3], (16 * 3 + 7 * 2) % 256, 12);
  EXPECT_NEAR(image[(1 * 8 + 5) * 16 + 4], (16 * 4 + 7 * 5 + 60) % 256, 12);
}

// Note [Decoding untrusted images]: a scan that names a Huffman table the file never defines is
// refused (stb 2.27 would decode with the table's uninitialised memory). Here the AC table 0 of
// a baseline JPEG is relabelled as a second DC table 0.
TEST(ImageFolder, JpegScanWithAnUndefinedHuffmanTableIsRefused) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = scratch.path();
  fs::create_directories(dir / "only");
  std::vector<uint8_t> pixels(8 * 6 * 3, 128);
  ASSERT_TRUE(stbi_write_jpg((dir / "only" / "a.jpg").c_str(), 8, 6, 3, pixels.data(), 95));
  std::ifstream in(dir / "only" / "a.jpg", std::ios::binary);
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
  in.close();
  // stb's writer puts the four tables in one DHT segment: DC 0 (12 codes), AC 0, DC 1, AC 1.
  const std::vector<uint8_t> dht = {0xFF, 0xC4};
  const auto segment = std::search(bytes.begin(), bytes.end(), dht.begin(), dht.end());
  ASSERT_NE(segment, bytes.end());
  const auto ac0 = segment + 4 + 17 + 12;
  ASSERT_EQ(*ac0, 0x10);
  *ac0 = 0x00;
  write_file(dir / "only" / "a.jpg", bytes);
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError,
                    {(dir / "only" / "a.jpg").string(), "Huffman table the file does not define"});
}

// Note [Decoding untrusted images]: stb meets an empty IDAT chunk before any data with
// memcpy(NULL, ..., 0); ImageFolder takes such chunks out, and the image decodes as without them.
// A chunk longer than the file is refused.
// (The undefined behaviour itself shows only under UBSan:
// fuzz/corpus/image/regression-png-empty-idat.png.)
TEST(ImageFolder, PngDataChunksEmptyOrPastTheEnd) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = scratch.path();
  fs::create_directories(dir / "a");
  write_png(dir / "a" / "1.png", 4, 3, 3, 7);
  const std::vector<int> pixels = data::ImageFolder(dir.string()).get(0).image.to_vector<int>();

  std::ifstream in(dir / "a" / "1.png", std::ios::binary);
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
  const std::vector<uint8_t> empty_idat = {0, 0, 0, 0, 'I', 'D', 'A', 'T', 1, 2, 3, 4};
  constexpr size_t kAfterHeader = 8 + 12 + 13;  // the signature, then IHDR's 13 bytes
  ASSERT_GT(bytes.size(), kAfterHeader);
  std::vector<uint8_t> padded(bytes.begin(), bytes.begin() + kAfterHeader);
  padded.insert(padded.end(), empty_idat.begin(), empty_idat.end());
  padded.insert(padded.end(), empty_idat.begin(), empty_idat.end());
  padded.insert(padded.end(), bytes.begin() + kAfterHeader, bytes.end());
  write_file(dir / "a" / "1.png", padded);
  EXPECT_EQ(data::ImageFolder(dir.string()).get(0).image.to_vector<int>(), pixels);

  // Only empty data chunks: no data at all.
  std::vector<uint8_t> no_data(bytes.begin(), bytes.begin() + kAfterHeader);
  no_data.insert(no_data.end(), empty_idat.begin(), empty_idat.end());
  no_data.insert(no_data.end(), bytes.end() - 12, bytes.end());  // IEND
  write_file(dir / "a" / "1.png", no_data);
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError,
                    {(dir / "a" / "1.png").string(), "cannot decode"});

  // A data chunk that claims 2 GiB of a short file is refused before stb allocates for it.
  std::vector<uint8_t> overlong(bytes.begin(), bytes.begin() + kAfterHeader);
  overlong.insert(overlong.end(), {0x7F, 0xFF, 0xFF, 0xFF, 'I', 'D', 'A', 'T', 1, 2, 3});
  write_file(dir / "a" / "1.png", overlong);
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError,
                    {(dir / "a" / "1.png").string(), "data chunk runs past the end"});
}

// Note [Decoding untrusted images]: a header that claims more than 2^26 pixels is refused before
// stb allocates them; a BMP stored top-down gives its height negative, and counts as well.
TEST(ImageFolder, HeaderOverThePixelLimitIsRefused) {
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = scratch.path();
  fs::create_directories(dir / "a");
  const auto le32 = [](std::vector<uint8_t>& out, int32_t v) {
    for (int i = 0; i < 4; ++i)
      out.push_back(static_cast<uint8_t>(static_cast<uint32_t>(v) >> (8 * i)));
  };
  for (const int32_t height : {8193, -8193}) {
    // BITMAPFILEHEADER and BITMAPINFOHEADER of a 24-bit 8192 x |height| image, without pixels.
    std::vector<uint8_t> bmp = {'B', 'M'};
    le32(bmp, 54);  // file size (stb does not read it)
    le32(bmp, 0);
    le32(bmp, 54);  // where the pixels start
    le32(bmp, 40);  // the info header's size
    le32(bmp, 8192);
    le32(bmp, height);
    bmp.insert(bmp.end(), {1, 0, 24, 0});  // planes, bits per pixel
    for (int i = 0; i < 6; ++i) le32(bmp, 0);
    write_file(dir / "a" / "big.bmp", bmp);
    EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError,
                      {(dir / "a" / "big.bmp").string(), "8192 x 8193 pixels, over the limit"});
  }
}

TEST(ImageFolder, BadFoldersRaiseIOErrorNamingThePath) {
  EXPECT_LOOM_ERROR(data::ImageFolder("/nonexistent/folder"), IOError,
                    {"/nonexistent/folder", "no such directory"});
  const test::ScratchDir scratch;  // Note [Test scratch directories]
  const fs::path dir = scratch.path();
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError, {dir.string(), "no class folders"});
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  write_png(dir / "a" / "1.png", 4, 3, 3, 0);
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError, {(dir / "b").string(), "no images"});
  write_png(dir / "b" / "1.png", 5, 3, 3, 0);
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError,
                    {(dir / "b" / "1.png").string(), "[3, 3, 5]", "[3, 3, 4]"});
  write_png(dir / "b" / "1.png", 4, 3, 1, 0);  // grey: converting makes it fit
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError, {"[1, 3, 4]", "channels"});
  EXPECT_EQ(data::ImageFolder(dir.string(), 3).size(), 2);
  write_file(dir / "b" / "1.png", {0x89, 'P', 'N', 'G', 1, 2, 3, 4});
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string()), IOError,
                    {(dir / "b" / "1.png").string(), "cannot decode"});
  EXPECT_LOOM_ERROR(data::ImageFolder(dir.string(), 7), ValueError, {"channels"});
}

TEST(Synthetic, DeterministicFromTheSeed) {
  data::Synthetic a(50, {3, 8, 6}, 10, 7), b(50, {3, 8, 6}, 10, 7), c(50, {3, 8, 6}, 10, 8);
  EXPECT_EQ(a.size(), 50);
  EXPECT_EQ(a.image_shape(), (Shape{3, 8, 6}));
  EXPECT_EQ(a.images().to_vector<int>(), b.images().to_vector<int>());
  EXPECT_EQ(a.labels().to_vector<int64_t>(), b.labels().to_vector<int64_t>());
  EXPECT_NE(a.images().to_vector<int>(), c.images().to_vector<int>());
  std::vector<int> seen(10);
  for (int64_t label : a.labels().to_vector<int64_t>()) {
    ASSERT_TRUE(label >= 0 && label < 10);
    seen[label] = 1;
  }
  EXPECT_GE(std::count(seen.begin(), seen.end(), 1), 8);
  // Bytes spread over [0, 256).
  const auto pixels = a.images().to_vector<double>();
  const double mean = std::accumulate(pixels.begin(), pixels.end(), 0.0) / pixels.size();
  EXPECT_NEAR(mean, 127.5, 6);
  EXPECT_LOOM_ERROR(data::Synthetic(5, {8, 6}, 10), ShapeError, {"Synthetic", "[8, 6]"});
  EXPECT_LOOM_ERROR(data::Synthetic(5, {1, 8, 6}, 0), ValueError, {"num_classes"});
}

TEST(TensorDataset, ValidatesItsTensors) {
  Tensor images = zeros({4, 1, 2, 2}, kUInt8);
  data::TensorDataset ok(images, tensor<int64_t>({0, 1, 2, 1}), 3);
  EXPECT_EQ(ok.get(2).label, 2);
  EXPECT_TRUE(ok.get(3).image.is_alias_of(ok.images()));
  EXPECT_LOOM_ERROR(data::TensorDataset(images, tensor<int64_t>({0, 1, 3, 1}), 3), ValueError,
                    {"label 3", "example 2", "[0, 3)"});
  EXPECT_LOOM_ERROR(data::TensorDataset(zeros({4, 1, 2, 2}), tensor<int64_t>({0, 1, 2, 1}), 3),
                    DTypeError, {"uint8"});
  EXPECT_LOOM_ERROR(data::TensorDataset(images, tensor<int64_t>({0, 1, 2}), 3), ShapeError,
                    {"[4, 1, 2, 2]", "[3]"});
}

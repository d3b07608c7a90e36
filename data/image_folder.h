// data/image_folder.h — torchvision's ImageFolder layout: one sub-folder per class under a root,
// class indices in sorted name order, images (PNG, JPEG, BMP, GIF, TGA, PNM) decoded with
// stb_image into one uint8 tensor [N, C, H, W] held in memory.
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"

namespace loom::data {

class ImageFolder : public TensorDataset {
 public:
  // `channels` 0 keeps each file's channel count (all files must agree); 1, 2, 3 or 4 converts
  // every image to grey, grey + alpha, RGB or RGBA. All images must have the same size.
  // IOError naming the path for a missing root, a class folder without images, a file that does
  // not decode, or an image whose [C, H, W] differs from the first one's.
  explicit ImageFolder(const std::string& dir, int channels = 0);

  const std::vector<std::string>& classes() const { return classes_; }  // index -> folder name
  const std::vector<std::string>& files() const { return files_; }      // example -> its path

 private:
  struct Loaded;
  static Loaded load(const std::string& dir, int channels);
  explicit ImageFolder(Loaded loaded);
  std::vector<std::string> classes_;
  std::vector<std::string> files_;
};

}  // namespace loom::data

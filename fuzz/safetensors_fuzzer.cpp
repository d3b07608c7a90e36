// fuzz/safetensors_fuzzer.cpp — load_safetensors (tensor/safetensors.h) on arbitrary bytes: the
// 8-byte header length, the JSON header (dtypes, shapes, data_offsets, __metadata__) and the data
// buffer. What loads must save and load again to the same names, dtypes, shapes, bytes and
// metadata.

#include <cstring>
#include <map>

#include "fuzz/fuzz_util.h"
#include "tensor/safetensors.h"

namespace {

using loom::SafetensorsFile;

// name -> (dtype, shape, bytes): the file's content, whatever order its tensors come in.
using Content = std::map<std::string, std::tuple<loom::DType, loom::Shape, std::string>>;

Content content_of(const SafetensorsFile& file) {
  Content content;
  for (const auto& [name, tensor] : file.tensors) {
    // Dense unless empty: is_contiguous() is false for an empty [2, 0] (its strides [1, 1]).
    loom::fuzz::require(tensor.is_cpu() && (tensor.is_contiguous() || tensor.numel() == 0),
                        "a loaded tensor is dense");
    const auto* bytes = static_cast<const char*>(tensor.data());
    content[name] = {tensor.dtype(), tensor.sizes(), std::string(bytes, bytes + tensor.nbytes())};
  }
  return content;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir dir("safetensors");
  const std::string path = dir.write("input.safetensors", loom::fuzz::as_text(data, size));
  loom::fuzz::refusal_is_a_loom_error([&] {
    const SafetensorsFile file = loom::load_safetensors(path);
    const Content content = content_of(file);
    loom::fuzz::require(content.size() == file.tensors.size(), "tensor names are unique");
    // Names and metadata that are not UTF-8 load (the Python package would refuse them) but do
    // not save: save_safetensors raises ValueError for them, which ends this input here.
    const std::string copy = (dir.path() / "copy.safetensors").string();
    loom::save_safetensors(copy, file.tensors, file.metadata);
    const SafetensorsFile again = loom::load_safetensors(copy);
    loom::fuzz::require(content_of(again) == content, "save then load keeps every tensor");
    loom::fuzz::require(again.metadata == file.metadata, "save then load keeps the metadata");
  });
  return 0;
}

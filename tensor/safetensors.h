// tensor/safetensors.h — reading and writing safetensors files, the format loom shares weights,
// optimizer state and test fixtures in with PyTorch (DESIGN.md decision 8). Loads validate every
// field, offset and size before touching data; saves are atomic (temp file, fsync, rename).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom {

// Tensors with their names, in order. A vector rather than a map so that a save writes the
// tensors in the order the caller gives and a load keeps the order of the file.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;                         // ordered by where their data lies in the file
  std::map<std::string, std::string> metadata;  // the header's "__metadata__" (may be empty)

  bool contains(const std::string& name) const;
  // The tensor of that name; ValueError (naming the tensors the file has) when absent.
  const Tensor& at(const std::string& name) const;
};

// Reads a whole file into fresh contiguous CPU tensors. Every malformed header, offset or size
// raises IOError naming the file and what is wrong; nothing is read out of bounds. Accepted
// dtypes: F64 F32 F16 BF16 I64 I32 U8 BOOL. Keys of a tensor entry other than dtype, shape and
// data_offsets are ignored; gaps between tensors' data are allowed, overlaps are not.
SafetensorsFile load_safetensors(const std::string& path);

// Writes the tensors in the given order, each made contiguous (a device tensor is copied to the
// host first, one at a time), with the metadata. Names must be unique and not "__metadata__"
// (ValueError). The header is padded with spaces to a multiple of 8 bytes, as the Python package
// does. Atomic: the bytes go to a temporary file in the target's directory, which is fsynced and
// renamed over the target, then the directory is fsynced. On failure (IOError) the target is
// untouched and the temporary file removed.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace loom

// data/sha256.h — SHA-256 (FIPS 180-4) as lowercase hex, so that a checkpoint can record which
// tokenizer files (data/bpe_tokenizer.h) it was trained with and a later run can tell whether
// the files at hand are the same ones.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace loom::data {

// The 64 hex digits of SHA-256 over `bytes`; sha256_hex("abc") = "ba7816bf...f20015ad".
std::string sha256_hex(std::string_view bytes);
// The same over the bytes of the file at `path`, read in chunks; IOError naming the file when it
// cannot be opened or read.
std::string sha256_file_hex(const std::filesystem::path& path);

}  // namespace loom::data

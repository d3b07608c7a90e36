// tests/data/sha256_test.cpp — data::sha256_hex against the test vectors of FIPS 180-4's
// examples (NIST's "SHA256.pdf": "abc", the 448-bit two-block message, a million 'a'), the empty
// message, inputs around the 55/56/64-byte padding edges (against digests from Python's
// hashlib), and sha256_file_hex on a file written here, chunked or not, with its errors.

#include "data/sha256.h"

#include <gtest/gtest.h>

#include <fstream>

#include "scratch_dir.h"
#include "test_util.h"

namespace loom::data {
namespace {

TEST(Sha256, TheStandardTestVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, ThePaddingEdges) {
  // hashlib.sha256(b"a" * n).hexdigest(): 55 bytes pad in one block, 56 need a second, 64 is
  // one whole block and a block of padding.
  EXPECT_EQ(sha256_hex(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, AFileHashesAsItsBytes) {
  test::ScratchDir dir("sha256");
  std::string bytes;
  for (int i = 0; i < 200000; ++i) bytes.push_back(static_cast<char>((i * 7 + i / 251) & 0xff));
  const std::string path = dir.file("data.bin");
  std::ofstream(path, std::ios::binary) << bytes;  // more than one 64 KiB chunk, with odd bytes
  // hashlib.sha256(bytes((i * 7 + i // 251) & 0xff for i in range(200000))).hexdigest()
  const std::string expected = "e870fec3223bac8f6147b08b31e6e6e4bb9abd783820bcd212b7737af6a02174";
  EXPECT_EQ(sha256_file_hex(path), expected);
  EXPECT_EQ(sha256_hex(bytes), expected);
  std::ofstream(dir.file("empty"), std::ios::binary).flush();
  EXPECT_EQ(sha256_file_hex(dir.file("empty")), sha256_hex(""));
  EXPECT_LOOM_ERROR(sha256_file_hex(dir.file("missing.json")), IOError,
                    {"sha256_file_hex", "missing.json", "cannot open"});
  EXPECT_LOOM_ERROR(sha256_file_hex(dir.path()), IOError, {"is a folder"});
}

}  // namespace
}  // namespace loom::data

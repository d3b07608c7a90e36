// data/sha256.cpp — data/sha256.h: FIPS 180-4, section 6.2 (the message schedule W, the eight
// working variables a..h, 64 rounds per 512-bit block) and 5.1.1 (padding).

#include "data/sha256.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "tensor/error.h"

namespace loom::data {

namespace {

// FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64
// primes.
constexpr std::array<uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// FIPS 180-4 5.3.3: the first 32 bits of the fractional parts of the square roots of the first
// 8 primes.
constexpr std::array<uint32_t, 8> kInitialHash = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// Bytes in, 64 at a time; finish() pads (a 1 bit, zeros, the length in bits as 64-bit big
// endian, to a multiple of 512 bits) and returns the digest as hex.
class Sha256 {
 public:
  void update(const unsigned char* bytes, size_t size) {
    total_bytes_ += size;
    if (buffered_ > 0) {
      const size_t take = std::min(size, kBlockBytes - buffered_);
      std::memcpy(buffer_.data() + buffered_, bytes, take);
      buffered_ += take;
      bytes += take;
      size -= take;
      if (buffered_ < kBlockBytes) return;
      compress(buffer_.data());
      buffered_ = 0;
    }
    for (; size >= kBlockBytes; bytes += kBlockBytes, size -= kBlockBytes) compress(bytes);
    std::memcpy(buffer_.data(), bytes, size);
    buffered_ = size;
  }

  std::string finish() {
    const uint64_t bit_length = total_bytes_ * 8;
    const unsigned char one_bit = 0x80, zero = 0;
    update(&one_bit, 1);
    while (buffered_ != kBlockBytes - 8) update(&zero, 1);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(bit_length >> (56 - 8 * i));
    update(length, 8);
    std::string hex(64, '0');
    for (size_t i = 0; i < hash_.size(); ++i)
      std::snprintf(hex.data() + 8 * i, 9, "%08x", hash_[i]);  // 8 digits and the '\0' it ends on
    return hex;
  }

 private:
  static constexpr size_t kBlockBytes = 64;

  // FIPS 180-4 6.2.2, one 512-bit block.
  void compress(const unsigned char* block) {
    std::array<uint32_t, 64> w;  // the message schedule
    for (int t = 0; t < 16; ++t)
      w[t] = (uint32_t{block[4 * t]} << 24) | (uint32_t{block[4 * t + 1]} << 16) |
             (uint32_t{block[4 * t + 2]} << 8) | uint32_t{block[4 * t + 3]};
    for (int t = 16; t < 64; ++t) {
      const uint32_t sigma0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t sigma1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = sigma1 + w[t - 7] + sigma0 + w[t - 16];
    }
    uint32_t a = hash_[0], b = hash_[1], c = hash_[2], d = hash_[3];
    uint32_t e = hash_[4], f = hash_[5], g = hash_[6], h = hash_[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t big_sigma1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const uint32_t choose = (e & f) ^ (~e & g);
      const uint32_t t1 = h + big_sigma1 + choose + kRoundConstants[t] + w[t];
      const uint32_t big_sigma0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = big_sigma0 + majority;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    hash_[0] += a, hash_[1] += b, hash_[2] += c, hash_[3] += d;
    hash_[4] += e, hash_[5] += f, hash_[6] += g, hash_[7] += h;
  }

  std::array<uint32_t, 8> hash_ = kInitialHash;
  std::array<unsigned char, kBlockBytes> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  Sha256 sha;
  sha.update(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return sha.finish();
}

std::string sha256_file_hex(const std::filesystem::path& path) {
  std::error_code ec;
  LOOM_CHECK(!std::filesystem::is_directory(path, ec), IOError, "sha256_file_hex: ", path.string(),
             " is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), IOError, "sha256_file_hex: cannot open ", path.string());
  Sha256 sha;
  std::vector<char> chunk(1 << 16);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    sha.update(reinterpret_cast<const unsigned char*>(chunk.data()),
               static_cast<size_t>(in.gcount()));
  }
  LOOM_CHECK(!in.bad(), IOError, "sha256_file_hex: cannot read ", path.string());
  return sha.finish();
}

}  // namespace loom::data

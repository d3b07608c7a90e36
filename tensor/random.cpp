// tensor/random.cpp — Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11): ten rounds of two 32x32->64 multiplies and a key schedule (Weyl sequence).

#include "tensor/random.h"

namespace loom {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter, uint64_t subsequence) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                   static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32)};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c[0] = hi1 ^ c[1] ^ k0;
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k1;
    c[3] = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c[0], c[1], c[2], c[3]};
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}
uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}
uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return offset_;
}
uint64_t Generator::reserve(uint64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t first = offset_;
  offset_ += count;
  return first;
}
Generator::State Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {seed_, offset_};
}
void Generator::set_state(State s) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = s.seed;
  offset_ = s.offset;
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace loom

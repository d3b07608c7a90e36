// tensor/random.cpp — Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11): ten rounds of two 32x32->64 multiplies and a key schedule (Weyl sequence).

#include "tensor/random.h"

#include "tensor/philox.h"

namespace loom {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter, uint64_t subsequence) {
  const philox::Lanes r = philox::philox4x32(seed, counter, subsequence);  // tensor/philox.h
  return {r[0], r[1], r[2], r[3]};
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

// tensor/random.h — loom's one random number generator: Philox4x32-10, counter-based.
// A (seed, counter) pair fully determines four 32-bit outputs, so element i of a random tensor
// can be computed on its own, by any thread (or, later, any CUDA thread) in any order, and the
// same seed gives the same numbers whatever the thread count. Each draw advances the
// generator's offset past the counters it used. See Note [Philox streams].
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "tensor/philox.h"

namespace loom {

// Note [Philox streams]
// A generator holds (seed, offset). A tensor of n uniforms uses the counters offset ..
// offset + ceil(n/4) - 1, element i taking lane i%4 of counter offset + i/4; normals take two
// lanes each (Box-Muller), element i using counter offset + i/2. The offset then moves past the
// counters used. Dropout and augmentations derive their own (seed, counter) the same way.
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter, uint64_t subsequence = 0);

// A uniform float in [0, 1) from 24 random bits; a double in [0, 1) from 53. (One definition
// for host and device code: tensor/philox.h.)
inline float uniform_float(uint32_t bits) { return philox::uniform_float(bits); }
inline double uniform_double(uint32_t hi, uint32_t lo) { return philox::uniform_double(hi, lo); }

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) : seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  uint64_t offset() const;
  // Reserves `count` counters and returns the first; thread-safe.
  uint64_t reserve(uint64_t count);
  // The whole state, for checkpoints.
  struct State {
    uint64_t seed;
    uint64_t offset;
  };
  State state() const;
  void set_state(State s);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator();
void manual_seed(uint64_t seed);  // seeds the default generator

}  // namespace loom

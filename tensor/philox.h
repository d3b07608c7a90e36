// tensor/philox.h — Philox4x32-10 and the maps from its 32-bit lanes to numbers, written once for
// the host and for CUDA device code, so a CPU kernel and a CUDA kernel given one (seed, counter)
// produce the same bits (Note [Philox streams] in tensor/random.h). Header-only, no CUDA header.
#pragma once

#include <cmath>
#include <cstdint>

// Its own name, undefined at the end: float16.h's LOOM_HOST_DEVICE adds inline and
// __forceinline__, and one file may include both headers.
#ifdef __CUDACC__
#define LOOM_PHILOX_FN __host__ __device__
#else
#define LOOM_PHILOX_FN
#endif

namespace loom::philox {

// The four 32-bit outputs of one Philox evaluation (a plain struct: std::array is not usable
// in device code).
struct Lanes {
  uint32_t lane[4];
  LOOM_PHILOX_FN uint32_t operator[](int i) const { return lane[i]; }
};

// Philox4x32-10 (Salmon et al., SC'11): the 128-bit counter is (counter, subsequence), low words
// first; the 64-bit key is the seed. Ten rounds of two 32x32->64 multiplies, the key bumped by a
// Weyl sequence after each round. Exactly loom::philox4x32 of tensor/random.cpp.
LOOM_PHILOX_FN inline Lanes philox4x32(uint64_t seed, uint64_t counter, uint64_t subsequence = 0) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(subsequence), c3 = static_cast<uint32_t>(subsequence >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Lanes{{c0, c1, c2, c3}};
}

// A uniform float in [0, 1) from the top 24 bits of a lane; a double in [0, 1) from 53 bits
// (all 32 of hi above the top 21 of lo). Both are exact on any IEEE machine: an integer below
// 2^24 (2^53) times a power of two.
LOOM_PHILOX_FN inline float uniform_float(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}
LOOM_PHILOX_FN inline double uniform_double(uint32_t hi, uint32_t lo) {
  return static_cast<double>((static_cast<uint64_t>(hi) << 21) ^ (lo >> 11)) *
         (1.0 / 9007199254740992.0);
}

// A standard normal from two lanes by Box-Muller, in double: u1 in (0, 1] (never log 0), u2 in
// [0, 1); the value is sqrt(-2 log u1) cos(2 pi u2). The arithmetic is the same on host and
// device (no expression here can be contracted into an FMA), but log and cos come from each
// side's math library: glibc's and CUDA's may differ in the last bit (CUDA documents log within
// 1 ulp, cos within 2), so host and device agree to a few ulp in double, and almost always
// exactly once rounded to float.
LOOM_PHILOX_FN inline double box_muller(uint32_t a, uint32_t b) {
  constexpr double kPi = 3.14159265358979323846;
  const double u1 = (static_cast<double>(a) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
  const double u2 = static_cast<double>(b) * (1.0 / 4294967296.0);          // [0, 1)
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(2.0 * kPi * u2);
}

// An integer in [low, low + range) from 64 bits (a << 32 | b) modulo range (range > 0), as
// randint draws it.
LOOM_PHILOX_FN inline int64_t uniform_int(uint32_t a, uint32_t b, int64_t low, uint64_t range) {
  const uint64_t bits = (static_cast<uint64_t>(a) << 32) | b;
  return low + static_cast<int64_t>(bits % range);
}

}  // namespace loom::philox

#undef LOOM_PHILOX_FN

// tensor/cuda/random.h — the random factories' fills on a CUDA tensor: the same Philox lanes
// and the same maps as tensor/factory.cpp (rand, randn, randint), so a CUDA tensor drawn from
// (seed, first counter) holds the values the CPU draws from it (Note [Philox streams]).
// Host-only header.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace loom::cuda {

// t: a contiguous CUDA tensor. Element i takes lane i%4 of philox4x32(seed, first + i/4) through
// uniform_float, then low + (high - low) * u in double, cast to t's dtype (float32, float64).
// For (low, high) = (0, 1) this is rand() bit for bit. Uses ceil(n/4) counters.
void fill_uniform_(const Tensor& t, uint64_t seed, uint64_t first_counter, double low, double high);
// Element i: Box-Muller on lanes (0, 1) or (2, 3) of philox4x32(seed, first + i/2), then
// mean + std * z in double, cast to t's dtype (float32, float64). For (0, 1) this is randn()
// (see philox::box_muller on last-bit agreement). Uses ceil(n/2) counters.
void fill_normal_(const Tensor& t, uint64_t seed, uint64_t first_counter, double mean, double std);
// Element i: low + (lanes (0, 1) or (2, 3) of philox4x32(seed, first + i/2) as 64 bits) mod
// (high - low), cast to t's dtype (float32, float64, int64, int32, uint8), as randint(); needs
// low < high. Uses ceil(n/2) counters.
void fill_randint_(const Tensor& t, uint64_t seed, uint64_t first_counter, int64_t low,
                   int64_t high);

}  // namespace loom::cuda

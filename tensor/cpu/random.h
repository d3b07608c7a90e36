// tensor/cpu/random.h — the CPU loops behind the random factories (rand, randn, randint in
// tensor/factory.cpp, which reserve the Philox counters and switch on the device): fill a fresh
// tensor t on the CPU from counters first, first + 1, ... of stream `seed`.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace loom::cpu {

void fill_uniform_(const Tensor& t, uint64_t seed, uint64_t first);  // [0, 1); floating t
void fill_normal_(const Tensor& t, uint64_t seed, uint64_t first);   // N(0, 1); floating t
// [low, high) with low < high; a numeric t.
void fill_randint_(const Tensor& t, uint64_t seed, uint64_t first, int64_t low, int64_t high);

}  // namespace loom::cpu

// bench/machine.h — the line every benchmark prints first: figures from different machines, or
// from different instruction-set paths of one machine, do not compare.
#pragma once

#include <cstdio>
#include <string>

#include "tensor/cpu_info.h"

namespace loom::bench {

// "CPU: AMD EPYC 7B13 (AVX2 + FMA); loom's kernels: avx2 (LOOM_CPU_ISA caps them)".
inline void print_machine() {
  std::printf("CPU: %s (%s); loom's kernels: %s (LOOM_CPU_ISA caps them)\n",
              cpu_model_name().c_str(), cpu_vector_isa().c_str(),
              std::string(to_string(cpu_isa())).c_str());
}

}  // namespace loom::bench

// tensor/cpu_info.h — what CPU this is and what it can do: its name, the vector instructions it
// has (detected at run time, whatever the build's -march), and its float32 FMA peak measured on
// the spot, the denominator of a model-FLOPs utilisation (MFU). Benchmarks print the first two
// beside their figures, since figures from different machines do not compare.
#pragma once

#include <string>

namespace loom {

// /proc/cpuinfo's "model name" ("unknown CPU" where there is none).
std::string cpu_model_name();

// The vector instruction sets this CPU has and how wide: "AVX-512 (BF16, FP16, AMX-BF16)",
// "AVX2 + FMA", "SSE4.2" ...
std::string cpu_vector_isa();

// float32 GFLOP/s of `threads` threads each running independent FMA chains that never leave the
// registers (12 accumulators, the widest vectors this build compiles to): the cores' FMA
// throughput. Median of three samples of about 30 ms each. A machine whose other processes keep
// cores busy measures lower, as its kernels will run.
double fma_peak_gflops(int threads);

}  // namespace loom

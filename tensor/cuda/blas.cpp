// tensor/cuda/blas.cpp — the switches of tensor/cuda/blas.h. Compiled in every build:
// they are host flags that linalg.cu and conv.cu read at each call.

#include "tensor/cuda/blas.h"

#include <atomic>

namespace loom::cuda {

namespace {
std::atomic<bool> g_matmul_tf32{false};
std::atomic<bool> g_cudnn_tf32{true};
std::atomic<bool> g_cudnn_deterministic{true};
}  // namespace

void set_allow_tf32(bool allow) { g_matmul_tf32.store(allow); }
bool allow_tf32() { return g_matmul_tf32.load(); }
void set_cudnn_allow_tf32(bool allow) { g_cudnn_tf32.store(allow); }
bool cudnn_allow_tf32() { return g_cudnn_tf32.load(); }
void set_cudnn_deterministic(bool deterministic) { g_cudnn_deterministic.store(deterministic); }
bool cudnn_deterministic() { return g_cudnn_deterministic.load(); }

}  // namespace loom::cuda

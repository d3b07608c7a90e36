// tensor/cuda/blas.h — the switches of the library-backed CUDA kernels: whether float32 matrix
// products (cuBLAS) and convolutions (cuDNN) may round their inputs to TF32 on tensor cores, and
// whether cuDNN's convolutions keep to deterministic algorithms. Host-only; the settings are plain
// process-wide flags, so they exist (and do nothing) in a build without CUDA too
// (tensor/cuda/blas.cpp).
#pragma once

namespace loom::cuda {

// float32 mm/bmm through TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32): about 10 bits of
// mantissa per input product, several times faster. Default false, as PyTorch's
// torch.backends.cuda.matmul.allow_tf32.
void set_allow_tf32(bool allow);
bool allow_tf32();

// float32 conv2d and its backward through TF32 tensor cores. Default true, as PyTorch's
// torch.backends.cudnn.allow_tf32; false asks cuDNN for FMA math only (CUDNN_FMA_MATH).
void set_cudnn_allow_tf32(bool allow);
bool cudnn_allow_tf32();

// Whether conv2d prefers cuDNN's deterministic algorithms (the same bits on every run, Note
// [conv2d on cuDNN]) over faster non-deterministic ones, which some backward-filter and
// backward-data algorithms are (they add partial sums with atomics). Default true: loom's runs
// repeat. false takes cuDNN's heuristics' ranking as it is, which is PyTorch's default
// (torch.backends.cudnn.deterministic = False). Each setting keeps its own algorithm cache.
void set_cudnn_deterministic(bool deterministic);
bool cudnn_deterministic();

}  // namespace loom::cuda

// tensor/cuda/stubs.h — what the CUDA kernels' stand-ins call in a build without CUDA
// (tensor/cuda/*_stubs.cpp): no tensor can live on a GPU there, so reaching one is a bug in the
// caller or a CUDA tensor made by hand; it raises DeviceError("<op>: loom was built without
// CUDA ...").
#pragma once

namespace loom::cuda {

[[noreturn]] void built_without_cuda(const char* op);

}  // namespace loom::cuda

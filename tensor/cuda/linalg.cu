// tensor/cuda/linalg.cu — mm_out and bmm on the GPU through cuBLAS (cublasGemmEx and
// cublasGemmStridedBatchedEx, 64-bit sizes), for loom's row-major tensors. The CUDA twin of
// tensor/cpu/linalg.cpp: operands with a unit stride in either matrix dim are read in place
// (Note [Row-major GEMM on cuBLAS]); only an operand with no unit stride is copied.

#include <algorithm>

#include "tensor/copy.h"
#include "tensor/cuda/handles.h"
#include "tensor/cuda/linalg.h"

namespace loom::cuda {

// Note [Row-major GEMM on cuBLAS]
//   cuBLAS is column-major; loom is row-major. A row-major [R,C] matrix with leading dim ld is,
//   byte for byte, the column-major [C,R] matrix (its transpose) with the same ld. So the
//   row-major product C = A B is computed as the column-major C^T = B^T A^T: cuBLAS gets B
//   first and A second, with m = N and n = M swapped, and C's buffer read as C^T. An operand
//   stored column-major (a transposed view: unit stride along its rows) is, to cuBLAS, the
//   matrix itself rather than its transpose, so it gets CUBLAS_OP_T. cuBLAS asks ld >= the
//   stored leading extent: >= cols for a row-major operand, >= rows for a column-major one;
//   views that break this (overlapping rows, stride 0) are copied.

namespace {

// A matrix operand (the last two dims of a 2-D or 3-D tensor) as cuBLAS reads it.
struct Operand {
  Tensor storage;            // the tensor read: t itself, or a dense copy of it
  bool transposed = false;   // stored column-major (a transposed view)
  int64_t ld = 1;            // leading dim in elements
  int64_t batch_stride = 0;  // elements between consecutive matrices of a 3-D operand
};

Operand as_operand(const Tensor& t) {
  const int64_t d = t.dim() - 2;
  const int64_t rows = t.size(d), cols = t.size(d + 1);
  const int64_t row_stride = t.stride(d), col_stride = t.stride(d + 1);
  const int64_t batch_stride = t.dim() == 3 && t.size(0) > 1 ? t.stride(0) : 0;
  if (col_stride == 1 || cols == 1) {
    const int64_t ld = rows <= 1 ? cols : row_stride;
    if (ld >= std::max<int64_t>(1, cols)) return {t, false, ld, batch_stride};
  }
  if (row_stride == 1 || rows == 1) {
    const int64_t ld = cols <= 1 ? rows : col_stride;
    if (ld >= std::max<int64_t>(1, rows)) return {t, true, ld, batch_stride};
  }
  // No usable unit stride: the one case that copies.
  Tensor dense = empty(t.sizes(), t.dtype(), t.device());
  kernels::copy_(dense, t);
  return {dense, false, std::max<int64_t>(1, cols), t.dim() == 3 ? rows * cols : 0};
}

struct GemmTypes {
  cudaDataType data;
  cublasComputeType_t compute;
};

GemmTypes gemm_types(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32:
      return {CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
    case DType::Float64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::Float16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
    case DType::BFloat16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
    default:
      throw DTypeError(detail::str(
          op, ": expected a float32, float64, float16 or bfloat16 tensor; got ", dtype));
  }
}

// C [M,N] (row-major, leading dim ldc) = alpha A [M,K] B [K,N] + beta C, `batch` times with
// the operands' batch strides and C's stride_c. M, N, K >= 1.
struct Gemm {
  int64_t m, n, k, batch;
  Operand a, b;
  void* c;
  int64_t ldc, stride_c;
  double alpha, beta;
};

void run_gemm(const Gemm& g, DType dtype, int device, const char* op) {
  const GemmTypes types = gemm_types(dtype, op);
  // Scalars have the compute type: double for CUBLAS_COMPUTE_64F, float otherwise.
  const float alpha32 = static_cast<float>(g.alpha), beta32 = static_cast<float>(g.beta);
  const double alpha64 = g.alpha, beta64 = g.beta;
  const bool wide = types.compute == CUBLAS_COMPUTE_64F;
  const void* alpha = wide ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = wide ? static_cast<const void*>(&beta64) : &beta32;
  // Column-major C^T [N,M] = B^T A^T (the Note): B goes first.
  const cublasOperation_t op_b = g.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasHandle_t handle = cublas_handle(device);
  if (g.batch == 1) {
    check_cublas(cublasGemmEx_64(handle, op_b, op_a, g.n, g.m, g.k, alpha, g.b.storage.data(),
                                 types.data, g.b.ld, g.a.storage.data(), types.data, g.a.ld, beta,
                                 g.c, types.data, g.ldc, types.compute, CUBLAS_GEMM_DEFAULT),
                 device, op, ": cublasGemmEx(M=", g.m, ", N=", g.n, ", K=", g.k, ", ", dtype, ")");
  } else {
    check_cublas(
        cublasGemmStridedBatchedEx_64(
            handle, op_b, op_a, g.n, g.m, g.k, alpha, g.b.storage.data(), types.data, g.b.ld,
            g.b.batch_stride, g.a.storage.data(), types.data, g.a.ld, g.a.batch_stride, beta, g.c,
            types.data, g.ldc, g.stride_c, g.batch, types.compute, CUBLAS_GEMM_DEFAULT),
        device, op, ": cublasGemmStridedBatchedEx(batch=", g.batch, ", M=", g.m, ", N=", g.n,
        ", K=", g.k, ", ", dtype, ")");
  }
}

// out[i, j] = beta out[i, j], or 0 when zero is set (NaNs included): the product with K = 0.
// One thread per element, grid-stride.
template <typename T>
__global__ void scale_matrix_kernel(T* out, int64_t rows, int64_t cols, int64_t row_stride,
                                    int64_t col_stride, acc_t<T> beta, bool zero) {
  const int64_t n = rows * cols, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    T& v = out[(i / cols) * row_stride + (i % cols) * col_stride];
    v = zero ? T(acc_t<T>(0)) : T(beta * static_cast<acc_t<T>>(v));
  }
}

void scale_matrix(const Tensor& out, double beta) {
  if (beta == 1.0) return;
  const int64_t n = out.numel();
  dispatch_cuda_floating(out.dtype(), "mm", [&]<typename T>() {
    scale_matrix_kernel<T><<<blocks_for(n), kThreads, 0, stream_of(out)>>>(
        static_cast<T*>(out.data()), out.size(0), out.size(1), out.stride(0), out.stride(1),
        static_cast<acc_t<T>>(beta), beta == 0.0);
    check_launch("scale_matrix_kernel", out.device().index);
  });
}

}  // namespace

void mm_out(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  gemm_types(a.dtype(), "mm");  // DTypeError for the dtypes cuBLAS is not asked to multiply
  const int device = a.device().index;
  DeviceGuard guard(device);
  out.bump_version();
  const int64_t m = a.size(0), n = b.size(1), k = a.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_matrix(out, beta);
  // cuBLAS writes C with a unit inner stride and ldc >= N; any other out goes through a
  // contiguous buffer (the CPU entry point only lets the first kind through).
  const int64_t ldc = m <= 1 ? n : out.stride(0);
  const bool direct = (out.stride(1) == 1 || n == 1) && ldc >= n;
  Tensor c = out;
  if (!direct) {
    c = empty({m, n}, out.dtype(), out.device());
    if (beta != 0.0) kernels::copy_(c, out);
  }
  const Gemm gemm{m, n,     k,   1, as_operand(a), as_operand(b), c.data(), direct ? ldc : n,
                  0, alpha, beta};
  run_gemm(gemm, a.dtype(), device, "mm");
  if (!direct) kernels::copy_(out, c);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  gemm_types(a.dtype(), "bmm");
  const int device = a.device().index;
  DeviceGuard guard(device);
  const int64_t batch = a.size(0), m = a.size(1), n = b.size(2), k = a.size(2);
  Tensor out = empty({batch, m, n}, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  if (k == 0) {  // empty sums
    LOOM_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.nbytes(), stream_of(out)), device);
    return out;
  }
  const Gemm gemm{m, n, k, batch, as_operand(a), as_operand(b), out.data(), n, m * n, 1.0, 0.0};
  run_gemm(gemm, a.dtype(), device, "bmm");
  return out;
}

}  // namespace loom::cuda

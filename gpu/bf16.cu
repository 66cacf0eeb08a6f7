// bf16 on the device: the reference's rounding bit for bit, f32 <-> bf16 buffers, and tensor-core
// GEMMs with bf16 inputs and f32 accumulation and output (see the bf16 section of gpu/ops.hpp).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "gpu/kernel_util.cuh"
#include "gpu/ops.hpp"

namespace shardcheck::gpu::ops {
namespace {

using kernel::cuda_ok;
using kernel::grid;
using kernel::kThreads;

void blas_ok(cublasStatus_t s, const char* op) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("gpu::ops::") + op + ": cuBLAS " +
                             cublasGetStatusString(s));
}
cudaStream_t st(const Context& c) {
  return static_cast<cudaStream_t>(c.stream());
}
cublasHandle_t bh(const Context& c) {
  return static_cast<cublasHandle_t>(c.cublas());
}

// ref::round_to_bf16 on the bits of a value that is not NaN: add 0x7FFF plus the lowest kept bit
// (ties to even), drop the low half. A carry out of the mantissa moves the exponent up, so the
// largest finite floats become inf, as on the host.
__device__ __forceinline__ uint32_t round_bits(uint32_t u) {
  return (u + 0x7FFFU + ((u >> 16) & 1U)) & 0xFFFF0000U;
}
__device__ __forceinline__ bool is_nan_bits(uint32_t u) {
  return (u & 0x7FFFFFFFU) > 0x7F800000U;  // std::isnan
}

__global__ void round_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = __float_as_uint(x[i]);
    if (!is_nan_bits(u)) x[i] = __uint_as_float(round_bits(u));
  }
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = __float_as_uint(x[i]);
    // NaN: keep the sign, force a quiet NaN (as comm::bf16); the payload may sit in the low half.
    y[i] = static_cast<uint16_t>(is_nan_bits(u) ? ((u >> 16) | 0x0040U) : (round_bits(u) >> 16));
  }
}

__global__ void from_bf16_kernel(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

int dim(int64_t v, const char* op) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string("gpu::ops::") + op + ": dimension " +
                                std::to_string(v) + " outside [0, INT_MAX]");
  return static_cast<int>(v);
}

// The Context's handle is in pedantic math (f32 GEMMs stay f32); lift it for one bf16 call so
// cuBLAS may use tensor cores, keeping reductions in f32, and put it back (also on a throw).
class MathMode {
 public:
  MathMode(cublasHandle_t h, const char* op) : h_(h) {
    blas_ok(cublasGetMathMode(h_, &saved_), op);
    blas_ok(cublasSetMathMode(
                h_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
            op);
  }
  ~MathMode() { cublasSetMathMode(h_, saved_); }
  MathMode(const MathMode&) = delete;
  MathMode& operator=(const MathMode&) = delete;

 private:
  cublasHandle_t h_;
  cublasMath_t saved_ = CUBLAS_PEDANTIC_MATH;
};

// Column-major C[m,n] (f32) = op(A) op(B) (bf16) + beta C, f32 accumulation.
void gemm_bf16(const Context& c, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
               int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
               float beta, float* cc, int64_t ldc, const char* op) {
  const int mi = dim(m, op), ni = dim(n, op), ki = dim(k, op);
  if (mi == 0 || ni == 0) return;
  // cuBLAS wants every leading dimension >= 1 even where a matrix is empty (k == 0).
  const int la = dim(lda < 1 ? 1 : lda, op), lb = dim(ldb < 1 ? 1 : ldb, op),
            lc = dim(ldc < 1 ? 1 : ldc, op);
  const float one = 1.0F;
  const MathMode mode(bh(c), op);
  blas_ok(cublasGemmEx(bh(c), ta, tb, mi, ni, ki, &one, a, CUDA_R_16BF, la, b, CUDA_R_16BF, lb,
                       &beta, cc, CUDA_R_32F, lc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          op);
}

}  // namespace

void round_to_bf16(Context& c, float* x, int64_t n) {
  if (n <= 0) return;
  round_kernel<<<grid(n), kThreads, 0, st(c)>>>(x, n);
  cuda_ok(cudaGetLastError(), "round_to_bf16");
}

void to_bf16(Context& c, const float* x, uint16_t* y, int64_t n) {
  if (n <= 0) return;
  to_bf16_kernel<<<grid(n), kThreads, 0, st(c)>>>(x, y, n);
  cuda_ok(cudaGetLastError(), "to_bf16");
}

void from_bf16(Context& c, const uint16_t* x, float* y, int64_t n) {
  if (n <= 0) return;
  from_bf16_kernel<<<grid(n), kThreads, 0, st(c)>>>(x, y, n);
  cuda_ok(cudaGetLastError(), "from_bf16");
}

// Row-major X[r,c] is column-major X^T with leading dimension c; each GEMM is the column-major
// form of the row-major formula in its comment (as the f32 linear ops in ops.cu).
void linear_forward_bf16(Context& c, const uint16_t* x, const uint16_t* w, float* y, int64_t rows,
                         int64_t in, int64_t out) {  // y^T[out,rows] = w^T . x^T
  gemm_bf16(c, CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, w, out, x, in, 0.0F, y, out,
            "linear_forward_bf16");
}

void linear_backward_bf16(Context& c, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                          float* dx, float* dw, int64_t rows, int64_t in, int64_t out) {
  // dx^T[in,rows] = w[in,out] . dy^T
  gemm_bf16(c, CUBLAS_OP_T, CUBLAS_OP_N, in, rows, out, w, out, dy, out, 0.0F, dx, in,
            "linear_backward_bf16");
  // dw^T[out,in] += dy^T[out,rows] . x[rows,in]
  gemm_bf16(c, CUBLAS_OP_N, CUBLAS_OP_T, out, in, rows, dy, out, x, in, 1.0F, dw, out,
            "linear_backward_bf16");
}

void linear_t_forward_bf16(Context& c, const uint16_t* x, const uint16_t* w, float* y, int64_t rows,
                           int64_t in,
                           int64_t out) {  // y^T[out,rows] = w[out,in] . x^T
  gemm_bf16(c, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, w, in, x, in, 0.0F, y, out,
            "linear_t_forward_bf16");
}

void linear_t_backward_bf16(Context& c, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                            float* dx, float* dw, int64_t rows, int64_t in, int64_t out) {
  // dx^T[in,rows] = w^T[in,out] . dy^T
  gemm_bf16(c, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, w, in, dy, out, 0.0F, dx, in,
            "linear_t_backward_bf16");
  // dw^T[in,out] += x^T[in,rows] . dy[rows,out]
  gemm_bf16(c, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, x, in, dy, out, 1.0F, dw, in,
            "linear_t_backward_bf16");
}

}  // namespace shardcheck::gpu::ops

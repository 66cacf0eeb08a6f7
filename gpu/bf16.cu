// bf16 on the device: the reference's rounding bit for bit, f32 <-> bf16 buffers, and tensor-core
// GEMMs with bf16 inputs and f32 accumulation and output (see the bf16 section of gpu/ops.hpp).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "gpu/blas_util.cuh"
#include "gpu/gemm_plan.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/ops.hpp"

namespace shardcheck::gpu::ops {
namespace {

using kernel::cuda_ok;
using kernel::grid;
using kernel::kThreads;

using blas::handle;
using blas::stream;

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

// The Context's handle is in pedantic math (f32 GEMMs stay f32); lift it for one bf16 call so
// cuBLAS may use tensor cores, keeping reductions in f32, and put it back (also on a throw).
class MathMode {
 public:
  MathMode(cublasHandle_t h, const char* op) : h_(h) {
    blas::ok(cublasGetMathMode(h_, &saved_), op);
    blas::ok(cublasSetMathMode(
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

// One column-major GEMM of gemm_plan.hpp: C (f32) = op(A) op(B) (bf16) (+ C), f32 accumulation.
void gemm_bf16(const Context& c, const detail::GemmPlan& g,
               const detail::GemmOperands<uint16_t, float>& p, const char* op) {
  using blas::dim;
  using blas::leading;
  const int mi = dim(g.m, op), ni = dim(g.n, op), ki = dim(g.k, op);
  if (mi == 0 || ni == 0) return;
  const float one = 1.0F, beta = g.accumulate ? 1.0F : 0.0F;
  const MathMode mode(handle(c), op);
  blas::ok(cublasGemmEx(handle(c), blas::trans(g.trans_a), blas::trans(g.trans_b), mi, ni, ki, &one,
                        p.in(g.a), CUDA_R_16BF, leading(g.lda, op), p.in(g.b), CUDA_R_16BF,
                        leading(g.ldb, op), &beta, p.out(g.c), CUDA_R_32F, leading(g.ldc, op),
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
           op);
}

}  // namespace

void round_to_bf16(Context& c, float* x, int64_t n) {
  if (n <= 0) return;
  round_kernel<<<grid(n), kThreads, 0, stream(c)>>>(x, n);
  cuda_ok(cudaGetLastError(), "round_to_bf16");
}

void to_bf16(Context& c, const float* x, uint16_t* y, int64_t n) {
  if (n <= 0) return;
  to_bf16_kernel<<<grid(n), kThreads, 0, stream(c)>>>(x, y, n);
  cuda_ok(cudaGetLastError(), "to_bf16");
}

void from_bf16(Context& c, const uint16_t* x, float* y, int64_t n) {
  if (n <= 0) return;
  from_bf16_kernel<<<grid(n), kThreads, 0, stream(c)>>>(x, y, n);
  cuda_ok(cudaGetLastError(), "from_bf16");
}

// The GEMMs of gemm_plan.hpp, as the f32 linear ops in ops.cu.
void linear_forward_bf16(Context& c, const uint16_t* x, const uint16_t* w, float* y, int64_t rows,
                         int64_t in, int64_t out) {
  gemm_bf16(c, detail::linear_forward_plan(rows, in, out), {.x = x, .w = w, .y = y},
            "linear_forward_bf16");
}

void linear_backward_bf16(Context& c, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                          float* dx, float* dw, int64_t rows, int64_t in, int64_t out) {
  const detail::GemmOperands<uint16_t, float> p{.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw};
  for (const auto& g : detail::linear_backward_plans(rows, in, out))
    gemm_bf16(c, g, p, "linear_backward_bf16");
}

void linear_t_forward_bf16(Context& c, const uint16_t* x, const uint16_t* w, float* y, int64_t rows,
                           int64_t in, int64_t out) {
  gemm_bf16(c, detail::linear_t_forward_plan(rows, in, out), {.x = x, .w = w, .y = y},
            "linear_t_forward_bf16");
}

void linear_t_backward_bf16(Context& c, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                            float* dx, float* dw, int64_t rows, int64_t in, int64_t out) {
  const detail::GemmOperands<uint16_t, float> p{.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw};
  for (const auto& g : detail::linear_t_backward_plans(rows, in, out))
    gemm_bf16(c, g, p, "linear_t_backward_bf16");
}

}  // namespace shardcheck::gpu::ops

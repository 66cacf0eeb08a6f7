// Internal to gpu/ops: what the cuBLAS callers (ops.cu's f32/f64 GEMMs, bf16.cu's tensor-core
// GEMMs) share: the Context's stream and handle, status checks naming the op, and GEMM dimensions
// as cuBLAS's int without silent truncation.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu/ops.hpp"

namespace shardcheck::gpu::ops::blas {

inline void ok(cublasStatus_t s, const char* op) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("gpu::ops::") + op + ": cuBLAS " +
                             cublasGetStatusString(s));
}
inline cudaStream_t stream(const Context& c) {
  return static_cast<cudaStream_t>(c.stream());
}
inline cublasHandle_t handle(const Context& c) {
  return static_cast<cublasHandle_t>(c.cublas());
}
// A GEMM dimension as cuBLAS's int: throws past INT_MAX (or below 0) instead of truncating.
inline int dim(int64_t v, const char* op) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string("gpu::ops::") + op + ": GEMM dimension " +
                                std::to_string(v) + " outside [0, INT_MAX]");
  return static_cast<int>(v);
}
// A leading dimension: cuBLAS wants >= 1 even for an empty operand.
inline int leading(int64_t v, const char* op) {
  return dim(v < 1 ? 1 : v, op);
}
inline cublasOperation_t trans(bool t) {
  return t ? CUBLAS_OP_T : CUBLAS_OP_N;
}

}  // namespace shardcheck::gpu::ops::blas

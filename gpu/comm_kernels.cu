// The few kernels the communicator itself needs: bf16/f16 <-> f32 (round to nearest even, once)
// for exact 16-bit reductions, and the division that turns a sum into an average.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "gpu/nccl_core.hpp"

namespace shardcheck::gpu::detail {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}

template <class T>
__device__ float to_f32(T v) {
  return static_cast<float>(v);
}
template <>
__device__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ float to_f32(__half v) {
  return __half2float(v);
}

template <class T>
__device__ T from_f32(float v);
template <>
__device__ __nv_bfloat16 from_f32(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __half from_f32(float v) {
  return __float2half_rn(v);
}

template <class T>
__global__ void widen(const T* src, float* dst, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = to_f32(src[i]);
}

template <class T>
__global__ void narrow(const float* src, T* dst, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f32<T>(src[i]);
}

// Integers and full-precision floats divide in their own type; 16-bit floats in f32, rounded once.
template <class T>
__global__ void divide(T* x, std::size_t n, int d) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>)
      x[i] = from_f32<T>(to_f32(x[i]) / static_cast<float>(d));
    else if constexpr (std::is_integral_v<T>)
      x[i] = static_cast<T>(static_cast<long long>(x[i]) / d);  // truncates toward zero
    else
      x[i] = x[i] / static_cast<T>(d);
  }
}

}  // namespace

cudaError_t widen_to_f32(const void* src, comm::DType t, float* dst, std::size_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  (void)cudaGetLastError();  // report this launch, not a stale error of an earlier call
  if (t == comm::DType::bf16)
    widen<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), dst, n);
  else
    widen<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __half*>(src), dst, n);
  return cudaGetLastError();
}

cudaError_t narrow_from_f32(const float* src, void* dst, comm::DType t, std::size_t n,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  (void)cudaGetLastError();
  if (t == comm::DType::bf16)
    narrow<<<blocks_for(n), kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  else
    narrow<<<blocks_for(n), kThreads, 0, stream>>>(src, static_cast<__half*>(dst), n);
  return cudaGetLastError();
}

cudaError_t divide_inplace(void* x, comm::DType t, std::size_t n, int d, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  (void)cudaGetLastError();
  const unsigned b = blocks_for(n);
  switch (t) {
    case comm::DType::f64:
      divide<<<b, kThreads, 0, stream>>>(static_cast<double*>(x), n, d);
      break;
    case comm::DType::f32:
      divide<<<b, kThreads, 0, stream>>>(static_cast<float*>(x), n, d);
      break;
    case comm::DType::bf16:
      divide<<<b, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(x), n, d);
      break;
    case comm::DType::f16:
      divide<<<b, kThreads, 0, stream>>>(static_cast<__half*>(x), n, d);
      break;
    case comm::DType::i32:
      divide<<<b, kThreads, 0, stream>>>(static_cast<std::int32_t*>(x), n, d);
      break;
    case comm::DType::i64:
      divide<<<b, kThreads, 0, stream>>>(static_cast<std::int64_t*>(x), n, d);
      break;
    case comm::DType::u8:
      divide<<<b, kThreads, 0, stream>>>(static_cast<std::uint8_t*>(x), n, d);
      break;
  }
  return cudaGetLastError();
}

}  // namespace shardcheck::gpu::detail

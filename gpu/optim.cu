// AdamW update, gradient sum of squares (for the global norm) and clipping scale, as
// reference/optim.cpp, elementwise on device buffers.
#include <cuda_runtime_api.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "gpu/kernel_util.cuh"
#include "gpu/ops.hpp"

namespace shardcheck::gpu::ops {
namespace {

using kernel::kThreads;

using kernel::cuda_ok;
unsigned grid(int64_t n) {
  return kernel::grid(n, 1024);
}

template <class T>
struct AdamArgs {
  T decay, b1, b2, one_minus_b1, one_minus_b2, bc1, bc2, lr, eps;
};

template <class T>
__global__ void adamw(T* p, const T* g, T* m, T* v, int64_t n, AdamArgs<T> a) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T pi = p[i] * a.decay;
    const T gi = g[i];
    const T mi = a.b1 * m[i] + a.one_minus_b1 * gi;
    const T vi = a.b2 * v[i] + a.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T mhat = mi / a.bc1;
    const T vhat = vi / a.bc2;
    pi -= a.lr * mhat / (sqrt(vhat) + a.eps);
    p[i] = pi;
  }
}

// out += sum of g^2 in f64 (one atomic per block).
template <class T>
__global__ void sum_sq(const T* g, int64_t n, double* out) {
  __shared__ double sh[kThreads];
  double acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    acc += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, sh[0]);
}

template <class T>
__global__ void scale_kernel(T* g, int64_t n, double factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    g[i] = static_cast<T>(static_cast<double>(g[i]) * factor);
}

}  // namespace

template <class T>
void adamw_update(Context& c, T* p, const T* g, T* m, T* v, int64_t n, bool is_matrix,
                  const AdamWStep& s) {
  if (n == 0) return;
  AdamArgs<T> a;
  a.decay = static_cast<T>(is_matrix ? 1.0 - s.lr * s.weight_decay : 1.0);
  a.b1 = static_cast<T>(s.beta1);
  a.b2 = static_cast<T>(s.beta2);
  a.one_minus_b1 = T{1} - a.b1;
  a.one_minus_b2 = T{1} - a.b2;
  a.bc1 = static_cast<T>(1.0 - std::pow(s.beta1, s.t));
  a.bc2 = static_cast<T>(1.0 - std::pow(s.beta2, s.t));
  a.lr = static_cast<T>(s.lr);
  a.eps = static_cast<T>(s.eps);
  adamw<<<grid(n), kThreads, 0, static_cast<cudaStream_t>(c.stream())>>>(p, g, m, v, n, a);
  cuda_ok(cudaGetLastError(), "adamw_update");
}

template <class T>
void add_sum_of_squares(Context& c, const T* g, int64_t n, double* out) {
  if (n == 0) return;
  sum_sq<<<grid(n), kThreads, 0, static_cast<cudaStream_t>(c.stream())>>>(g, n, out);
  cuda_ok(cudaGetLastError(), "add_sum_of_squares");
}

template <class T>
void scale_inplace(Context& c, T* g, int64_t n, double factor) {
  if (n == 0) return;
  scale_kernel<<<grid(n), kThreads, 0, static_cast<cudaStream_t>(c.stream())>>>(g, n, factor);
  cuda_ok(cudaGetLastError(), "scale_inplace");
}

#define SC_GPU_OPTIM_INSTANTIATE(T)                                                            \
  template void adamw_update(Context&, T*, const T*, T*, T*, int64_t, bool, const AdamWStep&); \
  template void add_sum_of_squares(Context&, const T*, int64_t, double*);                      \
  template void scale_inplace(Context&, T*, int64_t, double);
SC_GPU_OPTIM_INSTANTIATE(float)
SC_GPU_OPTIM_INSTANTIATE(double)
#undef SC_GPU_OPTIM_INSTANTIATE

}  // namespace shardcheck::gpu::ops

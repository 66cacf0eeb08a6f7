// CUDA versions of the reference ops: cuBLAS for the GEMMs, one kernel per pointwise or per-row op.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "gpu/blas_util.cuh"
#include "gpu/gemm_plan.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/ops.hpp"

namespace shardcheck::gpu::ops {
namespace {

using kernel::kThreads;
constexpr double kEps = 1e-5;  // reference::kRmsNormEps

using blas::handle;
using blas::stream;
using kernel::cuda_ok;
using kernel::grid;

cublasStatus_t xgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                     int k, const float* a, int lda, const float* b, int ldb, float beta, float* c,
                     int ldc) {
  const float one = 1.0F;
  return cublasSgemm(h, ta, tb, m, n, k, &one, a, lda, b, ldb, &beta, c, ldc);
}
cublasStatus_t xgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                     int k, const double* a, int lda, const double* b, int ldb, double beta,
                     double* c, int ldc) {
  const double one = 1.0;
  return cublasDgemm(h, ta, tb, m, n, k, &one, a, lda, b, ldb, &beta, c, ldc);
}

// One column-major GEMM of gemm_plan.hpp. Nothing to do for an empty C.
template <class T>
void gemm(const Context& c, const detail::GemmPlan& g, const detail::GemmOperands<T, T>& p,
          const char* op) {
  using blas::dim;
  using blas::leading;
  if (dim(g.m, op) == 0 || dim(g.n, op) == 0) return;
  blas::ok(xgemm(handle(c), blas::trans(g.trans_a), blas::trans(g.trans_b), dim(g.m, op),
                 dim(g.n, op), dim(g.k, op), p.in(g.a), leading(g.lda, op), p.in(g.b),
                 leading(g.ldb, op), g.accumulate ? T{1} : T{0}, p.out(g.c), leading(g.ldc, op)),
           op);
}

// Sum over the block (blockDim.x == kThreads); every thread gets the total.
template <class T>
__device__ T block_sum(T v, T* shared) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffU, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? shared[lane] : T{0};
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffU, v, o);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const T total = shared[0];
  __syncthreads();
  return total;
}
template <class T>
__device__ T block_max(T v, T* shared) {
  for (int o = 16; o > 0; o /= 2) v = max(v, __shfl_down_sync(0xffffffffU, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? shared[lane] : shared[0];
    for (int o = 16; o > 0; o /= 2) v = max(v, __shfl_down_sync(0xffffffffU, v, o));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const T total = shared[0];
  __syncthreads();
  return total;
}

template <class T>
__global__ void rmsnorm_fwd(const T* x, const T* w, T* y, T* rstd, int64_t h) {
  __shared__ T sh[32];
  const T* xr = x + blockIdx.x * h;
  T ss = 0;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, sh);
  const T inv = T{1} / sqrt(ss / static_cast<T>(h) + static_cast<T>(kEps));
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) y[blockIdx.x * h + i] = xr[i] * inv * w[i];
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = inv;
}

template <class T>
__global__ void rmsnorm_bwd_dx(const T* dy, const T* x, const T* w, const T* rstd, T* dx,
                               int64_t h) {
  __shared__ T sh[32];
  const int64_t base = blockIdx.x * h;
  const T inv = rstd[blockIdx.x];
  T dot = 0;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dot += dy[base + i] * w[i] * x[base + i];
  dot = block_sum(dot, sh);
  const T k = inv * inv * inv * dot / static_cast<T>(h);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    dx[base + i] = dy[base + i] * w[i] * inv - x[base + i] * k;
}

// dw[c] += sum over rows of dy*x*rstd: one thread per column, rows in order (deterministic).
template <class T>
__global__ void rmsnorm_bwd_dw(const T* dy, const T* x, const T* rstd, T* dw, int64_t rows,
                               int64_t h) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < h;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += dy[r * h + c] * x[r * h + c] * rstd[r];
    dw[c] += acc;
  }
}

template <class T>
__device__ T gelu_c() {
  return static_cast<T>(0.7978845608028654);
}

template <class T>
__global__ void gelu_fwd(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T v = x[i];
    y[i] = T{0.5} * v * (T{1} + tanh(gelu_c<T>() * (v + T{0.044715} * v * v * v)));
  }
}

template <class T>
__global__ void gelu_bwd(const T* dy, const T* x, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T v = x[i];
    const T th = tanh(gelu_c<T>() * (v + T{0.044715} * v * v * v));
    const T dinner = gelu_c<T>() * (T{1} + T{3} * T{0.044715} * v * v);
    dx[i] = dy[i] * (T{0.5} * (T{1} + th) + T{0.5} * v * (T{1} - th * th) * dinner);
  }
}

template <class T>
__global__ void add_kernel(T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    a[i] += b[i];
}

template <class T>
__global__ void embed_fwd(const T* table, const int32_t* tokens, T* y, int64_t vocab, int64_t h) {
  const int32_t t = tokens[blockIdx.x];
  const bool ok = t >= 0 && t < vocab;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    y[blockIdx.x * h + i] = ok ? table[static_cast<int64_t>(t) * h + i] : T{0};
}

template <class T>
__global__ void embed_bwd(const T* dy, const int32_t* tokens, T* dtable, int64_t h, int64_t vocab) {
  const int32_t t = tokens[blockIdx.x];
  if (t < 0 || t >= vocab) return;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    atomicAdd(&dtable[static_cast<int64_t>(t) * h + i], dy[blockIdx.x * h + i]);
}

template <class T>
__global__ void xent_fwd(const T* logits, const int32_t* targets, const int32_t* mask, double* loss,
                         int64_t vocab) {
  __shared__ T sh[32];
  const int64_t r = blockIdx.x;
  if (mask[r] == 0) {
    if (threadIdx.x == 0) loss[r] = 0.0;
    return;
  }
  const T* l = logits + r * vocab;
  T mx = l[0];
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = max(mx, l[i]);
  mx = block_max(mx, sh);
  T sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += exp(l[i] - mx);
  sum = block_sum(sum, sh);
  if (threadIdx.x == 0) {
    const int32_t t = targets[r];
    loss[r] = (t >= 0 && t < vocab) ? static_cast<double>(mx + log(sum) - l[t]) : nan("");
  }
}

template <class T>
__global__ void xent_bwd(const T* logits, const int32_t* targets, const double* weight, T* d,
                         int64_t vocab) {
  __shared__ T sh[32];
  const int64_t r = blockIdx.x;
  const T wt = static_cast<T>(weight[r]);
  const T* l = logits + r * vocab;
  T* dr = d + r * vocab;
  if (wt == T{0}) {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) dr[i] = T{0};
    return;
  }
  T mx = l[0];
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = max(mx, l[i]);
  mx = block_max(mx, sh);
  T sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += exp(l[i] - mx);
  sum = block_sum(sum, sh);
  const int32_t t = targets[r];
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    dr[i] = wt * exp(l[i] - mx) / sum - (i == t ? wt : T{0});
}

}  // namespace

Context::Context(int device, void* stream) : device_(device), stream_(stream) {
  cuda_ok(cudaSetDevice(device), "Context");
  if (stream_ == nullptr) {
    cudaStream_t s = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "Context");
    stream_ = s;
    owns_stream_ = true;
  }
  cublasHandle_t h = nullptr;
  blas::ok(cublasCreate(&h), "Context");
  handle_ = h;
  blas::ok(cublasSetStream(h, static_cast<cudaStream_t>(stream_)), "Context");
  blas::ok(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), "Context");  // no TF32: f32 stays f32
}

Context::~Context() {
  cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (owns_stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void Context::synchronize() const {
  cuda_ok(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "synchronize");
  cuda_ok(cudaGetLastError(), "synchronize");
}

// The GEMMs of gemm_plan.hpp: row-major formulas as column-major cuBLAS calls.
template <class T>
void linear_forward(Context& c, const T* x, const T* w, T* y, int64_t rows, int64_t in,
                    int64_t out) {
  gemm<T>(c, detail::linear_forward_plan(rows, in, out), {.x = x, .w = w, .y = y},
          "linear_forward");
}

template <class T>
void linear_backward(Context& c, const T* dy, const T* x, const T* w, T* dx, T* dw, int64_t rows,
                     int64_t in, int64_t out) {
  const detail::GemmOperands<T, T> p{.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw};
  for (const auto& g : detail::linear_backward_plans(rows, in, out))
    gemm(c, g, p, "linear_backward");
}

template <class T>
void linear_t_forward(Context& c, const T* x, const T* w, T* y, int64_t rows, int64_t in,
                      int64_t out) {
  gemm<T>(c, detail::linear_t_forward_plan(rows, in, out), {.x = x, .w = w, .y = y},
          "linear_t_forward");
}

template <class T>
void linear_t_backward(Context& c, const T* dy, const T* x, const T* w, T* dx, T* dw, int64_t rows,
                       int64_t in, int64_t out) {
  const detail::GemmOperands<T, T> p{.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw};
  for (const auto& g : detail::linear_t_backward_plans(rows, in, out))
    gemm(c, g, p, "linear_t_backward");
}

template <class T>
void rmsnorm_forward(Context& c, const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t h) {
  if (rows == 0) return;
  rmsnorm_fwd<<<static_cast<unsigned>(rows), kThreads, 0, stream(c)>>>(x, w, y, rstd, h);
  cuda_ok(cudaGetLastError(), "rmsnorm_forward");
}

template <class T>
void rmsnorm_backward(Context& c, const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw,
                      int64_t rows, int64_t h) {
  if (rows == 0) return;
  rmsnorm_bwd_dx<<<static_cast<unsigned>(rows), kThreads, 0, stream(c)>>>(dy, x, w, rstd, dx, h);
  rmsnorm_bwd_dw<<<grid(h), kThreads, 0, stream(c)>>>(dy, x, rstd, dw, rows, h);
  cuda_ok(cudaGetLastError(), "rmsnorm_backward");
}

template <class T>
void gelu_forward(Context& c, const T* x, T* y, int64_t n) {
  if (n == 0) return;
  gelu_fwd<<<grid(n), kThreads, 0, stream(c)>>>(x, y, n);
  cuda_ok(cudaGetLastError(), "gelu_forward");
}

template <class T>
void gelu_backward(Context& c, const T* dy, const T* x, T* dx, int64_t n) {
  if (n == 0) return;
  gelu_bwd<<<grid(n), kThreads, 0, stream(c)>>>(dy, x, dx, n);
  cuda_ok(cudaGetLastError(), "gelu_backward");
}

template <class T>
void add_inplace(Context& c, T* a, const T* b, int64_t n) {
  if (n == 0) return;
  add_kernel<<<grid(n), kThreads, 0, stream(c)>>>(a, b, n);
  cuda_ok(cudaGetLastError(), "add_inplace");
}

template <class T>
void embedding_forward(Context& c, const T* table, const int32_t* tokens, T* y, int64_t ntok,
                       int64_t vocab, int64_t h) {
  if (ntok == 0) return;
  embed_fwd<<<static_cast<unsigned>(ntok), kThreads, 0, stream(c)>>>(table, tokens, y, vocab, h);
  cuda_ok(cudaGetLastError(), "embedding_forward");
}

template <class T>
void embedding_backward(Context& c, const T* dy, const int32_t* tokens, T* dtable, int64_t ntok,
                        int64_t h) {
  if (ntok == 0) return;
  embed_bwd<<<static_cast<unsigned>(ntok), kThreads, 0, stream(c)>>>(dy, tokens, dtable, h,
                                                                     INT64_MAX);
  cuda_ok(cudaGetLastError(), "embedding_backward");
}

template <class T>
void cross_entropy_forward(Context& c, const T* logits, const int32_t* targets, const int32_t* mask,
                           double* loss, int64_t rows, int64_t vocab) {
  if (rows == 0) return;
  xent_fwd<<<static_cast<unsigned>(rows), kThreads, 0, stream(c)>>>(logits, targets, mask, loss,
                                                                    vocab);
  cuda_ok(cudaGetLastError(), "cross_entropy_forward");
}

template <class T>
void cross_entropy_backward(Context& c, const T* logits, const int32_t* targets,
                            const double* weight, T* dlogits, int64_t rows, int64_t vocab) {
  if (rows == 0) return;
  xent_bwd<<<static_cast<unsigned>(rows), kThreads, 0, stream(c)>>>(logits, targets, weight,
                                                                    dlogits, vocab);
  cuda_ok(cudaGetLastError(), "cross_entropy_backward");
}

#define SC_GPU_OPS_INSTANTIATE(T)                                                                  \
  template void linear_forward(Context&, const T*, const T*, T*, int64_t, int64_t, int64_t);       \
  template void linear_backward(Context&, const T*, const T*, const T*, T*, T*, int64_t, int64_t,  \
                                int64_t);                                                          \
  template void linear_t_forward(Context&, const T*, const T*, T*, int64_t, int64_t, int64_t);     \
  template void linear_t_backward(Context&, const T*, const T*, const T*, T*, T*, int64_t,         \
                                  int64_t, int64_t);                                               \
  template void rmsnorm_forward(Context&, const T*, const T*, T*, T*, int64_t, int64_t);           \
  template void rmsnorm_backward(Context&, const T*, const T*, const T*, const T*, T*, T*,         \
                                 int64_t, int64_t);                                                \
  template void add_inplace(Context&, T*, const T*, int64_t);                                      \
  template void gelu_forward(Context&, const T*, T*, int64_t);                                     \
  template void gelu_backward(Context&, const T*, const T*, T*, int64_t);                          \
  template void embedding_forward(Context&, const T*, const int32_t*, T*, int64_t, int64_t,        \
                                  int64_t);                                                        \
  template void embedding_backward(Context&, const T*, const int32_t*, T*, int64_t, int64_t);      \
  template void cross_entropy_forward(Context&, const T*, const int32_t*, const int32_t*, double*, \
                                      int64_t, int64_t);                                           \
  template void cross_entropy_backward(Context&, const T*, const int32_t*, const double*, T*,      \
                                       int64_t, int64_t);
SC_GPU_OPS_INSTANTIATE(float)
SC_GPU_OPS_INSTANTIATE(double)
#undef SC_GPU_OPS_INSTANTIATE

}  // namespace shardcheck::gpu::ops

// Causal, document-masked, grouped-query attention with dropout on the probabilities, forward and
// backward, as reference/attention.cpp: one block per (head, query), the row of probabilities in
// shared memory. Written for parity, not speed (no tiling, atomics for dK/dV).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu/kernel_util.cuh"
#include "gpu/ops.hpp"
#include "gpu/philox.cuh"

namespace shardcheck::gpu::ops {
namespace {

using kernel::kThreads;

using kernel::cuda_ok;

// What the kernels need of the dropout: the stream of "dropout/layers.<layer>" hashed on the host.
struct Drop {
  double rate;
  uint64_t seed;
  uint32_t stream;
  uint32_t step;
  int64_t sequence;
  int head_offset;
  int total_heads;
};

Drop drop_of(const Dropout& d, int heads) {
  return {d.rate,
          d.seed,
          detail::stream_hash("dropout/layers." + std::to_string(d.layer)),
          d.step,
          d.sequence,
          d.head_offset,
          d.total_heads > 0 ? d.total_heads : heads};
}

// ref::AttentionDropoutMask::scale for local head h (global head head_offset + h).
__device__ double drop_scale(const Drop& dr, int h, int64_t s, int64_t i, int64_t j) {
  if (dr.rate <= 0.0) return 1.0;
  return detail::dropout_scale(
      dr.rate, dr.seed, dr.stream, dr.step,
      detail::dropout_index(dr.sequence, dr.total_heads, dr.head_offset + h, s, i, j));
}

template <class T>
__device__ T block_reduce(T v, T* sh, bool is_max) {
  for (int o = 16; o > 0; o /= 2) {
    const T other = __shfl_down_sync(0xffffffffU, v, o);
    v = is_max ? max(v, other) : v + other;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? sh[lane] : sh[0];
    if (!is_max && lane >= kThreads / 32) v = T{0};
    for (int o = 16; o > 0; o /= 2) {
      const T other = __shfl_down_sync(0xffffffffU, v, o);
      v = is_max ? max(v, other) : v + other;
    }
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  const T r = sh[0];
  __syncthreads();
  return r;
}

__device__ bool visible(const int32_t* doc, int64_t i, int64_t j) {
  return j <= i && doc[i] == doc[j];
}

template <class T>
__global__ void attn_fwd(const T* q, const T* k, const T* v, const int32_t* doc, int64_t s,
                         int heads, int kv, int64_t d, Drop dr, T* o, T* probs) {
  extern __shared__ __align__(16) unsigned char smem[];  // s elements of T
  T* p = reinterpret_cast<T*>(smem);
  __shared__ T sh[32];
  const int h = static_cast<int>(blockIdx.x / s);
  const int64_t i = blockIdx.x % s;
  const int64_t g = h / (heads / kv);
  const T scale = T{1} / sqrt(static_cast<T>(d));
  const int64_t qw = heads * d, kw = kv * d;
  T mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    if (!visible(doc, i, j)) continue;
    T dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += q[i * qw + h * d + c] * k[j * kw + g * d + c];
    p[j] = dot * scale;
    mx = max(mx, p[j]);
  }
  mx = block_reduce(mx, sh, true);
  T sum = 0;
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    p[j] = visible(doc, i, j) ? exp(p[j] - mx) : T{0};
    sum += p[j];
  }
  sum = block_reduce(sum, sh, false);
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    p[j] /= sum;
    if (probs != nullptr) probs[(h * s + i) * s + j] = p[j];
    p[j] *= static_cast<T>(drop_scale(dr, h, s, i, j));  // the dropped weights, for o
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    T acc = 0;
    for (int64_t j = 0; j <= i; ++j)
      if (p[j] != T{0}) acc += p[j] * v[j * kw + g * d + c];
    o[i * qw + h * d + c] = acc;
  }
}

template <class T>
__global__ void attn_bwd(const T* dout, const T* q, const T* k, const T* v, const T* probs,
                         int64_t s, int heads, int kv, int64_t d, Drop dr, T* dq, T* dk, T* dv) {
  extern __shared__ __align__(16) unsigned char smem[];  // s elements of T
  T* dp = reinterpret_cast<T*>(smem);
  __shared__ T sh[32];
  const int h = static_cast<int>(blockIdx.x / s);
  const int64_t i = blockIdx.x % s;
  const int64_t g = h / (heads / kv);
  const T scale = T{1} / sqrt(static_cast<T>(d));
  const int64_t qw = heads * d, kw = kv * d;
  const T* prow = probs + (h * s + i) * s;
  T dot_pdp = 0;
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    const T m = static_cast<T>(drop_scale(dr, h, s, i, j));
    T dpd = 0;
    for (int64_t c = 0; c < d; ++c) {
      const T go = dout[i * qw + h * d + c];
      dpd += go * v[j * kw + g * d + c];
      const T add = prow[j] * m * go;
      if (add != T{0}) atomicAdd(&dv[j * kw + g * d + c], add);
    }
    dp[j] = dpd * m;
    dot_pdp += prow[j] * dp[j];
  }
  dot_pdp = block_reduce(dot_pdp, sh, false);
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
    dp[j] = prow[j] == T{0} ? T{0} : prow[j] * (dp[j] - dot_pdp) * scale;  // ds
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    T acc = 0;
    const T qc = q[i * qw + h * d + c];
    for (int64_t j = 0; j < s; ++j) {
      if (dp[j] == T{0}) continue;
      acc += dp[j] * k[j * kw + g * d + c];
      atomicAdd(&dk[j * kw + g * d + c], dp[j] * qc);
    }
    dq[i * qw + h * d + c] = acc;
  }
}

// row_bytes of dynamic shared memory plus the kernels' static 32 elements must fit 48 KiB.
void check_shape(int64_t s, int heads, int kv, std::size_t row_bytes, std::size_t elem,
                 const char* op) {
  if (kv <= 0 || heads < 0 || heads % kv != 0)
    throw std::invalid_argument(std::string("gpu::ops::") + op + ": heads % kv_heads != 0");
  if (s < 0 || s * heads > INT32_MAX)  // one block per (head, query): gridDim.x
    throw std::invalid_argument(std::string("gpu::ops::") + op + ": " + std::to_string(s) +
                                " queries x " + std::to_string(heads) + " heads is too many");
  if (row_bytes > 48 * 1024 - 32 * elem)
    throw std::invalid_argument(std::string("gpu::ops::") + op + ": sequence of " +
                                std::to_string(s) +
                                " is longer than this kernel's shared-memory row allows");
}

}  // namespace

template <class T>
void attention_forward(Context& c, const T* q, const T* k, const T* v, const int32_t* doc_ids,
                       int64_t s, int heads, int kv_heads, int64_t d, const Dropout& dropout, T* o,
                       T* probs) {
  const std::size_t row = static_cast<std::size_t>(s) * sizeof(T);
  check_shape(s, heads, kv_heads, row, sizeof(T), "attention_forward");
  if (s == 0 || heads == 0) return;  // no block to launch (a grid of 0 is a launch error)
  attn_fwd<<<static_cast<unsigned>(s * heads), kThreads, row,
             static_cast<cudaStream_t>(c.stream())>>>(q, k, v, doc_ids, s, heads, kv_heads, d,
                                                      drop_of(dropout, heads), o, probs);
  cuda_ok(cudaGetLastError(), "attention_forward");
}

template <class T>
void attention_backward(Context& c, const T* dout, const T* q, const T* k, const T* v,
                        const T* probs, int64_t s, int heads, int kv_heads, int64_t d,
                        const Dropout& dropout, T* dq, T* dk, T* dv) {
  const std::size_t row = static_cast<std::size_t>(s) * sizeof(T);
  check_shape(s, heads, kv_heads, row, sizeof(T), "attention_backward");
  if (s == 0) return;
  const auto st = static_cast<cudaStream_t>(c.stream());
  const std::size_t kv_bytes = static_cast<std::size_t>(s * kv_heads * d) * sizeof(T);
  cuda_ok(cudaMemsetAsync(dk, 0, kv_bytes, st), "attention_backward");
  cuda_ok(cudaMemsetAsync(dv, 0, kv_bytes, st), "attention_backward");
  if (heads == 0) return;
  attn_bwd<<<static_cast<unsigned>(s * heads), kThreads, row, st>>>(
      dout, q, k, v, probs, s, heads, kv_heads, d, drop_of(dropout, heads), dq, dk, dv);
  cuda_ok(cudaGetLastError(), "attention_backward");
}

#define SC_GPU_ATTN_INSTANTIATE(T)                                                                 \
  template void attention_forward(Context&, const T*, const T*, const T*, const int32_t*, int64_t, \
                                  int, int, int64_t, const Dropout&, T*, T*);                      \
  template void attention_backward(Context&, const T*, const T*, const T*, const T*, const T*,     \
                                   int64_t, int, int, int64_t, const Dropout&, T*, T*, T*);
SC_GPU_ATTN_INSTANTIATE(float)
SC_GPU_ATTN_INSTANTIATE(double)
#undef SC_GPU_ATTN_INSTANTIATE

}  // namespace shardcheck::gpu::ops

// Philox-4x32-10 draws matching reference/rng.hpp bit for bit (blocks and uniforms; normals to the
// last ulp of the device's log/cos), and RoPE matching reference/attention.cpp.
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "gpu/kernel_util.cuh"
#include "gpu/ops.hpp"
#include "gpu/philox.cuh"

namespace shardcheck::gpu::ops {
namespace {

using kernel::kThreads;

using kernel::cuda_ok;
using kernel::grid;

using detail::join;
using detail::philox;
using detail::PhiloxWords;

// kind 0: blocks (4 words per draw), 1: uniform, 2: normal
__global__ void draw(uint64_t seed, uint32_t stream, uint32_t step, uint64_t first, int64_t n,
                     int kind, void* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxWords w = philox(seed, stream, step, first + static_cast<uint64_t>(i));
    if (kind == 0) {
      auto* o = static_cast<uint32_t*>(out) + 4 * i;
      for (int k = 0; k < 4; ++k) o[k] = w.w[k];
    } else if (kind == 1) {
      static_cast<double*>(out)[i] = static_cast<double>(join(w.w[0], w.w[1]) >> 11) * 0x1.0p-53;
    } else {
      const double u1 = static_cast<double>((join(w.w[0], w.w[1]) >> 11) + 1) * 0x1.0p-53;
      const double u2 = static_cast<double>(join(w.w[2], w.w[3]) >> 11) * 0x1.0p-53;
      static_cast<double*>(out)[i] = sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
    }
  }
}

template <class T>
__global__ void rope(T* x, const int32_t* positions, int64_t s, int heads, int64_t d,
                     bool inverse) {
  const int64_t half = d / 2;
  const int64_t total = s * half;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / half, j = e % half;
    const double pos = positions[t];
    const double freq = pow(10000.0, -2.0 * static_cast<double>(j) / static_cast<double>(d));
    const double angle = (inverse ? -pos : pos) * freq;
    const T c = static_cast<T>(cos(angle)), sn = static_cast<T>(sin(angle));
    for (int h = 0; h < heads; ++h) {
      T* p = x + t * heads * d + h * d + 2 * j;
      const T a = p[0], b = p[1];
      p[0] = a * c - b * sn;
      p[1] = a * sn + b * c;
    }
  }
}

void launch_draw(Context& c, uint64_t seed, uint32_t stream, uint32_t step, uint64_t first,
                 int64_t n, int kind, void* out, const char* op) {
  if (n == 0) return;
  draw<<<grid(n), kThreads, 0, static_cast<cudaStream_t>(c.stream())>>>(seed, stream, step, first,
                                                                        n, kind, out);
  cuda_ok(cudaGetLastError(), op);
}

}  // namespace

void philox_blocks(Context& c, uint64_t seed, uint32_t stream, uint32_t step, uint64_t first,
                   uint32_t* out, int64_t n) {
  launch_draw(c, seed, stream, step, first, n, 0, out, "philox_blocks");
}
void rng_uniform(Context& c, uint64_t seed, uint32_t stream, uint32_t step, uint64_t first,
                 double* out, int64_t n) {
  launch_draw(c, seed, stream, step, first, n, 1, out, "rng_uniform");
}
void rng_normal(Context& c, uint64_t seed, uint32_t stream, uint32_t step, uint64_t first,
                double* out, int64_t n) {
  launch_draw(c, seed, stream, step, first, n, 2, out, "rng_normal");
}

template <class T>
void rope_apply(Context& c, T* x, const int32_t* positions, int64_t s, int heads, int64_t d,
                bool inverse) {
  if (d % 2 != 0) throw std::invalid_argument("gpu::ops::rope_apply: odd head dimension");
  if (s == 0) return;
  rope<<<grid(s * (d / 2)), kThreads, 0, static_cast<cudaStream_t>(c.stream())>>>(
      x, positions, s, heads, d, inverse);
  cuda_ok(cudaGetLastError(), "rope_apply");
}
template void rope_apply(Context&, float*, const int32_t*, int64_t, int, int64_t, bool);
template void rope_apply(Context&, double*, const int32_t*, int64_t, int, int64_t, bool);

}  // namespace shardcheck::gpu::ops

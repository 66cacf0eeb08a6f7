// Internal to gpu/ops: what every kernel file needs — the block size, the grid for n elements
// (kernels loop grid-stride over the rest) and CUDA error checking that names the op.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardcheck::gpu::ops::kernel {

inline constexpr int kThreads = 256;

inline void cuda_ok(cudaError_t e, const char* op) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("gpu::ops::") + op + ": " + cudaGetErrorString(e));
}

// Blocks of kThreads for n elements: at least 1, at most max_blocks.
inline unsigned grid(int64_t n, int64_t max_blocks = 65535) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

}  // namespace shardcheck::gpu::ops::kernel

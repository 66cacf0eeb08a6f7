// Element-wise kernels of the simulator: reduce contributions in rank order, chunk boundaries.
// Pure functions over raw typed pointers; no threads, no groups.
#pragma once

#include <cstddef>
#include <span>

#include "comm/communicator.hpp"

namespace shardcheck::sim {

// Chunk `i` of `n` over `count` elements: [begin, end), sizes differ by at most one.
struct Range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};
Range chunk(std::size_t count, int n, int i);

// For k in [0, count): value = op over srcs[0][k], srcs[1][k], ... in that order (avg divides the
// sum by srcs.size()); the same value is written to dsts[d][k] for every d. Floating types
// accumulate in their own precision (f64, f32) or f32 (bf16, f16) and round once. A dst may alias
// a src at the same index. `chunk_index` only matters under a test mutation.
void reduce_into(comm::DType dtype, comm::ReduceOp op, std::span<const void* const> srcs,
                 std::span<void* const> dsts, std::size_t count, int chunk_index = 0);

}  // namespace shardcheck::sim

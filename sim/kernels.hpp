// Element-wise kernels of the simulator: reduce contributions in rank order, chunk boundaries.
// Pure functions over raw typed pointers; no threads, no groups.
#pragma once

#include <cstddef>
#include <span>

#include "comm/communicator.hpp"
#include "sim/testing.hpp"

namespace shardcheck::sim {

// Chunk `i` of `n` over `count` elements: [begin, end), sizes differ by at most one.
struct Range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};
Range chunk(std::size_t count, int n, int i);

// Outputs at least this large are written with streaming (non-temporal) stores: the data goes to
// another rank's buffer that this core will not read again, so reading it into cache first (as a
// plain store does) would only add memory traffic.
inline constexpr std::size_t kStreamBytes = std::size_t{1} << 18;

// memcpy, or with `stream` a copy with non-temporal stores; call copy_fence() after the last
// streaming copy and before other threads may read the data.
void copy_bytes(void* dst, const void* src, std::size_t bytes, bool stream);
void copy_fence();

// For k in [0, count): value = op over srcs[0][k], srcs[1][k], ... in that order (avg divides the
// sum by srcs.size()); the same value is written to dsts[d][k] for every d. Floating types
// accumulate in their own precision (f64, f32) or f32 (bf16, f16) and round once. A dst may alias
// a src at the same index. `chunk_index` only matters for a planted bug (tests).
void reduce_into(comm::DType dtype, comm::ReduceOp op, std::span<const void* const> srcs,
                 std::span<void* const> dsts, std::size_t count, int chunk_index = 0,
                 testing::Mutation planted = testing::Mutation::none);

}  // namespace shardcheck::sim

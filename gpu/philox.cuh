// Device-side Philox-4x32-10 and the uniform draw, identical to reference/rng.cpp: counter
// (lo(index), hi(index), step, stream), key (lo(seed), hi(seed)). Internal to gpu/*.cu.
#pragma once

#include <cstdint>

namespace shardcheck::gpu::detail {

struct PhiloxWords {
  uint32_t w[4];
};

__device__ inline PhiloxWords philox(uint64_t seed, uint32_t stream, uint32_t step,
                                     uint64_t index) {
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32), c2 = step,
           c3 = stream;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9U;
      k1 += 0xBB67AE85U;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53U, c0), lo0 = 0xD2511F53U * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57U, c2), lo1 = 0xCD9E8D57U * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return {{c0, c1, c2, c3}};
}

__device__ inline uint64_t join(uint32_t hi, uint32_t lo) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// ref::RngStream::uniform: [0, 1) from 53 bits of words 0 and 1.
__device__ inline double philox_uniform(uint64_t seed, uint32_t stream, uint32_t step,
                                        uint64_t index) {
  const PhiloxWords w = philox(seed, stream, step, index);
  return static_cast<double>(join(w.w[0], w.w[1]) >> 11) * 0x1.0p-53;
}

}  // namespace shardcheck::gpu::detail

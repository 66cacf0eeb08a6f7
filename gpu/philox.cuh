// Philox-4x32-10, the uniform draw and the attention-dropout stream and index, identical to
// reference/rng.cpp and reference/attention.cpp: counter (lo(index), hi(index), step, stream), key
// (lo(seed), hi(seed)). Internal to gpu/*.cu; host and device, so a plain C++ test
// (tests/gpu/philox_host_test.cpp) pins these very functions against the reference without a GPU.
#pragma once

#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define SC_PHILOX_HD __host__ __device__
#else
#define SC_PHILOX_HD
#endif

namespace shardcheck::gpu::detail {

struct PhiloxWords {
  uint32_t w[4];
};

SC_PHILOX_HD inline PhiloxWords philox(uint64_t seed, uint32_t stream, uint32_t step,
                                       uint64_t index) {
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32), c2 = step,
           c3 = stream;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9U;
      k1 += 0xBB67AE85U;
    }
    // 32x32 -> 64-bit products (nvcc emits mul.hi/mul.lo for these).
    const uint64_t p0 = uint64_t{0xD2511F53U} * c0, p1 = uint64_t{0xCD9E8D57U} * c2;
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return {{c0, c1, c2, c3}};
}

SC_PHILOX_HD inline uint64_t join(uint32_t hi, uint32_t lo) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// ref::RngStream::uniform: [0, 1) from 53 bits of words 0 and 1.
SC_PHILOX_HD inline double philox_uniform(uint64_t seed, uint32_t stream, uint32_t step,
                                          uint64_t index) {
  const PhiloxWords w = philox(seed, stream, step, index);
  return static_cast<double>(join(w.w[0], w.w[1]) >> 11) * 0x1.0p-53;
}

// ref::stream_hash (FNV-1a, 32-bit), host only: the kernels get the hash as an argument.
inline uint32_t stream_hash(std::string_view name) {
  uint32_t h = 2166136261U;
  for (const char ch : name) {
    h ^= static_cast<uint8_t>(ch);
    h *= 16777619U;
  }
  return h;
}

// ref::AttentionDropoutMask's draw index of probability (global head, i, j) of `sequence`.
SC_PHILOX_HD inline uint64_t dropout_index(int64_t sequence, int64_t total_heads, int64_t head,
                                           int64_t s, int64_t i, int64_t j) {
  return static_cast<uint64_t>(((sequence * total_heads + head) * s + i) * s + j);
}

// ref::AttentionDropoutMask::scale: 1 at rate <= 0, else 0 (dropped) or 1 / (1 - rate) (kept).
SC_PHILOX_HD inline double dropout_scale(double rate, uint64_t seed, uint32_t stream, uint32_t step,
                                         uint64_t index) {
  if (rate <= 0.0) return 1.0;
  return philox_uniform(seed, stream, step, index) >= rate ? 1.0 / (1.0 - rate) : 0.0;
}

}  // namespace shardcheck::gpu::detail

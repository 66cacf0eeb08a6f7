// Counter-based randomness: Philox-4x32-10 (the cuRAND / PyTorch GPU generator), keyed so that any
// element of any stream can be drawn on its own. Not a sequential generator: there is no state.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace shardcheck::ref {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Random123 philox4x32 with 10 rounds.
PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key);

// FNV-1a 32-bit of a stream name ("embed.weight", "dropout/layers.3", "data/tokens", ...).
uint32_t stream_hash(std::string_view name);

// One draw = one Philox block: key (lo32(seed), hi32(seed)),
// counter (lo32(index), hi32(index), step, stream_hash(stream)).
struct RngStream {
  uint64_t seed = 0;
  uint32_t stream = 0;
  uint32_t step = 0;

  static RngStream of(uint64_t seed, std::string_view name, uint32_t step = 0) {
    return {seed, stream_hash(name), step};
  }
  PhiloxCounter block(uint64_t index) const;
  // [0, 1) with 53 random bits from words 0 and 1.
  double uniform(uint64_t index) const;
  // Standard normal by Box-Muller: u1 from words 0,1 (in (0, 1]), u2 from words 2,3.
  double normal(uint64_t index) const;
  // Uniform integer in [0, n) (64-bit word modulo n; the bias is irrelevant for n << 2^64).
  uint64_t below(uint64_t index, uint64_t n) const;
};

}  // namespace shardcheck::ref

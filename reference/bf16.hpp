// bfloat16 rounding for the mixed-precision recipe: values stay in float, rounded to the nearest
// bf16 (ties to even). Not a storage type; the reference only needs the rounding.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "reference/tensor.hpp"

namespace shardcheck::ref {

inline float round_to_bf16(float x) {
  if (std::isnan(x)) return x;
  uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7FFFu + lsb;  // round to nearest, ties to even; overflow carries into the exponent
  bits &= 0xFFFF0000u;
  return std::bit_cast<float>(bits);
}

inline void round_to_bf16(ParamMap<float>& m) {
  for (auto& e : m)
    for (float& v : e.value.vec()) v = round_to_bf16(v);
}

}  // namespace shardcheck::ref

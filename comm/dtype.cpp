// Element sizes and names, and the bf16/f16 <-> float conversions (round to nearest even).
// The conversions are bit manipulation on purpose: no compiler extension, same code on host and
// device.
#include "comm/dtype.hpp"

#include <bit>
#include <cstring>

namespace shardcheck::comm {

std::size_t size_of(DType t) {
  return visit_dtype(t, [](auto v) { return sizeof(v); });
}

std::string_view name_of(DType t) {
  switch (t) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (name_of(t) == name) return t;
  return std::nullopt;
}

bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

bf16::bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet NaN payload
    bits = static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    return;
  }
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  bits = static_cast<std::uint16_t>((u + rounding) >> 16);
}

bf16::operator float() const {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

f16::f16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN
    bits = static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    return;
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to infinity (also maps inf to inf)
    bits = static_cast<std::uint16_t>(sign | 0x7c00u);
    return;
  }
  if (abs >= 0x38800000u) {  // normal half: rebias exponent 127 -> 15, round 13 dropped bits
    const std::uint32_t rebased = abs - 0x38000000u;
    const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
    bits = static_cast<std::uint16_t>(sign | (rounded >> 13));
    return;
  }
  if (abs < 0x33000000u) {  // below half the smallest subnormal (2^-25): rounds to zero
    bits = static_cast<std::uint16_t>(sign);
    return;
  }
  // Subnormal half: value = m * 2^-24 with the implicit bit made explicit, shifted into place.
  const std::uint32_t exp = abs >> 23;
  const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - exp;  // value = mant * 2^(exp-150) = k * 2^-24
  const std::uint32_t half_ulp = 1u << (shift - 1);
  const std::uint32_t kept = mant >> shift;
  const std::uint32_t rest = mant & ((1u << shift) - 1u);
  std::uint32_t result = kept;
  if (rest > half_ulp || (rest == half_ulp && (kept & 1u))) ++result;
  bits = static_cast<std::uint16_t>(sign | result);
}

f16::operator float() const {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  std::uint32_t mant = bits & 0x3ffu;
  std::uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    out = sign;
  } else {  // subnormal: normalise
    std::uint32_t e = 113u;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    out = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(out);
}

}  // namespace shardcheck::comm

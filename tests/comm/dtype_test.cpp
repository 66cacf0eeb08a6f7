// bf16/f16 conversions: exhaustive round trips, and float -> f16 checked against the compiler's
// _Float16 where it exists; dtype names and sizes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "comm/dtype.hpp"

namespace shardcheck::comm {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(size_of(DType::f64), 8u);
  EXPECT_EQ(size_of(DType::bf16), 2u);
  EXPECT_EQ(size_of(DType::u8), 1u);
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(name_of(t)), t);
  EXPECT_FALSE(parse_dtype("f8").has_value());
}

TEST(DType, Bf16RoundTripsEveryPattern) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const bf16 v = bf16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(v);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(bf16(f))));
      continue;
    }
    ASSERT_EQ(bf16(f).bits, b) << "bits " << b;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(static_cast<float>(bf16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3*2^-8 lies between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to the even one.
  EXPECT_EQ(static_cast<float>(bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(static_cast<float>(bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isinf(static_cast<float>(bf16(std::numeric_limits<float>::max()))));
}

TEST(DType, F16RoundTripsEveryPattern) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const f16 v = f16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(v);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(f16(f))));
      continue;
    }
    ASSERT_EQ(f16(f).bits, b) << "bits " << b;
  }
}

#ifdef __FLT16_MAX__
TEST(DType, F16MatchesCompilerFloat16) {
  // Every float whose low 13 mantissa bits take a pattern that exercises rounding (ties, above,
  // below), over the whole exponent range: the hand conversion must agree with _Float16.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff};
  for (std::uint32_t hi = 0; hi < (1u << 19); ++hi)
    for (std::uint32_t lo : lows) {
      const std::uint32_t u = (hi << 13) | lo;
      const float f = std::bit_cast<float>(u);
      if (std::isnan(f)) continue;
      const _Float16 h = static_cast<_Float16>(f);
      ASSERT_EQ(f16(f).bits, std::bit_cast<std::uint16_t>(h)) << std::hexfloat << f;
      ASSERT_EQ(static_cast<float>(f16::from_bits(std::bit_cast<std::uint16_t>(h))),
                static_cast<float>(h));
    }
}
#else
TEST(DType, F16MatchesCompilerFloat16) {
  GTEST_SKIP() << "compiler has no _Float16 to compare with";
}
#endif

}  // namespace
}  // namespace shardcheck::comm

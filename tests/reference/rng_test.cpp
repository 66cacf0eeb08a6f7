// Philox known answers and the properties the rest of the project relies on: draws depend only on
// (seed, stream, step, index), so slices and shards reproduce the full tensor.
#include "reference/rng.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

namespace shardcheck::ref {
namespace {

TEST(Philox, KnownAnswerZero) {
  const PhiloxCounter out = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
}

TEST(Philox, KnownAnswerOnes) {
  const PhiloxCounter out = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                          {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(out[0], 0x408f276du);
  EXPECT_EQ(out[1], 0x41c83b0eu);
  EXPECT_EQ(out[2], 0xa20bc7c6u);
  EXPECT_EQ(out[3], 0x6d5451fdu);
}

TEST(Philox, KnownAnswerPi) {
  const PhiloxCounter out = philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                          {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(out[0], 0xd16cfe09u);
  EXPECT_EQ(out[1], 0x94fdccebu);
  EXPECT_EQ(out[2], 0x5001e420u);
  EXPECT_EQ(out[3], 0x24126ea1u);
}

TEST(RngStream, NormalMomentsAreStandard) {
  const RngStream rng = RngStream::of(7, "moments");
  const int n = 200000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    const double z = rng.normal(static_cast<uint64_t>(i));
    sum += z;
    sq += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.01);
}

TEST(RngStream, StreamsStepsAndSeedsDiffer) {
  const RngStream a = RngStream::of(1, "a"), b = RngStream::of(1, "b"), a2 = RngStream::of(2, "a");
  const RngStream a_step = RngStream::of(1, "a", 3);
  EXPECT_NE(a.uniform(0), b.uniform(0));
  EXPECT_NE(a.uniform(0), a2.uniform(0));
  EXPECT_NE(a.uniform(0), a_step.uniform(0));
  EXPECT_NE(a.uniform(0), a.uniform(1));
}

RC_GTEST_PROP(RngStream, UniformInUnitIntervalAndPure, (uint64_t seed, uint64_t index)) {
  const RngStream rng = RngStream::of(seed, "prop");
  const double u = rng.uniform(index);
  RC_ASSERT(u >= 0.0);
  RC_ASSERT(u < 1.0);
  RC_ASSERT(u == RngStream::of(seed, "prop").uniform(index));
  RC_ASSERT(std::isfinite(rng.normal(index)));
}

}  // namespace
}  // namespace shardcheck::ref

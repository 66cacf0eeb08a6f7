// Philox-4x32-10 and the draws built on it. Constants from Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3" (SC'11); the known-answer test in tests/reference/rng_test.cpp pins them.
#include "reference/rng.hpp"

#include <cmath>
#include <numbers>

namespace shardcheck::ref {
namespace {
constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;
constexpr uint32_t kW1 = 0xBB67AE85u;

PhiloxCounter round(const PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = uint64_t{kM0} * c[0];
  const uint64_t p1 = uint64_t{kM1} * c[2];
  const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

uint64_t join(uint32_t hi, uint32_t lo) {
  return (uint64_t{hi} << 32) | lo;
}
}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    ctr = round(ctr, key);
  }
  return ctr;
}

uint32_t stream_hash(std::string_view name) {
  uint32_t h = 2166136261u;
  for (char ch : name) {
    h ^= static_cast<uint8_t>(ch);
    h *= 16777619u;
  }
  return h;
}

PhiloxCounter RngStream::block(uint64_t index) const {
  return philox4x32_10(
      {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), step, stream},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

double RngStream::uniform(uint64_t index) const {
  const PhiloxCounter w = block(index);
  return static_cast<double>(join(w[0], w[1]) >> 11) * 0x1.0p-53;
}

double RngStream::normal(uint64_t index) const {
  const PhiloxCounter w = block(index);
  const double u1 = static_cast<double>((join(w[0], w[1]) >> 11) + 1) * 0x1.0p-53;
  const double u2 = static_cast<double>(join(w[2], w[3]) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t RngStream::below(uint64_t index, uint64_t n) const {
  const PhiloxCounter w = block(index);
  return join(w[0], w[1]) % n;
}

}  // namespace shardcheck::ref

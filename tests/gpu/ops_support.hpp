// For the tests of gpu/ops: a fresh random seed per run (printed by the tests on failure) and a
// fixture that skips without a device, seeds its generator and holds an ops::Context on GPU 0.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>

#include "gpu/ops.hpp"
#include "tests/gpu/support.hpp"

namespace shardcheck::gpu::testing {

inline std::uint64_t fresh_seed() {
  return (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

class SeededGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SC_REQUIRE_GPU();
    seed_ = fresh_seed();
    gen_.seed(seed_);
    ctx_ = std::make_unique<ops::Context>(0);
  }
  std::uint64_t seed_ = 0;
  std::mt19937_64 gen_;
  std::unique_ptr<ops::Context> ctx_;
};

}  // namespace shardcheck::gpu::testing

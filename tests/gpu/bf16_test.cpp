// bf16 on the device (the bf16 section of gpu/ops.hpp) against the CPU reference:
// - round_to_bf16 / to_bf16 / from_bf16 bit for bit (ref::round_to_bf16, comm::bf16) on random bit
//   patterns, exact ties, subnormals, +-0, +-inf, NaNs and values that round up to inf;
// - the tensor-core GEMMs within the bounds stated in gpu/ops.hpp, componentwise: against the
//   exact (f64) product of the same bf16 inputs, |gpu - exact| <= k 2^-22 (|a|.|b|), and against
//   the exact product of the unrounded f32 inputs, <= (2^-7 + 2^-14 + k 2^-21) (|a|.|b|).
// Fresh random inputs (the seed is printed on failure), outputs poisoned (all bits set: NaN) before
// each op. Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "comm/dtype.hpp"
#include "gpu/ops.hpp"
#include "reference/bf16.hpp"
#include "reference/ops.hpp"
#include "tests/gpu/ops_support.hpp"
#include "tests/gpu/support.hpp"

namespace shardcheck::gpu {
namespace {

using testing::DeviceVec;

using testing::fresh_seed;

float from_bits(std::uint32_t u) {
  return std::bit_cast<float>(u);
}
std::uint32_t bits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}
std::uint16_t bf16_bits(float rounded) {  // rounded: already ref::round_to_bf16'd, not NaN
  return static_cast<std::uint16_t>(bits(rounded) >> 16);
}

// The hard cases first, then random bit patterns (every class: normals, subnormals, inf, NaN).
std::vector<float> rounding_cases(std::mt19937_64& g, std::size_t random_count) {
  std::vector<std::uint32_t> u = {
      0x00000000U, 0x80000000U,                            // +-0
      0x7F800000U, 0xFF800000U,                            // +-inf
      0x7FC00000U, 0xFFC00000U, 0x7F800001U, 0xFF800001U,  // quiet / signalling NaNs
      0x7FBF8000U, 0x7F80FFFFU,                            // NaNs whose round-up would change
      0x7F7FFFFFU, 0xFF7FFFFFU,                            // +-FLT_MAX -> +-inf
      0x7F7F8000U, 0xFF7F8000U,                            // tie, odd -> up -> +-inf
      0x7F7F7FFFU, 0x7F7E8000U,                            // just below a tie; tie, even -> down
      0x3F808000U, 0x3F818000U, 0xBF808000U, 0xBF818000U,  // ties: even stays, odd goes up
      0x3F807FFFU, 0x3F808001U,                            // either side of a tie
      0x00000001U, 0x80000001U, 0x00008000U, 0x00018000U,  // subnormals: tiny, ties
      0x007FFFFFU, 0x807FFFFFU, 0x007F8000U, 0x00800000U,  // largest subnormal -> normal, min
      0x3F800000U, 0x40490FDBU,                            // 1, pi
  };
  std::uniform_int_distribution<std::uint32_t> any;
  for (std::size_t i = 0; i < random_count; ++i) u.push_back(any(g));
  // Random exact ties (low half 0x8000) in every binade.
  for (std::size_t i = 0; i < 1024; ++i) u.push_back((any(g) & 0xFFFF0000U) | 0x8000U);
  std::vector<float> f(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) f[i] = from_bits(u[i]);
  return f;
}

class GpuBf16 : public testing::SeededGpuTest {};

TEST_F(GpuBf16, RoundToBf16IsTheReferenceBitForBit) {
  const std::vector<float> x = rounding_cases(gen_, 100'003);  // not a multiple of the block
  DeviceVec<float> d(x);
  ops::round_to_bf16(*ctx_, d.data(), static_cast<int64_t>(x.size()));
  ops::round_to_bf16(*ctx_, d.data(), 0);  // nothing to do, no launch error
  ctx_->synchronize();
  const std::vector<float> got = d.download();
  int bad = 0;
  for (std::size_t i = 0; i < x.size() && bad < 10; ++i) {
    const std::uint32_t want = bits(ref::round_to_bf16(x[i]));
    if (bits(got[i]) != want) {
      ++bad;
      ADD_FAILURE() << std::hex << "x bits 0x" << bits(x[i]) << ": got 0x" << bits(got[i])
                    << ", want 0x" << want << std::dec << " (seed " << seed_ << ")";
    }
  }
  // The documented overflow: the largest floats round to inf.
  EXPECT_EQ(ref::round_to_bf16(3.4028235e38F), std::numeric_limits<float>::infinity());
}

TEST_F(GpuBf16, ConversionsAreTheReferenceRoundingBitForBit) {
  const std::vector<float> x = rounding_cases(gen_, 50'001);
  const auto n = static_cast<int64_t>(x.size());
  DeviceVec<float> dx(x), back(x.size());
  DeviceVec<std::uint16_t> b(x.size());
  b.poison();
  back.poison();
  ops::to_bf16(*ctx_, dx.data(), b.data(), n);
  ops::from_bf16(*ctx_, b.data(), back.data(), n);
  ctx_->synchronize();
  const std::vector<std::uint16_t> got = b.download();
  const std::vector<float> got_back = back.download();
  int bad = 0;
  for (std::size_t i = 0; i < x.size() && bad < 10; ++i) {
    const bool nan = std::isnan(x[i]);
    const bool ok = got[i] == comm::bf16(x[i]).bits &&
                    (nan ? (got[i] & 0x7F80U) == 0x7F80U && (got[i] & 0x007FU) != 0 &&
                               (got[i] >> 15) == (bits(x[i]) >> 31)
                         : got[i] == bf16_bits(ref::round_to_bf16(x[i])) &&
                               bits(got_back[i]) == bits(ref::round_to_bf16(x[i]))) &&
                    bits(got_back[i]) == static_cast<std::uint32_t>(got[i]) << 16;
    if (!ok) {
      ++bad;
      ADD_FAILURE() << std::hex << "x bits 0x" << bits(x[i]) << ": to_bf16 0x" << got[i]
                    << ", back 0x" << bits(got_back[i]) << std::dec << " (seed " << seed_ << ")";
    }
  }
}

TEST_F(GpuBf16, FromBf16IsExactForEveryPattern) {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  DeviceVec<std::uint16_t> d(all);
  DeviceVec<float> y(all.size());
  y.poison();
  ops::from_bf16(*ctx_, d.data(), y.data(), static_cast<int64_t>(all.size()));
  ctx_->synchronize();
  const std::vector<float> got = y.download();
  for (std::size_t i = 0; i < all.size(); ++i)
    ASSERT_EQ(bits(got[i]), static_cast<std::uint32_t>(i) << 16) << "pattern " << i;
}

// ---- GEMMs -------------------------------------------------------------------------------------

ref::Tensor<float> random_f32(ref::Shape shape, std::mt19937_64& g, double scale = 1.0) {
  ref::Tensor<float> t(std::move(shape));
  std::normal_distribution<double> d(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(d(g));
  return t;
}
ref::Tensor<float> rounded(ref::Tensor<float> t) {
  for (float& v : t.vec()) v = ref::round_to_bf16(v);
  return t;
}
std::vector<std::uint16_t> bf16_of(const ref::Tensor<float>& rounded_t) {
  std::vector<std::uint16_t> b(rounded_t.vec().size());
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = bf16_bits(rounded_t.vec()[i]);
  return b;
}
ref::Tensor<double> wide(const ref::Tensor<float>& t) {
  return t.cast<double>();
}
ref::Tensor<double> wide_abs(const ref::Tensor<float>& t) {
  ref::Tensor<double> a = t.cast<double>();
  for (double& v : a.vec()) v = std::abs(v);
  return a;
}

// The stated bounds (gpu/ops.hpp), per element, as multiples of (|a|.|b|) for inner dimension k.
double bound_same_inputs(int64_t k) {
  return static_cast<double>(k) * std::ldexp(1.0, -22);
}
double bound_f32_inputs(int64_t k) {
  return std::ldexp(1.0, -7) + std::ldexp(1.0, -14) + static_cast<double>(k) * std::ldexp(1.0, -21);
}

// Every element of got within tol * scale[i] of exact[i] (and written: not the NaN poison).
void expect_within(const std::vector<float>& got, const ref::Tensor<double>& exact,
                   const ref::Tensor<double>& scale, double tol, const std::string& what,
                   std::uint64_t seed) {
  ASSERT_EQ(got.size(), exact.vec().size()) << what;
  double worst = 0;  // the largest |error| / scale seen, reported against tol
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - exact.vec()[i]);
    const double allowed = tol * scale.vec()[i];
    if (scale.vec()[i] > 0) worst = std::max(worst, err / scale.vec()[i]);
    if (!(err <= allowed) && bad++ < 5)  // NaN fails too
      ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << ", exact " << exact.vec()[i]
                    << ", |err| " << err << " > " << allowed << " (seed " << seed << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of bound, worst |err|/scale " << worst
                    << " vs " << tol;
}

struct GemmCase {
  int64_t rows, in, out;
};

TEST_F(GpuBf16, LinearWithinStatedBounds) {
  // Aligned, odd (no tensor-core-friendly multiple) and long-k shapes.
  for (const GemmCase s : {GemmCase{37, 64, 48}, GemmCase{5, 129, 33}, GemmCase{96, 1024, 72}}) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " in " + std::to_string(s.in) + " out " +
                 std::to_string(s.out));
    const auto x = random_f32({s.rows, s.in}, gen_), w = random_f32({s.in, s.out}, gen_, 0.2),
               dy = random_f32({s.rows, s.out}, gen_), dw0 = random_f32({s.in, s.out}, gen_);
    const auto xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
    DeviceVec<std::uint16_t> bx(bf16_of(xr)), bw(bf16_of(wr)), bdy(bf16_of(dyr));
    DeviceVec<float> y(static_cast<std::size_t>(s.rows * s.out)),
        dx(static_cast<std::size_t>(s.rows * s.in)), dw(dw0.vec());
    y.poison();
    dx.poison();
    ops::linear_forward_bf16(*ctx_, bx.data(), bw.data(), y.data(), s.rows, s.in, s.out);
    ops::linear_backward_bf16(*ctx_, bdy.data(), bx.data(), bw.data(), dx.data(), dw.data(), s.rows,
                              s.in, s.out);
    ctx_->synchronize();
    const std::vector<float> gy = y.download(), gdx = dx.download(), gdw = dw.download();

    // Exact results and scales |a|.|b| in f64 from the bf16-rounded inputs, then the unrounded.
    for (const bool same : {true, false}) {
      const auto& [xs, ws, dys] = same ? std::tie(xr, wr, dyr) : std::tie(x, w, dy);
      const std::string tag = same ? " (same bf16 inputs)" : " (unrounded f32 inputs)";
      ref::Tensor<double> dw_exact = wide(dw0), dw_scale = wide_abs(dw0);
      const auto y_exact = ref::linear_forward(wide(xs), wide(ws));
      const auto y_scale = ref::linear_forward(wide_abs(xs), wide_abs(ws));
      const auto dx_exact = ref::linear_backward(wide(dys), wide(xs), wide(ws), dw_exact);
      const auto dx_scale =
          ref::linear_backward(wide_abs(dys), wide_abs(xs), wide_abs(ws), dw_scale);
      const auto tol = same ? bound_same_inputs : bound_f32_inputs;
      expect_within(gy, y_exact, y_scale, tol(s.in), "y" + tag, seed_);
      expect_within(gdx, dx_exact, dx_scale, tol(s.out), "dx" + tag, seed_);
      expect_within(gdw, dw_exact, dw_scale, tol(s.rows + 1), "dw" + tag, seed_);
    }
  }
}

TEST_F(GpuBf16, LinearTWithinStatedBounds) {
  for (const GemmCase s : {GemmCase{37, 64, 48}, GemmCase{5, 129, 33}, GemmCase{96, 1024, 72}}) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " in " + std::to_string(s.in) + " out " +
                 std::to_string(s.out));
    const auto x = random_f32({s.rows, s.in}, gen_), w = random_f32({s.out, s.in}, gen_, 0.2),
               dy = random_f32({s.rows, s.out}, gen_), dw0 = random_f32({s.out, s.in}, gen_);
    const auto xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
    DeviceVec<std::uint16_t> bx(bf16_of(xr)), bw(bf16_of(wr)), bdy(bf16_of(dyr));
    DeviceVec<float> y(static_cast<std::size_t>(s.rows * s.out)),
        dx(static_cast<std::size_t>(s.rows * s.in)), dw(dw0.vec());
    y.poison();
    dx.poison();
    ops::linear_t_forward_bf16(*ctx_, bx.data(), bw.data(), y.data(), s.rows, s.in, s.out);
    ops::linear_t_backward_bf16(*ctx_, bdy.data(), bx.data(), bw.data(), dx.data(), dw.data(),
                                s.rows, s.in, s.out);
    ctx_->synchronize();
    const std::vector<float> gy = y.download(), gdx = dx.download(), gdw = dw.download();
    for (const bool same : {true, false}) {
      const auto& [xs, ws, dys] = same ? std::tie(xr, wr, dyr) : std::tie(x, w, dy);
      const std::string tag = same ? " (same bf16 inputs)" : " (unrounded f32 inputs)";
      ref::Tensor<double> dw_exact = wide(dw0), dw_scale = wide_abs(dw0);
      const auto y_exact = ref::linear_t_forward(wide(xs), wide(ws));
      const auto y_scale = ref::linear_t_forward(wide_abs(xs), wide_abs(ws));
      const auto dx_exact = ref::linear_t_backward(wide(dys), wide(xs), wide(ws), dw_exact);
      const auto dx_scale =
          ref::linear_t_backward(wide_abs(dys), wide_abs(xs), wide_abs(ws), dw_scale);
      const auto tol = same ? bound_same_inputs : bound_f32_inputs;
      expect_within(gy, y_exact, y_scale, tol(s.in), "y" + tag, seed_);
      expect_within(gdx, dx_exact, dx_scale, tol(s.out), "dx" + tag, seed_);
      expect_within(gdw, dw_exact, dw_scale, tol(s.rows + 1), "dw" + tag, seed_);
    }
  }
}

}  // namespace
}  // namespace shardcheck::gpu

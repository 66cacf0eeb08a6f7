// The device code's index math and draws, checked on the host (no GPU needed, these always run):
// - gpu/philox.cuh (the very functions the kernels call, compiled for the host) against
//   reference/rng.cpp and the attention-dropout mask of reference/attention.cpp, bit for bit;
// - gpu/gemm_plan.hpp (the cuBLAS calls behind the linear ops) through a host emulation of
//   cuBLAS's column-major GEMM, with its argument checks and every access bounds-checked, against
//   ref::linear_* / ref::linear_t_* (f64, within 1e-12: only the summation order may differ).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/gemm_plan.hpp"
#include "gpu/philox.cuh"
#include "reference/attention.hpp"
#include "reference/ops.hpp"
#include "reference/rng.hpp"

namespace shardcheck::gpu {
namespace {

TEST(HostPhilox, BlocksAndUniformsAreBitwiseTheReference) {
  // Random123's known answer for counter 0, key 0.
  const detail::PhiloxWords zero = detail::philox(0, 0, 0, 0);
  EXPECT_EQ(zero.w[0], 0x6627e8d5U);
  EXPECT_EQ(zero.w[3], 0x9b00dbd8U);
  std::mt19937_64 g(12345);
  for (int trial = 0; trial < 200; ++trial) {
    const uint64_t seed = g();
    const auto rs = ref::RngStream{seed, static_cast<uint32_t>(g()), static_cast<uint32_t>(g())};
    // Indices around the 32-bit boundary and anywhere.
    const uint64_t index = trial % 2 == 0 ? (uint64_t{1} << 32) - 3 + (g() % 6) : g();
    const detail::PhiloxWords w = detail::philox(rs.seed, rs.stream, rs.step, index);
    const ref::PhiloxCounter want = rs.block(index);
    for (std::size_t k = 0; k < 4; ++k) ASSERT_EQ(w.w[k], want[k]) << "trial " << trial;
    ASSERT_EQ(detail::philox_uniform(rs.seed, rs.stream, rs.step, index), rs.uniform(index));
  }
}

TEST(HostPhilox, StreamHashIsTheReference) {
  for (const char* name : {"", "dropout/layers.0", "dropout/layers.17", "embed.weight"})
    EXPECT_EQ(detail::stream_hash(name), ref::stream_hash(name)) << name;
}

// The kernels' dropout multiplier (attention.cu: drop_of + drop_scale) for local head h.
double device_drop(const ref::AttentionDropout& d, int local_heads, int64_t s, int h, int64_t i,
                   int64_t j) {
  const int total = d.total_heads > 0 ? d.total_heads : local_heads;
  const uint32_t stream = detail::stream_hash("dropout/layers." + std::to_string(d.layer));
  return detail::dropout_scale(
      d.rate, d.seed, stream, d.step,
      detail::dropout_index(d.sequence, total, d.head_offset + h, s, i, j));
}

TEST(HostPhilox, AttentionDropoutMaskIsTheReference) {
  const int64_t s = 13;
  for (const double rate : {0.0, 0.1, 0.5}) {
    for (const int head_offset : {0, 2}) {
      ref::AttentionDropout d;
      d.rate = rate;
      d.seed = 0x1234567890ABCDEFULL;
      d.layer = 3;
      d.step = 7;
      d.sequence = 5;
      d.head_offset = head_offset;
      d.total_heads = head_offset > 0 ? 6 : 0;  // a TP shard of 2 heads of 6, or all 2 local
      const int local = 2;
      const ref::AttentionDropoutMask mask(d, d.total_heads > 0 ? d.total_heads : local, s);
      int dropped = 0;
      for (int h = 0; h < local; ++h)
        for (int64_t i = 0; i < s; ++i)
          for (int64_t j = 0; j < s; ++j) {
            const double want = mask.scale(head_offset + h, i, j);
            ASSERT_EQ(device_drop(d, local, s, h, i, j), want) << rate << " " << h << " " << i;
            dropped += want == 0.0 ? 1 : 0;
          }
      if (rate == 0.5) {
        EXPECT_GT(dropped, 0);
      }
    }
  }
}

// cuBLAS's column-major GEMM on host buffers: its argument checks (CUBLAS_STATUS_INVALID_VALUE)
// and a bounds check on every element read or written.
struct HostBuffers {
  std::map<detail::Operand, std::vector<double>*> buf;
  double& at(detail::Operand o, int64_t idx) {
    std::vector<double>& v = *buf.at(o);
    if (idx < 0 || idx >= static_cast<int64_t>(v.size()))
      throw std::out_of_range("GEMM plan reads or writes outside an operand");
    return v[static_cast<std::size_t>(idx)];
  }
};

void emulate(const detail::GemmPlan& g, HostBuffers& b) {
  const int64_t a_rows = g.trans_a ? g.k : g.m, b_rows = g.trans_b ? g.n : g.k;
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.lda < std::max<int64_t>(1, a_rows) ||
      g.ldb < std::max<int64_t>(1, b_rows) || g.ldc < std::max<int64_t>(1, g.m))
    throw std::invalid_argument("cuBLAS would return CUBLAS_STATUS_INVALID_VALUE");
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      double acc = 0;
      for (int64_t l = 0; l < g.k; ++l) {
        const double av = b.at(g.a, g.trans_a ? l + i * g.lda : i + l * g.lda);
        const double bv = b.at(g.b, g.trans_b ? j + l * g.ldb : l + j * g.ldb);
        acc += av * bv;
      }
      double& c = b.at(g.c, i + j * g.ldc);
      c = g.accumulate ? c + acc : acc;
    }
}

ref::Tensor<double> random_f64(ref::Shape shape, std::mt19937_64& g) {
  ref::Tensor<double> t(std::move(shape));
  std::normal_distribution<double> d;
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = d(g);
  return t;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(HostGemmPlan, LinearOpsThroughEmulatedCublasAreTheReference) {
  using detail::Operand;
  std::mt19937_64 gen(7);
  const int64_t shapes[][3] = {{5, 3, 4}, {1, 7, 2}, {6, 1, 3}, {4, 5, 1}, {8, 8, 8}};
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], in = sh[1], out = sh[2];
    const std::string where =
        std::to_string(rows) + "x" + std::to_string(in) + "->" + std::to_string(out);
    const auto x = random_f64({rows, in}, gen), dy = random_f64({rows, out}, gen);
    for (const bool transposed : {false, true}) {
      const auto w = transposed ? random_f64({out, in}, gen) : random_f64({in, out}, gen);
      const auto dw0 = random_f64(w.shape(), gen);
      std::vector<double> xv = x.vec(), wv = w.vec(), dyv = dy.vec();
      std::vector<double> y(static_cast<std::size_t>(rows * out), NAN),
          dx(static_cast<std::size_t>(rows * in), NAN), dw = dw0.vec();
      HostBuffers b;
      b.buf = {{Operand::x, &xv}, {Operand::w, &wv},  {Operand::dy, &dyv},
               {Operand::y, &y},  {Operand::dx, &dx}, {Operand::dw, &dw}};
      ref::Tensor<double> dw_ref = dw0;
      if (transposed) {
        emulate(detail::linear_t_forward_plan(rows, in, out), b);
        for (const auto& p : detail::linear_t_backward_plans(rows, in, out)) emulate(p, b);
        EXPECT_LE(max_diff(y, ref::linear_t_forward(x, w).vec()), 1e-12) << where;
        EXPECT_LE(max_diff(dx, ref::linear_t_backward(dy, x, w, dw_ref).vec()), 1e-12) << where;
      } else {
        emulate(detail::linear_forward_plan(rows, in, out), b);
        for (const auto& p : detail::linear_backward_plans(rows, in, out)) emulate(p, b);
        EXPECT_LE(max_diff(y, ref::linear_forward(x, w).vec()), 1e-12) << where;
        EXPECT_LE(max_diff(dx, ref::linear_backward(dy, x, w, dw_ref).vec()), 1e-12) << where;
      }
      EXPECT_LE(max_diff(dw, dw_ref.vec()), 1e-12) << where << (transposed ? " (t)" : "");
    }
  }
}

TEST(HostGemmPlan, OperandLookupCoversEveryRole) {
  using detail::Operand;
  const double in[3] = {1, 2, 3};
  double out[3] = {};
  detail::GemmOperands<double, double> p;
  p.x = &in[0];
  p.w = &in[1];
  p.dy = &in[2];
  p.y = &out[0];
  p.dx = &out[1];
  p.dw = &out[2];
  EXPECT_EQ(p.in(Operand::x), &in[0]);
  EXPECT_EQ(p.in(Operand::w), &in[1]);
  EXPECT_EQ(p.in(Operand::dy), &in[2]);
  EXPECT_EQ(p.in(Operand::y), nullptr);
  EXPECT_EQ(p.out(Operand::y), &out[0]);
  EXPECT_EQ(p.out(Operand::dx), &out[1]);
  EXPECT_EQ(p.out(Operand::dw), &out[2]);
  EXPECT_EQ(p.out(Operand::x), nullptr);
}

}  // namespace
}  // namespace shardcheck::gpu

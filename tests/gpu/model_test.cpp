// A full dense model step (forward + backward of one packed sequence) on the GPU against
// ref::forward_backward: per-token losses and every parameter gradient, f64 within 1e-10 and f32
// within 1e-4 normwise relative error (a whole model's chain of ops, not one op). Dropout on, two
// documents in the sequence, tied and untied heads. Also the bf16 recipe's step (bounds stated at
// its test). Skips without a device.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gpu/model.hpp"
#include "reference/bf16.hpp"
#include "reference/model.hpp"
#include "tests/gpu/support.hpp"

namespace shardcheck::gpu {
namespace {

template <class T>
constexpr double kModelTol = std::is_same_v<T, float> ? 1e-4 : 1e-10;

// Two documents (9 and 7 tokens) packed into one sequence of 16.
ref::Sequence two_documents(const ref::ModelConfig& cfg, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<std::int32_t> tok(0, cfg.vocab - 1);
  ref::Sequence s;
  const int lens[] = {9, cfg.seq_len - 9};
  for (int doc = 0; doc < 2; ++doc) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(lens[doc]));
    for (auto& v : t) v = tok(g);
    for (int i = 0; i < lens[doc]; ++i) {
      const bool last = i + 1 == lens[doc];
      s.tokens.push_back(t[static_cast<std::size_t>(i)]);
      s.targets.push_back(last ? 0 : t[static_cast<std::size_t>(i) + 1]);
      s.loss_mask.push_back(last ? 0 : 1);
      s.doc_ids.push_back(doc);
      s.positions.push_back(i);
    }
  }
  s.index = 3;
  return s;
}

template <class T>
double rel(const ref::Tensor<T>& got, const ref::Tensor<T>& want) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isnan(static_cast<double>(got[i]))) return INFINITY;
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class T>
void check_step(bool tied) {
  ref::ModelConfig cfg;
  cfg.dropout = 0.1;
  cfg.tie_embeddings = tied;
  const std::uint64_t seed = std::random_device{}();
  const ref::ParamMap<T> params = ref::init_params<T>(cfg, seed);
  const ref::Sequence seq = two_documents(cfg, seed);
  ref::StepContext ctx;
  ctx.seed = seed;
  ctx.step = 2;
  ctx.token_weight = 1.0 / static_cast<double>(seq.mask_count());

  ref::ParamMap<T> want_grads = params.zeros_like();
  const std::vector<ref::Sequence> batch{seq};
  const ref::LossParts want = ref::forward_backward(cfg, params, batch, ctx, &want_grads);

  GpuModel<T> model(cfg, params, 0);
  const ref::SequenceLoss got = model.step(seq, ctx, true);
  const ref::ParamMap<T> got_grads = model.grads();

  ASSERT_EQ(want.per_sequence.size(), 1U);
  const auto& wl = want.per_sequence[0].token_loss;
  ASSERT_EQ(got.token_loss.size(), wl.size());
  for (std::size_t t = 0; t < wl.size(); ++t)
    EXPECT_NEAR(got.token_loss[t], wl[t], kModelTol<T> * std::max(1.0, std::abs(wl[t])))
        << "token " << t << " seed " << seed;
  EXPECT_EQ(got.tokens, want.tokens);
  for (const auto& e : want_grads)
    EXPECT_LE(rel(got_grads[e.name], e.value), kModelTol<T>) << e.name << " seed " << seed;
}

TEST(GpuModel, DenseStepMatchesReferenceF64) {
  SC_REQUIRE_GPU();
  check_step<double>(true);
  check_step<double>(false);
}

TEST(GpuModel, DenseStepMatchesReferenceF32) {
  SC_REQUIRE_GPU();
  check_step<float>(true);
  check_step<float>(false);
}

// The bf16 recipe (reference/trainer.cpp) on the GPU: weights rounded to bf16 on the host, two
// microbatches (one sequence each) through GpuModel<float>, each one's gradients rounded to bf16 on
// the device (round_grads_to_bf16) and summed in f32 on the host, against the CPU reference doing
// the same (ref::forward_backward on the rounded weights, ref::round_to_bf16, f32 sum). Stated
// bounds per parameter, normwise (max |gpu - cpu| / max |cpu|):
// - each microbatch's gradient before rounding: kModelTol<float> (1e-4), as the f32 step;
// - the device rounding: bit for bit ref::round_to_bf16 of that downloaded gradient;
// - each microbatch's rounded gradient: kBf16GradTol below. Rounding to nearest moves a by at most
//   2^-8 |a| and is monotone, so |r(a) - r(b)| <= |a - b| + 2^-8 (|a| + |b|); with max |a - b| <=
//   1e-4 M (M = max |b|) and max |r(b)| >= (1 - 2^-8) M that is (1e-4 + 2^-7 + 2^-8 1e-4) / (1 -
//   2^-8) ~ 7.9e-3: at most about one bf16 ulp of the largest element, never more;
// - the f32 sum: the microbatches' allowances added up (in absolute terms) plus 2^-21 max |sum|
//   for the two sums' own f32 roundings.
constexpr double kBf16GradTol = (1e-4 + 0.0078125 + 0.00390625 * 1e-4) / (1.0 - 0.00390625);

double max_abs(const ref::Tensor<float>& t) {
  double m = 0;
  for (const float v : t.vec()) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}

void check_bf16_step(bool tied) {
  ref::ModelConfig cfg;
  cfg.dropout = 0.1;
  cfg.tie_embeddings = tied;
  const std::uint64_t seed = std::random_device{}();
  const ref::ParamMap<float> master = ref::init_params<float>(cfg, seed);
  ref::ParamMap<float> working = master;
  ref::round_to_bf16(working);
  std::vector<ref::Sequence> batch{two_documents(cfg, seed), two_documents(cfg, seed + 1)};
  batch[0].index = 0;
  batch[1].index = 1;
  ref::StepContext ctx;
  ctx.seed = seed;
  ctx.step = 2;
  ctx.token_weight = 1.0 / static_cast<double>(batch[0].mask_count() + batch[1].mask_count());
  ctx.sequence_weight = 1.0 / static_cast<double>(batch.size());

  GpuModel<float> model(cfg, working, 0);
  ref::ParamMap<float> want_sum = master.zeros_like(), got_sum = master.zeros_like();
  std::map<std::string, double> allowed;  // absolute, per parameter, for the sums
  for (std::size_t k = 0; k < batch.size(); ++k) {
    ref::ParamMap<float> want = master.zeros_like();
    const std::vector<ref::Sequence> mb{batch[k]};
    const ref::LossParts wl = ref::forward_backward(cfg, working, mb, ctx, &want);
    model.zero_grads();
    const ref::SequenceLoss gl = model.step(batch[k], ctx, true);
    const ref::ParamMap<float> got = model.grads();
    model.round_grads_to_bf16();
    const ref::ParamMap<float> got_r = model.grads();
    ref::ParamMap<float> want_r = want;
    ref::round_to_bf16(want_r);

    ASSERT_EQ(wl.per_sequence.size(), 1U);
    const auto& tl = wl.per_sequence[0].token_loss;
    ASSERT_EQ(gl.token_loss.size(), tl.size());
    for (std::size_t t = 0; t < tl.size(); ++t)
      EXPECT_NEAR(gl.token_loss[t], tl[t], kModelTol<float> * std::max(1.0, std::abs(tl[t])))
          << "microbatch " << k << " token " << t << " seed " << seed;
    for (const auto& e : want) {
      const std::string& n = e.name;
      EXPECT_LE(rel(got[n], e.value), kModelTol<float>) << n << " mb " << k << " seed " << seed;
      int64_t not_bitwise = 0;
      for (int64_t i = 0; i < e.value.numel(); ++i)
        not_bitwise += std::bit_cast<std::uint32_t>(got_r[n][i]) !=
                       std::bit_cast<std::uint32_t>(ref::round_to_bf16(got[n][i]));
      EXPECT_EQ(not_bitwise, 0) << n << ": device rounding differs, mb " << k << " seed " << seed;
      EXPECT_LE(rel(got_r[n], want_r[n]), kBf16GradTol) << n << " mb " << k << " seed " << seed;
      allowed[n] += kBf16GradTol * max_abs(want_r[n]);
      for (int64_t i = 0; i < e.value.numel(); ++i) {
        want_sum[n][i] += want_r[n][i];
        got_sum[n][i] += got_r[n][i];
      }
    }
  }
  for (const auto& e : want_sum) {
    double diff = 0;
    for (int64_t i = 0; i < e.value.numel(); ++i)
      diff = std::max(diff, std::abs(static_cast<double>(got_sum[e.name][i]) -
                                     static_cast<double>(e.value[i])));
    EXPECT_LE(diff, allowed[e.name] * 1.001 + std::ldexp(max_abs(e.value), -21))
        << e.name << " (sum over microbatches) seed " << seed;
  }
}

TEST(GpuModel, Bf16RecipeStepMatchesReference) {
  SC_REQUIRE_GPU();
  check_bf16_step(true);
  check_bf16_step(false);
}

TEST(GpuModel, MoeIsRefusedClearly) {
  SC_REQUIRE_GPU();
  ref::ModelConfig cfg;
  cfg.moe = ref::MoeConfig{};
  const auto params = ref::init_params<float>(cfg, 1);
  EXPECT_THROW(GpuModel<float>(cfg, params, 0), std::invalid_argument);
}

}  // namespace
}  // namespace shardcheck::gpu

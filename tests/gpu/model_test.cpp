// A full dense model step (forward + backward of one packed sequence) on the GPU against
// ref::forward_backward: per-token losses and every parameter gradient, f64 within 1e-10 and f32
// within 1e-4 normwise relative error (a whole model's chain of ops, not one op). Dropout on, two
// documents in the sequence, tied and untied heads. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpu/model.hpp"
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

TEST(GpuModel, MoeIsRefusedClearly) {
  SC_REQUIRE_GPU();
  ref::ModelConfig cfg;
  cfg.moe = ref::MoeConfig{};
  const auto params = ref::init_params<float>(cfg, 1);
  EXPECT_THROW(GpuModel<float>(cfg, params, 0), std::invalid_argument);
}

}  // namespace
}  // namespace shardcheck::gpu

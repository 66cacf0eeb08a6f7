// AdamW, the LR schedule and clipping against values worked out by hand, and gradient
// accumulation: a microbatch split equals one big batch (f64, <= 1e-12).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "reference/optim.hpp"
#include "reference/trainer.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref {
namespace {

TEST(Schedule, WarmupThenCosineToMinLr) {
  OptimizerConfig opt;
  opt.lr = 1.0;
  opt.min_lr = 0.1;
  opt.warmup = 4;
  EXPECT_DOUBLE_EQ(lr_at(opt, 1, 14), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(opt, 4, 14), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(opt, 9, 14), 0.1 + 0.9 * 0.5);  // halfway through the decay
  EXPECT_DOUBLE_EQ(lr_at(opt, 14, 14), 0.1);
  EXPECT_NEAR(lr_at(opt, 6, 14), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.2)), 1e-15);
  opt.warmup = 0;
  EXPECT_DOUBLE_EQ(lr_at(opt, 0, 10), 1.0);
}

TEST(Clip, GlobalNormOverAllTensors) {
  ParamMap<double> g;
  g.add("a", {2}) = Tensor<double>({2}, std::vector<double>{3, 0});
  g.add("b", {1, 1}) = Tensor<double>({1, 1}, std::vector<double>{4});
  const double norm = global_grad_norm(g);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_EQ(clip_grad_norm(g, norm, 10.0), 1.0);
  const double f = clip_grad_norm(g, norm, 1.0);
  EXPECT_DOUBLE_EQ(f, 1.0 / (5.0 + 1e-6));
  EXPECT_NEAR(global_grad_norm(g), 1.0, 1e-6);
}

TEST(AdamW, StepsByHandWithDecayOnMatricesOnly) {
  OptimizerConfig opt;
  opt.beta1 = 0.9;
  opt.beta2 = 0.95;
  opt.eps = 1e-8;
  opt.weight_decay = 0.1;
  ParamMap<double> p;
  p.add("w", {1, 1})[0] = 2.0;
  p.add("n", {1})[0] = 2.0;
  ParamMap<double> g = p.zeros_like();
  g["w"][0] = 0.5;
  g["n"][0] = 0.5;
  AdamW<double> adam(opt, p);
  const double lr = 0.01;
  adam.step(p, g, lr);
  // t = 1: mhat = g, vhat = g^2, update = lr * g / (|g| + eps).
  const double upd = lr * 0.5 / (0.5 + 1e-8);
  EXPECT_DOUBLE_EQ(p["w"][0], 2.0 * (1 - lr * 0.1) - upd);
  EXPECT_DOUBLE_EQ(p["n"][0], 2.0 - upd);
  // t = 2 with gradient -0.5: m = 0.9*0.05 - 0.05, v = 0.95*0.0125 + 0.0125.
  g["w"][0] = -0.5;
  const double w1 = p["w"][0];
  adam.step(p, g, lr);
  const double m = 0.9 * 0.05 + 0.1 * -0.5, v = 0.95 * 0.0125 + 0.05 * 0.25;
  const double mhat = m / (1 - 0.81), vhat = v / (1 - 0.9025);
  EXPECT_NEAR(p["w"][0], w1 * (1 - lr * 0.1) - lr * mhat / (std::sqrt(vhat) + 1e-8), 1e-15);
}

class Accumulation : public ::testing::TestWithParam<bool> {};

TEST_P(Accumulation, MicrobatchSplitEqualsOneBigBatch) {
  ModelConfig cfg = GetParam() ? test::tiny_moe() : test::tiny_dense();
  cfg.dropout = 0.1;
  TrainConfig big;
  big.steps = 3;
  big.global_batch = 4;
  big.micro_batch = 4;
  big.clip_grad_norm = 0.5;
  big.optimizer.lr = 1e-2;
  TrainConfig split = big;
  split.micro_batch = 1;
  const Batch batch = test::tiny_batch(cfg, 4);
  auto source = [&](int) { return batch; };
  Trainer a(cfg, big, 3), b(cfg, split, 3);
  const TrainResult ra = a.run(source), rb = b.run(source);
  for (size_t s = 0; s < ra.steps.size(); ++s) {
    EXPECT_NEAR(ra.steps[s].loss, rb.steps[s].loss, 1e-12 * ra.steps[s].loss);
    EXPECT_NEAR(ra.steps[s].grad_norm, rb.steps[s].grad_norm, 1e-12 * ra.steps[s].grad_norm);
  }
  for (const auto& e : ra.params)
    for (int64_t i = 0; i < e.value.numel(); ++i)
      ASSERT_NEAR(e.value[i], rb.params[e.name][i], 1e-12 * std::max(1.0, std::abs(e.value[i])))
          << e.name;
}

INSTANTIATE_TEST_SUITE_P(DenseAndMoe, Accumulation, ::testing::Values(false, true));

}  // namespace
}  // namespace shardcheck::ref

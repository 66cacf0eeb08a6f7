// MoE routing rules by hand: capacity formula, ties to the lower expert, first choices filled
// before second choices in token order, drops contribute zero, padding is not routed, aux loss.
#include <gtest/gtest.h>

#include "reference/moe.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref {
namespace {

TEST(MoeCapacity, CeilOfFactorTimesTokensTimesKOverExperts) {
  EXPECT_EQ(moe_capacity({4, 2, 1.25, 0.0}, 16), 10);  // exactly 10
  EXPECT_EQ(moe_capacity({4, 1, 1.2, 0.0}, 10), 3);    // 3.0000000000000004 in f64: still 3
  EXPECT_EQ(moe_capacity({4, 1, 1.0, 0.0}, 10), 3);    // 2.5 -> 3
  EXPECT_EQ(moe_capacity({8, 2, 1.0, 0.0}, 1), 1);
}

// Every token prefers expert 0, then 1 (logits 2 > 1 > 0 via a one-hot input and router rows).
struct Fixture {
  Tensor<double> x{Shape{4, 2}};
  Tensor<double> router{Shape{2, 3}, std::vector<double>{2, 1, 0, 0, 0, 0}};
  std::vector<Tensor<double>> up, down;
  std::vector<const Tensor<double>*> up_p, down_p;
  Fixture() {
    for (int t = 0; t < 4; ++t) x.at(t, 0) = 1.0;
    for (int e = 0; e < 3; ++e) {
      up.push_back(test::random_tensor({2, 4}, 60 + static_cast<uint64_t>(e)));
      down.push_back(test::random_tensor({4, 2}, 70 + static_cast<uint64_t>(e)));
    }
    for (int e = 0; e < 3; ++e) {
      up_p.push_back(&up[static_cast<size_t>(e)]);
      down_p.push_back(&down[static_cast<size_t>(e)]);
    }
  }
};

TEST(MoeRouting, FirstChoicesFirstThenSecondChoicesInTokenOrder) {
  Fixture f;
  const std::vector<int32_t> docs = {0, 0, 1, 1};
  const MoeSpec spec{3, 2, 0.75, 0.0};  // C = ceil(0.75 * 4 * 2 / 3) = 2
  ASSERT_EQ(moe_capacity(spec, 4), 2);
  MoeCache<double> c;
  double aux = 0;
  const Tensor<double> y =
      moe_forward(f.x, std::span<const int32_t>(docs), f.router, f.up_p, f.down_p, spec, &c, &aux);
  // Slots are [t * k + choice]: tokens 0, 1 keep both choices; tokens 2, 3 lose both (expert 0
  // filled by first choices of 0, 1; expert 1 then by second choices of 0, 1).
  EXPECT_EQ(c.routing.choice, (std::vector<int32_t>{0, 1, 0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(c.routing.kept, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(c.routing.dropped, 4);
  for (int64_t col = 0; col < 2; ++col) {
    EXPECT_EQ(y.at(2, col), 0.0);
    EXPECT_EQ(y.at(3, col), 0.0);
  }
  // Token 0's output: renormalised gates over its top-2 times each expert's MLP.
  const double p0 = c.probs.at(0, 0), p1 = c.probs.at(0, 1);
  const Tensor<double> row({1, 2}, std::vector<double>{1, 0});
  const Tensor<double> e0 = mlp_forward(row, f.up[0], f.down[0]);
  const Tensor<double> e1 = mlp_forward(row, f.up[1], f.down[1]);
  for (int64_t col = 0; col < 2; ++col)
    EXPECT_NEAR(y.at(0, col), (p0 * e0[col] + p1 * e1[col]) / (p0 + p1), 1e-15);
}

TEST(MoeRouting, TiesGoToTheLowerExpertAndPaddingIsNotRouted) {
  Fixture f;
  f.router.fill(0.0);  // all probabilities equal
  const std::vector<int32_t> docs = {0, 0, -1, -1};
  const MoeSpec spec{3, 2, 4.0, 0.3};
  MoeCache<double> c;
  double aux = 0;
  const Tensor<double> y =
      moe_forward(f.x, std::span<const int32_t>(docs), f.router, f.up_p, f.down_p, spec, &c, &aux);
  EXPECT_EQ(c.routing.choice, (std::vector<int32_t>{0, 1, 0, 1, -1, -1, -1, -1}));
  EXPECT_EQ(c.routing.routed_tokens, 2);
  for (int64_t col = 0; col < 2; ++col) EXPECT_EQ(y.at(3, col), 0.0);
  // f = (1/2, 1/2, 0), P = (1/3, 1/3, 1/3): aux = 0.3 * 3 * (1/6 + 1/6) = 0.3.
  EXPECT_NEAR(aux, 0.3, 1e-15);
}

TEST(MoeRouting, AuxLossGrowsWithRouterSkew) {
  Fixture f;
  const std::vector<int32_t> docs = {0, 0, 0, 0};
  MoeCache<double> c;
  double skewed = 0, balanced = 0;
  moe_forward(f.x, std::span<const int32_t>(docs), f.router, f.up_p, f.down_p, {3, 1, 4.0, 1.0}, &c,
              &skewed);
  f.router.fill(0.0);
  moe_forward(f.x, std::span<const int32_t>(docs), f.router, f.up_p, f.down_p, {3, 1, 4.0, 1.0}, &c,
              &balanced);
  // Top-1 with equal probabilities: all tokens to expert 0, f = (1,0,0), P = 1/3 each: aux = 1.
  EXPECT_NEAR(balanced, 1.0, 1e-15);
  EXPECT_GT(skewed, balanced);
}

}  // namespace
}  // namespace shardcheck::ref

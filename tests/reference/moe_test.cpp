// MoE routing rules by hand: capacity formula (full sequence length, padding included), ties to
// the lower expert, first choices filled before second choices in token order, drops contribute
// zero, padding is not routed, aux loss.
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

// All tokens share their preferences here, so this checks drops and gates, not the fill order
// (a token-major fill gives the same result; see the next test for one that does not).
TEST(MoeRouting, OverCapacityDropsContributeZeroAndGatesRenormalise) {
  Fixture f;
  const std::vector<int32_t> docs = {0, 0, 1, 1};
  const MoeSpec spec{3, 2, 0.75, 0.0};  // C = ceil(0.75 * 4 * 2 / 3) = 2
  ASSERT_EQ(moe_capacity(spec, 4), 2);
  MoeCache<double> c;
  double aux = 0;
  const Tensor<double> y = moe_forward(f.x, std::span<const int32_t>(docs), f.router, {}, f.up_p,
                                       f.down_p, spec, &c, &aux);
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
  const Tensor<double> e0 = mlp_forward(row, nullptr, f.up[0], f.down[0]);
  const Tensor<double> e1 = mlp_forward(row, nullptr, f.up[1], f.down[1]);
  for (int64_t col = 0; col < 2; ++col)
    EXPECT_NEAR(y.at(0, col), (p0 * e0[col] + p1 * e1[col]) / (p0 + p1), 1e-15);
}

// Tokens with different preferences: token 0 prefers expert 0 then 1, token 1 prefers expert 1
// then 0 (one-hot inputs, identity router). With capacity 1, filling all first choices before any
// second choice keeps both first choices and drops both second choices; a token-major fill
// (token 0's two choices, then token 1's) would keep token 0's second choice (expert 1) and drop
// token 1's first choice instead. The shared-preference fixture above cannot tell these apart.
TEST(MoeRouting, FirstChoicesOfLaterTokensBeatSecondChoicesOfEarlierOnes) {
  const Tensor<double> x({2, 2}, std::vector<double>{1, 0, 0, 1});
  const Tensor<double> router({2, 2}, std::vector<double>{1, 0, 0, 1});
  std::vector<Tensor<double>> up, down;
  for (int e = 0; e < 2; ++e) {
    up.push_back(test::random_tensor({2, 4}, 80 + static_cast<uint64_t>(e)));
    down.push_back(test::random_tensor({4, 2}, 90 + static_cast<uint64_t>(e)));
  }
  const std::vector<const Tensor<double>*> up_p = {&up[0], &up[1]}, down_p = {&down[0], &down[1]};
  const std::vector<int32_t> docs = {0, 0};
  const MoeSpec spec{2, 2, 0.5, 0.0};  // C = ceil(0.5 * 2 * 2 / 2) = 1
  ASSERT_EQ(moe_capacity(spec, 2), 1);
  MoeCache<double> c;
  const Tensor<double> y =
      moe_forward(x, std::span<const int32_t>(docs), router, {}, up_p, down_p, spec, &c, nullptr);
  EXPECT_EQ(c.routing.choice, (std::vector<int32_t>{0, 1, 1, 0}));
  EXPECT_EQ(c.routing.kept, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(c.routing.dropped, 2);
  EXPECT_EQ(c.rows[0], (std::vector<int64_t>{0}));
  EXPECT_EQ(c.rows[1], (std::vector<int64_t>{1}));
  // Each token gets only its first choice, with its top-2 renormalised gate (= P over 2 experts).
  for (int64_t t = 0; t < 2; ++t) {
    const Tensor<double> row({1, 2}, std::vector<double>{x.at(t, 0), x.at(t, 1)});
    const auto e = static_cast<size_t>(t);  // token t's first choice is expert t
    const Tensor<double> out = mlp_forward(row, nullptr, up[e], down[e]);
    for (int64_t col = 0; col < 2; ++col)
      EXPECT_NEAR(y.at(t, col), c.probs.at(t, t) * out[col], 1e-15);
  }
}

// Capacity counts the whole sequence, padding included (README: C uses S, not the routed tokens):
// S = 4 with 2 routed tokens gives C = ceil(1.5 * 4 / 3) = 2, so both tokens fit on expert 0; a
// capacity from the routed tokens, ceil(1.5 * 2 / 3) = 1, would drop token 1.
TEST(MoeRouting, CapacityUsesTheFullSequenceLengthIncludingPadding) {
  Fixture f;
  const std::vector<int32_t> docs = {0, 0, -1, -1};
  const MoeSpec spec{3, 1, 1.5, 0.0};
  ASSERT_EQ(moe_capacity(spec, 4), 2);
  ASSERT_EQ(moe_capacity(spec, 2), 1);
  MoeCache<double> c;
  const Tensor<double> y = moe_forward(f.x, std::span<const int32_t>(docs), f.router, {}, f.up_p,
                                       f.down_p, spec, &c, nullptr);
  EXPECT_EQ(c.routing.routed_tokens, 2);
  EXPECT_EQ(c.routing.choice, (std::vector<int32_t>{0, 0, -1, -1}));
  EXPECT_EQ(c.routing.kept, (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(c.routing.dropped, 0);
  const Tensor<double> row({1, 2}, std::vector<double>{1, 0});
  const Tensor<double> e0 = mlp_forward(row, nullptr, f.up[0], f.down[0]);
  for (int64_t col = 0; col < 2; ++col) {
    EXPECT_NEAR(y.at(1, col), e0[col], 1e-15);  // top-1 gate renormalises to 1
    EXPECT_EQ(y.at(2, col), 0.0);
  }
}

TEST(MoeRouting, TiesGoToTheLowerExpertAndPaddingIsNotRouted) {
  Fixture f;
  f.router.fill(0.0);  // all probabilities equal
  const std::vector<int32_t> docs = {0, 0, -1, -1};
  const MoeSpec spec{3, 2, 4.0, 0.3};
  MoeCache<double> c;
  double aux = 0;
  const Tensor<double> y = moe_forward(f.x, std::span<const int32_t>(docs), f.router, {}, f.up_p,
                                       f.down_p, spec, &c, &aux);
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
  moe_forward(f.x, std::span<const int32_t>(docs), f.router, {}, f.up_p, f.down_p, {3, 1, 4.0, 1.0},
              &c, &skewed);
  f.router.fill(0.0);
  moe_forward(f.x, std::span<const int32_t>(docs), f.router, {}, f.up_p, f.down_p, {3, 1, 4.0, 1.0},
              &c, &balanced);
  // Top-1 with equal probabilities: all tokens to expert 0, f = (1,0,0), P = 1/3 each: aux = 1.
  EXPECT_NEAR(balanced, 1.0, 1e-15);
  EXPECT_GT(skewed, balanced);
}

}  // namespace
}  // namespace shardcheck::ref

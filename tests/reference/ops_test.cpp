// Finite-difference gradient checks (f64, relative error <= 1e-6) for every op of the reference,
// plus hand-computed values for the ops whose exact definition DESIGN.md pins.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <numbers>

#include "reference/attention.hpp"
#include "reference/moe.hpp"
#include "reference/ops.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref {
namespace {

using test::dot;
using test::fd_rel_error;
using test::random_tensor;
constexpr double kTol = 1e-6;

TEST(OpsGrad, Embedding) {
  Tensor<double> table = random_tensor({10, 6}, 1);
  const std::vector<int32_t> tokens = {3, 1, 3, 9, 0};
  const Tensor<double> c = random_tensor({5, 6}, 2);
  Tensor<double> dtable({10, 6});
  embedding_backward(c, std::span<const int32_t>(tokens), dtable);
  auto loss = [&] { return dot(c, embedding_forward(table, std::span<const int32_t>(tokens))); };
  EXPECT_LT(fd_rel_error(table, dtable, loss), kTol);
}

TEST(OpsGrad, RmsNorm) {
  Tensor<double> x = random_tensor({4, 8}, 3);
  Tensor<double> w = random_tensor({8}, 4, 0.5, 1.0);
  const Tensor<double> c = random_tensor({4, 8}, 5);
  std::vector<double> rstd;
  rmsnorm_forward(x, w, &rstd);
  Tensor<double> dw({8});
  const Tensor<double> dx = rmsnorm_backward(c, x, w, rstd, dw);
  auto loss = [&] { return dot(c, rmsnorm_forward(x, w, nullptr)); };
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
  EXPECT_LT(fd_rel_error(w, dw, loss), kTol);
}

TEST(OpsValue, RmsNormByHand) {
  const Tensor<double> x({1, 2}, std::vector<double>{3.0, 4.0});
  const Tensor<double> w({2}, std::vector<double>{1.0, 2.0});
  const Tensor<double> y = rmsnorm_forward(x, w, nullptr);
  const double r = 1.0 / std::sqrt(12.5 + 1e-5);
  EXPECT_DOUBLE_EQ(y[0], 3.0 * r);
  EXPECT_DOUBLE_EQ(y[1], 8.0 * r);
}

TEST(OpsGrad, Linear) {
  Tensor<double> x = random_tensor({5, 7}, 6);
  Tensor<double> w = random_tensor({7, 3}, 7);
  const Tensor<double> c = random_tensor({5, 3}, 8);
  Tensor<double> dw({7, 3});
  const Tensor<double> dx = linear_backward(c, x, w, dw);
  auto loss = [&] { return dot(c, linear_forward(x, w)); };
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
  EXPECT_LT(fd_rel_error(w, dw, loss), kTol);
}

TEST(OpsGrad, LinearTransposed) {
  Tensor<double> x = random_tensor({5, 7}, 9);
  Tensor<double> w = random_tensor({3, 7}, 10);
  const Tensor<double> c = random_tensor({5, 3}, 11);
  Tensor<double> dw({3, 7});
  const Tensor<double> dx = linear_t_backward(c, x, w, dw);
  auto loss = [&] { return dot(c, linear_t_forward(x, w)); };
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
  EXPECT_LT(fd_rel_error(w, dw, loss), kTol);
}

TEST(OpsGrad, Gelu) {
  Tensor<double> x = random_tensor({6, 5}, 12, 2.0);
  const Tensor<double> c = random_tensor({6, 5}, 13);
  const Tensor<double> dx = gelu_backward(c, x);
  auto loss = [&] { return dot(c, gelu_forward(x)); };
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
}

TEST(OpsValue, GeluTanhByHand) {
  const Tensor<double> x({1, 1}, std::vector<double>{1.0});
  const double expect = 0.5 * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * 1.044715));
  EXPECT_DOUBLE_EQ(gelu_forward(x)[0], expect);
}

TEST(OpsGrad, Mlp) {
  Tensor<double> x = random_tensor({4, 6}, 14);
  Tensor<double> up = random_tensor({6, 10}, 15, 0.5);
  Tensor<double> down = random_tensor({10, 6}, 16, 0.5);
  const Tensor<double> c = random_tensor({4, 6}, 17);
  MlpCache<double> cache;
  mlp_forward(x, nullptr, up, down, &cache);
  Tensor<double> dup({6, 10}), ddown({10, 6});
  const Tensor<double> dx = mlp_backward(c, x, nullptr, up, down, cache, nullptr, dup, ddown);
  auto loss = [&] { return dot(c, mlp_forward(x, nullptr, up, down, nullptr)); };
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
  EXPECT_LT(fd_rel_error(up, dup, loss), kTol);
  EXPECT_LT(fd_rel_error(down, ddown, loss), kTol);
}

TEST(OpsGrad, SwigluMlp) {
  Tensor<double> x = random_tensor({4, 6}, 24);
  Tensor<double> gate = random_tensor({6, 10}, 25, 0.5);
  Tensor<double> up = random_tensor({6, 10}, 26, 0.5);
  Tensor<double> down = random_tensor({10, 6}, 27, 0.5);
  const Tensor<double> c = random_tensor({4, 6}, 28);
  MlpCache<double> cache;
  mlp_forward(x, &gate, up, down, &cache);
  EXPECT_EQ(cache.gate.numel(), 40);
  Tensor<double> dgate({6, 10}), dup({6, 10}), ddown({10, 6});
  const Tensor<double> dx = mlp_backward(c, x, &gate, up, down, cache, &dgate, dup, ddown);
  auto loss = [&] { return dot(c, mlp_forward(x, &gate, up, down, nullptr)); };
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
  EXPECT_LT(fd_rel_error(gate, dgate, loss), kTol);
  EXPECT_LT(fd_rel_error(up, dup, loss), kTol);
  EXPECT_LT(fd_rel_error(down, ddown, loss), kTol);
}

TEST(OpsValue, SwigluByHand) {
  // silu(g) * u with g = 1, u = 2: 2 / (1 + e^-1); g = -3, u = 0.5: -1.5 / (1 + e^3).
  const Tensor<double> g({1, 2}, std::vector<double>{1.0, -3.0});
  const Tensor<double> u({1, 2}, std::vector<double>{2.0, 0.5});
  const Tensor<double> y = swiglu_forward(g, u);
  EXPECT_DOUBLE_EQ(y[0], 2.0 / (1.0 + std::exp(-1.0)));
  EXPECT_DOUBLE_EQ(y[1], -1.5 / (1.0 + std::exp(3.0)));
}

TEST(OpsGrad, CrossEntropyMasked) {
  Tensor<double> logits = random_tensor({5, 9}, 18, 2.0);
  const std::vector<int32_t> targets = {1, 8, 0, 4, 4};
  const std::vector<int32_t> mask = {1, 1, 0, 1, 0};
  const std::vector<double> weight = {1.0 / 3, 1.0 / 3, 0, 1.0 / 3, 0};
  const Tensor<double> d = cross_entropy_backward(logits, std::span<const int32_t>(targets),
                                                  std::span<const double>(weight));
  auto loss = [&] {
    const auto l = cross_entropy_forward(logits, std::span<const int32_t>(targets),
                                         std::span<const int32_t>(mask));
    return (l[0] + l[1] + l[3]) / 3.0;
  };
  EXPECT_LT(fd_rel_error(logits, d, loss), kTol);
  const auto l = cross_entropy_forward(logits, std::span<const int32_t>(targets),
                                       std::span<const int32_t>(mask));
  EXPECT_EQ(l[2], 0.0);
  EXPECT_EQ(l[4], 0.0);
}

TEST(OpsValue, CrossEntropyUniformIsLogV) {
  const Tensor<double> logits({1, 8});
  const std::vector<int32_t> t = {3}, m = {1};
  EXPECT_NEAR(
      cross_entropy_forward(logits, std::span<const int32_t>(t), std::span<const int32_t>(m))[0],
      std::log(8.0), 1e-15);
}

TEST(OpsGrad, Rope) {
  Tensor<double> x = random_tensor({5, 8}, 19);
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1};
  const Tensor<double> c = random_tensor({5, 8}, 20);
  Tensor<double> dx = c;
  rope_apply(dx, std::span<const int32_t>(pos), 2, true, RopeConfig{});
  auto loss = [&] {
    Tensor<double> y = x;
    rope_apply(y, std::span<const int32_t>(pos), 2, false, RopeConfig{});
    return dot(c, y);
  };
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
}

TEST(OpsValue, RopeRotatesPairsByPositionTimesFrequency) {
  // One head, d = 4: pair j rotates by pos * 10000^(-2j/4).
  Tensor<double> x({1, 4}, std::vector<double>{1.0, 0.0, 1.0, 0.0});
  const std::vector<int32_t> pos = {3};
  rope_apply(x, std::span<const int32_t>(pos), 1, false, RopeConfig{});
  EXPECT_NEAR(x[0], std::cos(3.0), 1e-15);
  EXPECT_NEAR(x[1], std::sin(3.0), 1e-15);
  EXPECT_NEAR(x[2], std::cos(3.0 / 100.0), 1e-15);
  EXPECT_NEAR(x[3], std::sin(3.0 / 100.0), 1e-15);
}

TEST(OpsGrad, RopeHalfLayoutWithLlama3Scaling) {
  Tensor<double> x = random_tensor({5, 16}, 21);
  const std::vector<int32_t> pos = {0, 7, 2, 300, 9000};
  const RopeConfig rope{.theta = 500000.0, .layout = RopeLayout::kHalf, .scaling = RopeScaling{}};
  const Tensor<double> c = random_tensor({5, 16}, 22);
  Tensor<double> dx = c;
  rope_apply(dx, std::span<const int32_t>(pos), 2, true, rope);
  auto loss = [&] {
    Tensor<double> y = x;
    rope_apply(y, std::span<const int32_t>(pos), 2, false, rope);
    return dot(c, y);
  };
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
}

TEST(OpsValue, RopeHalfLayoutRotatesChannelJWithJPlusHalf) {
  // One head, d = 4, half layout: pairs (0, 2) and (1, 3); pair j at pos * 10000^(-2j/4).
  Tensor<double> x({1, 4}, std::vector<double>{1.0, 1.0, 0.0, 0.0});
  const std::vector<int32_t> pos = {3};
  rope_apply(x, std::span<const int32_t>(pos), 1, false,
             RopeConfig{.layout = RopeLayout::kHalf, .scaling = std::nullopt});
  EXPECT_NEAR(x[0], std::cos(3.0), 1e-15);
  EXPECT_NEAR(x[2], std::sin(3.0), 1e-15);
  EXPECT_NEAR(x[1], std::cos(3.0 / 100.0), 1e-15);
  EXPECT_NEAR(x[3], std::sin(3.0 / 100.0), 1e-15);
}

TEST(OpsValue, Llama3ScalingKeepsHighFrequenciesDividesLowOnesAndBlendsBetween) {
  // Llama 3.1 (theta 500000, d = 128): wavelengths under 8192 / 4 = 2048 keep their frequency,
  // those over 8192 are divided by 8, those between blend (Meta's apply_scaling).
  const RopeConfig plain{.theta = 500000.0, .scaling = std::nullopt};
  RopeConfig scaled = plain;
  scaled.scaling = RopeScaling{};
  const std::vector<double> f = plain.frequencies(128), g = scaled.frequencies(128);
  ASSERT_EQ(g.size(), 64U);
  int kept = 0, divided = 0, blended = 0;
  for (std::size_t j = 0; j < f.size(); ++j) {
    const double wavelen = 2 * std::numbers::pi / f[j];
    if (wavelen < 2048) {
      EXPECT_EQ(g[j], f[j]);
      ++kept;
    } else if (wavelen > 8192) {
      EXPECT_DOUBLE_EQ(g[j], f[j] / 8);
      ++divided;
    } else {
      const double smooth = (8192 / wavelen - 1) / 3;
      EXPECT_DOUBLE_EQ(g[j], (1 - smooth) * f[j] / 8 + smooth * f[j]);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

RC_GTEST_PROP(OpsProperty, RopeIsAnInvertibleRotation, ()) {
  const int heads = *rc::gen::inRange(1, 4);
  const int64_t d = 2 * *rc::gen::inRange(1, 5);
  const auto pos = *rc::gen::container<std::vector<int32_t>>(3, rc::gen::inRange(0, 5000));
  Tensor<double> x = random_tensor({3, heads * d}, *rc::gen::arbitrary<uint64_t>());
  const Tensor<double> in = x;
  rope_apply(x, std::span<const int32_t>(pos), heads, false, RopeConfig{});
  for (int64_t t = 0; t < 3; ++t) {  // every pair keeps its length
    for (int64_t p = 0; p < heads * d; p += 2) {
      const double before = std::hypot(in.at(t, p), in.at(t, p + 1));
      RC_ASSERT(std::abs(std::hypot(x.at(t, p), x.at(t, p + 1)) - before) <= 1e-12 * (1 + before));
    }
  }
  rope_apply(x, std::span<const int32_t>(pos), heads, true, RopeConfig{});
  for (int64_t i = 0; i < x.numel(); ++i) RC_ASSERT(std::abs(x[i] - in[i]) <= 1e-12);
}

struct AttentionCase {
  double dropout;
};

class AttentionGrad : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionGrad, GqaDocumentMaskedCausal) {
  const int64_t s = 6, d = 4;
  const AttentionShape shape{4, 2};
  Tensor<double> q = random_tensor({s, 4 * d}, 21);
  Tensor<double> k = random_tensor({s, 2 * d}, 22);
  Tensor<double> v = random_tensor({s, 2 * d}, 23);
  const std::vector<int32_t> docs = {0, 0, 0, 1, 1, -1};
  const AttentionDropout drop{
      .rate = GetParam().dropout, .seed = 99, .layer = 1, .step = 2, .sequence = 5};
  const Tensor<double> c = random_tensor({s, 4 * d}, 24);
  Tensor<double> probs;
  attention_forward(q, k, v, std::span<const int32_t>(docs), shape, drop, &probs);
  Tensor<double> dq, dk, dv;
  attention_backward(c, q, k, v, shape, drop, probs, dq, dk, dv);
  auto loss = [&] {
    return dot(c, attention_forward(q, k, v, std::span<const int32_t>(docs), shape, drop, nullptr));
  };
  EXPECT_LT(fd_rel_error(q, dq, loss), kTol);
  EXPECT_LT(fd_rel_error(k, dk, loss), kTol);
  EXPECT_LT(fd_rel_error(v, dv, loss), kTol);
}

INSTANTIATE_TEST_SUITE_P(Dropout, AttentionGrad,
                         ::testing::Values(AttentionCase{0.0}, AttentionCase{0.3}));

TEST(AttentionValue, FirstTokenOfADocumentSeesOnlyItself) {
  const int64_t s = 4, d = 2;
  const Tensor<double> q = random_tensor({s, d}, 25), k = random_tensor({s, d}, 26);
  const Tensor<double> v = random_tensor({s, d}, 27);
  const std::vector<int32_t> docs = {0, 0, 1, 1};
  const Tensor<double> o =
      attention_forward(q, k, v, std::span<const int32_t>(docs), {1, 1}, {}, nullptr);
  for (int64_t c = 0; c < d; ++c) {
    EXPECT_DOUBLE_EQ(o.at(0, c), v.at(0, c));
    EXPECT_DOUBLE_EQ(o.at(2, c), v.at(2, c));
  }
}

TEST(AttentionValue, GqaQueryHeadUsesKvHeadQOverGroup) {
  // 4 query heads on 2 kv heads: heads 0,1 read kv head 0 and heads 2,3 read kv head 1. With one
  // token, each head's output is its kv head's value.
  const Tensor<double> q = random_tensor({1, 8}, 28), k = random_tensor({1, 4}, 29);
  const Tensor<double> v({1, 4}, std::vector<double>{1, 2, 3, 4});
  const std::vector<int32_t> docs = {0};
  const Tensor<double> o =
      attention_forward(q, k, v, std::span<const int32_t>(docs), {4, 2}, {}, nullptr);
  const std::vector<double> expect = {1, 2, 1, 2, 3, 4, 3, 4};
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(o[i], expect[static_cast<size_t>(i)]);
}

TEST(AttentionValue, HeadShardsReproduceTheFullDropoutMasks) {
  // A TP-style split: each half of the query heads with its kv head, head_offset set. Outputs equal
  // the matching columns of the unsharded attention, dropout included.
  const int64_t s = 5, d = 2;
  const Tensor<double> q = random_tensor({s, 4 * d}, 33), k = random_tensor({s, 2 * d}, 34);
  const Tensor<double> v = random_tensor({s, 2 * d}, 35);
  const std::vector<int32_t> docs = {0, 0, 0, 0, 0};
  AttentionDropout drop{.rate = 0.4, .seed = 7, .layer = 0, .step = 3, .sequence = 2};
  const Tensor<double> full =
      attention_forward(q, k, v, std::span<const int32_t>(docs), {4, 2}, drop);
  auto columns = [&](const Tensor<double>& t, int64_t from, int64_t n) {
    Tensor<double> out({s, n});
    for (int64_t r = 0; r < s; ++r)
      for (int64_t c = 0; c < n; ++c) out.at(r, c) = t.at(r, from + c);
    return out;
  };
  drop.total_heads = 4;
  for (int shard = 0; shard < 2; ++shard) {
    drop.head_offset = 2 * shard;
    const Tensor<double> part =
        attention_forward(columns(q, shard * 2 * d, 2 * d), columns(k, shard * d, d),
                          columns(v, shard * d, d), std::span<const int32_t>(docs), {2, 1}, drop);
    EXPECT_EQ(part.vec(), columns(full, shard * 2 * d, 2 * d).vec()) << "shard " << shard;
  }
  EXPECT_EQ(attention_dropout_scale(drop, 4, s, 3, 4, 0) == 0.0 ||
                attention_dropout_scale(drop, 4, s, 3, 4, 0) == 1.0 / 0.6,
            true);
}

TEST(AttentionValue, DropoutMaskObjectEqualsThePerElementScale) {
  // The prebuilt-stream mask (for loops, e.g. CP or a kernel's reference) and the one-element
  // function agree everywhere, and about `rate` of the elements are dropped.
  const AttentionDropout drop{.rate = 0.3, .seed = 11, .layer = 2, .step = 4, .sequence = 3};
  const int64_t s = 9;
  const AttentionDropoutMask mask(drop, 4, s);
  int64_t dropped = 0;
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < s; ++i)
      for (int64_t j = 0; j < s; ++j) {
        const double m = mask.scale(h, i, j);
        ASSERT_EQ(m, attention_dropout_scale(drop, 4, s, h, i, j)) << h << " " << i << " " << j;
        ASSERT_TRUE(m == 0.0 || m == 1.0 / 0.7);
        dropped += m == 0.0;
      }
  EXPECT_NEAR(static_cast<double>(dropped) / (4 * s * s), 0.3, 0.1);
  EXPECT_EQ(AttentionDropoutMask({}, 4, s).scale(1, 2, 3), 1.0);  // rate 0: no dropout
}

struct MoeCase {
  double capacity_factor;
  int top_k;
};

class MoeGrad : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeGrad, RouterAndExperts) {
  const int64_t s = 7, h = 6, f = 8;
  const int e_n = 4;
  const MoeSpec spec{e_n, GetParam().top_k, GetParam().capacity_factor, 0.1};
  Tensor<double> x = random_tensor({s, h}, 30);
  Tensor<double> router = random_tensor({h, e_n}, 31);
  std::vector<Tensor<double>> up, down;
  for (int e = 0; e < e_n; ++e) {
    up.push_back(random_tensor({h, f}, 40 + static_cast<uint64_t>(e), 0.5));
    down.push_back(random_tensor({f, h}, 50 + static_cast<uint64_t>(e), 0.5));
  }
  const std::vector<int32_t> docs = {0, 0, 0, 1, 1, 1, -1};
  const Tensor<double> c = random_tensor({s, h}, 32);
  const double aux_weight = 0.5;
  auto ptrs = [](std::vector<Tensor<double>>& v) {
    std::vector<const Tensor<double>*> p;
    for (auto& t : v) p.push_back(&t);
    return p;
  };
  auto loss = [&] {
    double aux = 0;
    const Tensor<double> y = moe_forward(x, std::span<const int32_t>(docs), router, {}, ptrs(up),
                                         ptrs(down), spec, nullptr, &aux);
    return dot(c, y) + aux_weight * aux;
  };
  MoeCache<double> cache;
  double aux = 0;
  moe_forward(x, std::span<const int32_t>(docs), router, {}, ptrs(up), ptrs(down), spec, &cache,
              &aux);
  EXPECT_GT(aux, 0.0);
  Tensor<double> drouter({h, e_n});
  std::vector<Tensor<double>> dup, ddown;
  for (int e = 0; e < e_n; ++e) {
    dup.emplace_back(Shape{h, f});
    ddown.emplace_back(Shape{f, h});
  }
  std::vector<Tensor<double>*> pu, pd;
  for (int e = 0; e < e_n; ++e) {
    pu.push_back(&dup[static_cast<size_t>(e)]);
    pd.push_back(&ddown[static_cast<size_t>(e)]);
  }
  const Tensor<double> dx = moe_backward(c, x, router, {}, ptrs(up), ptrs(down), spec, cache,
                                         aux_weight, drouter, {}, pu, pd);
  EXPECT_LT(fd_rel_error(x, dx, loss), kTol);
  EXPECT_LT(fd_rel_error(router, drouter, loss), kTol);
  for (int e = 0; e < e_n; ++e) {
    EXPECT_LT(fd_rel_error(up[static_cast<size_t>(e)], dup[static_cast<size_t>(e)], loss), kTol);
    EXPECT_LT(fd_rel_error(down[static_cast<size_t>(e)], ddown[static_cast<size_t>(e)], loss),
              kTol);
  }
}

// cf 0.5 makes capacity bind (drops), cf 4 never drops; top-1 and top-2.
INSTANTIATE_TEST_SUITE_P(Capacity, MoeGrad,
                         ::testing::Values(MoeCase{0.5, 2}, MoeCase{4.0, 2}, MoeCase{0.5, 1},
                                           MoeCase{4.0, 1}));

}  // namespace
}  // namespace shardcheck::ref

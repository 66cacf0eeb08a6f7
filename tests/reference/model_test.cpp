// Whole-model checks: finite-difference gradients of every parameter (dense and MoE, GQA, tied and
// untied, document masks, dropout), activation checkpointing bitwise, and init slicing.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "reference/blocks.hpp"
#include "reference/model.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref {
namespace {

using test::fd_rel_error;

struct ModelCase {
  std::string name;
  bool moe;
  bool tied;
  int kv_heads;
  double dropout;
  bool checkpointing;
};

void PrintTo(const ModelCase& c, std::ostream* os) {
  *os << c.name;
}

class ModelGrad : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelGrad, EveryParameterMatchesFiniteDifferences) {
  const ModelCase& mc = GetParam();
  ModelConfig cfg = mc.moe ? test::tiny_moe() : test::tiny_dense();
  cfg.tie_embeddings = mc.tied;
  cfg.kv_heads = mc.kv_heads;
  cfg.dropout = mc.dropout;
  const Batch batch = test::tiny_batch(cfg, 2);
  ParamMap<double> params = test::random_params(cfg, 11);
  StepContext ctx = test::global_context(batch);
  ctx.seed = 3;
  ctx.step = 2;
  ctx.recompute = mc.checkpointing ? Recompute::kFull : Recompute::kNone;
  ParamMap<double> grads = params.zeros_like();
  const LossParts parts =
      forward_backward(cfg, params, std::span<const Sequence>(batch), ctx, &grads);
  if (mc.moe) {  // the gradient check covers dropped assignments too
    int64_t dropped = 0;
    for (const auto& s : parts.per_sequence) dropped += s.moe_dropped;
    EXPECT_GT(dropped, 0);
    EXPECT_GT(parts.aux_sum, 0.0);
  }
  auto loss = [&] {
    return forward_backward(cfg, params, std::span<const Sequence>(batch), ctx, nullptr).loss();
  };
  // Every row and every column of every tensor plus 128 elements spread evenly (tensors of <= 128
  // elements, e.g. norms, router, GQA wk/wv, entirely), from a per-tensor offset (fd_sample).
  int64_t offset = 0;
  for (auto& e : params) {
    const double err = fd_rel_error(e.value, grads[e.name], loss, 128, 1e-5, offset += 97);
    EXPECT_LT(err, 1e-6) << e.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ModelGrad,
    ::testing::Values(ModelCase{"dense_tied_gqa", false, true, 2, 0.0, false},
                      ModelCase{"dense_untied_mha", false, false, 4, 0.0, false},
                      ModelCase{"dense_mqa_dropout", false, true, 1, 0.2, false},
                      ModelCase{"moe_tied_gqa", true, true, 2, 0.0, false},
                      ModelCase{"moe_untied_dropout_ckpt", true, false, 2, 0.2, true}),
    [](const auto& param_info) { return param_info.param.name; });

TEST(FiniteDifferences, SampleCoversEveryRowAndColumn) {
  EXPECT_EQ(test::fd_sample({16, 32}, 512).size(), 512u);  // small: every element
  for (const Shape& shape : {Shape{40, 33}, Shape{7, 600}, Shape{600, 7}, Shape{10, 10, 10}}) {
    for (int64_t offset : {0, 97, 1234}) {
      const auto idx = test::fd_sample(shape, 32, offset);
      const int64_t cols = shape.back(), rows = numel_of(shape) / cols;
      std::vector<uint8_t> row(static_cast<size_t>(rows), 0), col(static_cast<size_t>(cols), 0);
      for (int64_t i : idx) {
        row[static_cast<size_t>(i / cols)] = 1;
        col[static_cast<size_t>(i % cols)] = 1;
      }
      EXPECT_EQ(std::count(row.begin(), row.end(), 0), 0) << shape[0] << " offset " << offset;
      EXPECT_EQ(std::count(col.begin(), col.end(), 0), 0) << shape[0] << " offset " << offset;
      EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
      EXPECT_LT(static_cast<int64_t>(idx.size()), numel_of(shape));
    }
  }
  EXPECT_NE(test::fd_sample({40, 33}, 32, 0), test::fd_sample({40, 33}, 32, 97));
}

TEST(ParamMap, HashedLookupKeepsInsertionOrderAndSurvivesCopies) {
  ParamMap<double> m;
  const std::vector<std::string> names = {"z", "a", "layers.1.attn.wq", "m"};
  for (size_t i = 0; i < names.size(); ++i) m.add(names[i], {static_cast<int64_t>(i + 1)});
  EXPECT_THROW(m.add("a", {1}), std::logic_error);
  std::vector<std::string> order;
  for (const auto& e : m) order.push_back(e.name);
  EXPECT_EQ(order, names);
  for (size_t i = 0; i < names.size(); ++i)
    EXPECT_EQ(m[names[i]].numel(), static_cast<int64_t>(i + 1)) << names[i];
  EXPECT_EQ(m.find("missing"), nullptr);
  EXPECT_THROW(m["missing"], std::logic_error);
  ParamMap<double> copy = m;  // the copy's lookups reach the copy's tensors
  copy["m"].fill(5.0);
  EXPECT_EQ(m["m"][0], 0.0);
  EXPECT_EQ(copy.find("m"), &(copy.begin() + 3)->value);
  const ParamMap<double> zeros = copy.zeros_like();
  EXPECT_TRUE(zeros.contains("layers.1.attn.wq"));
  EXPECT_EQ(zeros["m"][0], 0.0);
}

TEST(Model, ParameterNamesFollowTheDumpContract) {
  ModelConfig cfg = test::tiny_moe();
  cfg.tie_embeddings = false;
  const auto shapes = param_shapes(cfg);
  std::vector<std::string> names;
  for (const auto& [n, s] : shapes) names.push_back(n);
  const std::vector<std::string> expect = {"embed.weight",
                                           "layers.0.attn_norm.weight",
                                           "layers.0.attn.wq",
                                           "layers.0.attn.wk",
                                           "layers.0.attn.wv",
                                           "layers.0.attn.wo",
                                           "layers.0.mlp_norm.weight",
                                           "layers.0.mlp.w_up",
                                           "layers.0.mlp.w_down",
                                           "layers.1.attn_norm.weight",
                                           "layers.1.attn.wq",
                                           "layers.1.attn.wk",
                                           "layers.1.attn.wv",
                                           "layers.1.attn.wo",
                                           "layers.1.mlp_norm.weight",
                                           "layers.1.moe.router",
                                           "layers.1.moe.experts.0.w_up",
                                           "layers.1.moe.experts.0.w_down",
                                           "layers.1.moe.experts.1.w_up",
                                           "layers.1.moe.experts.1.w_down",
                                           "layers.1.moe.experts.2.w_up",
                                           "layers.1.moe.experts.2.w_down",
                                           "layers.1.moe.experts.3.w_up",
                                           "layers.1.moe.experts.3.w_down",
                                           "final_norm.weight",
                                           "lm_head.weight"};
  EXPECT_EQ(names, expect);
  EXPECT_EQ(shapes[2].second, (Shape{16, 16}));      // wq [h, a*d]
  EXPECT_EQ(shapes[3].second, (Shape{16, 8}));       // wk [h, kv*d]
  EXPECT_EQ(shapes.back().second, (Shape{16, 32}));  // lm_head [h, V]
}

TEST(Model, ActivationCheckpointingIsBitwiseEqual) {
  ModelConfig cfg = test::tiny_moe();
  cfg.dropout = 0.1;
  const Batch batch = test::tiny_batch(cfg, 3);
  const ParamMap<double> params = test::random_params(cfg, 12);
  StepContext ctx = test::global_context(batch);
  ctx.seed = 9;
  ParamMap<double> g1 = params.zeros_like();
  const LossParts a = forward_backward(cfg, params, std::span<const Sequence>(batch), ctx, &g1);
  for (const Recompute mode : {Recompute::kSelective, Recompute::kFull}) {
    ParamMap<double> g2 = params.zeros_like();
    ctx.recompute = mode;
    const LossParts b = forward_backward(cfg, params, std::span<const Sequence>(batch), ctx, &g2);
    EXPECT_EQ(a.loss(), b.loss()) << to_string(mode);
    for (const auto& e : g1)
      EXPECT_EQ(e.value.vec(), g2[e.name].vec()) << to_string(mode) << e.name;
  }
}

TEST(Model, PipelineStagesOnPartialParameterMapsReproduceTheModel) {
  // Two stages, each holding only its own parameters (the tied embedding on both ends), run the
  // stage functions of blocks.hpp; their gradients sum to the whole model's, bitwise.
  ModelConfig cfg = test::tiny_moe();
  cfg.dropout = 0.2;
  const Batch batch = test::tiny_batch(cfg, 2);
  const ParamMap<double> params = test::random_params(cfg, 13);
  StepContext ctx = test::global_context(batch);
  ctx.seed = 4;
  ParamMap<double> whole = params.zeros_like();
  const LossParts ref =
      forward_backward(cfg, params, std::span<const Sequence>(batch), ctx, &whole);

  ParamMap<double> s0, s1;
  for (const auto& e : params) {
    const bool first = e.name == "embed.weight" || e.name.starts_with("layers.0.");
    const bool last = e.name == "embed.weight" || !first;
    if (first) s0.add(e.name, e.value.shape()) = e.value;
    if (last) s1.add(e.name, e.value.shape()) = e.value;
  }
  ParamMap<double> g0 = s0.zeros_like(), g1 = s1.zeros_like();
  double loss_sum = 0;
  for (const Sequence& seq : batch) {
    SequenceLoss sl;
    BlockCache<double> c0, c1;
    HeadCache<double> head;
    const Tensor<double> x0 = embed_forward(s0, seq);
    const Tensor<double> x1 = block_forward(cfg, s0, 0, seq, ctx, x0, c0, &sl);  // "send"
    const Tensor<double> x2 = block_forward(cfg, s1, 1, seq, ctx, x1, c1, &sl);
    head_forward(cfg, s1, seq, x2, head, &sl);
    loss_sum += sl.loss_sum;
    const Tensor<double> d2 = head_backward(cfg, s1, seq, ctx, head, g1);
    const Tensor<double> d1 = block_backward(cfg, s1, 1, seq, ctx, c1, d2, g1);  // "send back"
    const Tensor<double> d0 = block_backward(cfg, s0, 0, seq, ctx, c0, d1, g0);
    embed_backward(d0, seq, g0);
  }
  EXPECT_EQ(loss_sum, ref.loss_sum);
  HeadCache<double> unused;  // the head must have somewhere to put its losses
  EXPECT_THROW(head_forward(cfg, s1, batch[0], embed_forward(s1, batch[0]), unused, nullptr),
               std::logic_error);
  for (const auto& e : whole) {
    if (e.name == "embed.weight") {
      // Summation order differs (head part first in the whole model), so compare closely.
      for (int64_t i = 0; i < e.value.numel(); ++i)
        EXPECT_NEAR(g0[e.name][i] + g1[e.name][i], e.value[i], 1e-15);
    } else {
      const Tensor<double>& g = g0.contains(e.name) ? g0[e.name] : g1[e.name];
      EXPECT_EQ(g.vec(), e.value.vec()) << e.name;
    }
  }
}

TEST(Model, InitOfASliceEqualsSliceOfFullInit) {
  const ModelConfig cfg = test::tiny_moe();
  const ParamMap<double> full = init_params<double>(cfg, 77);
  for (const auto& e : full) {
    const int64_t n = e.value.numel();
    const int64_t a = n / 3, b = n - n / 5;
    std::vector<double> part(static_cast<size_t>(b - a));
    init_param_slice<double>(cfg, 77, e.name, a, part);
    for (int64_t i = a; i < b; ++i)
      ASSERT_EQ(part[static_cast<size_t>(i - a)], e.value[i]) << e.name;
  }
}

RC_GTEST_PROP(Model, AnySliceInitialisesLikeTheFullTensor, (uint64_t seed)) {
  const ModelConfig cfg = test::tiny_dense();
  const auto shapes = param_shapes(cfg);
  const auto& [name, shape] = *rc::gen::elementOf(shapes);
  const int64_t n = numel_of(shape);
  const int64_t a = *rc::gen::inRange<int64_t>(0, n);
  const int64_t b = *rc::gen::inRange<int64_t>(a, n + 1);
  std::vector<double> full(static_cast<size_t>(n)), part(static_cast<size_t>(b - a));
  init_param_slice<double>(cfg, seed, name, 0, full);
  init_param_slice<double>(cfg, seed, name, a, part);
  RC_ASSERT(std::equal(part.begin(), part.end(), full.begin() + a));
}

TEST(Model, InitStatistics) {
  ModelConfig cfg = test::tiny_dense();
  cfg.hidden = 64;
  cfg.heads = 4;
  cfg.kv_heads = 4;
  cfg.ffn = 256;
  const ParamMap<double> p = init_params<double>(cfg, 1);
  auto stddev = [](const Tensor<double>& t) {
    double sq = 0;
    for (double v : t.vec()) sq += v * v;
    return std::sqrt(sq / static_cast<double>(t.numel()));
  };
  EXPECT_NEAR(stddev(p["layers.0.mlp.w_up"]), 0.02, 0.001);
  EXPECT_NEAR(stddev(p["layers.0.mlp.w_down"]), 0.02 / std::sqrt(4.0), 0.0005);
  EXPECT_NEAR(stddev(p["layers.1.attn.wo"]), 0.01, 0.0008);
  for (double v : p["final_norm.weight"].vec()) EXPECT_EQ(v, 1.0);
  for (double v : p["layers.1.attn_norm.weight"].vec()) EXPECT_EQ(v, 1.0);
  // Different tensors draw different numbers.
  EXPECT_NE(p["layers.0.attn.wq"][0], p["layers.1.attn.wq"][0]);
}

TEST(Model, F32ForwardTracksF64) {
  const ModelConfig cfg = test::tiny_moe();
  const Batch batch = test::tiny_batch(cfg, 2);
  const ParamMap<double> p64 = init_params<double>(cfg, 4);
  const ParamMap<float> p32 = init_params<float>(cfg, 4);
  const StepContext ctx = test::global_context(batch);
  const double l64 =
      forward_backward(cfg, p64, std::span<const Sequence>(batch), ctx, nullptr).loss();
  const double l32 =
      forward_backward(cfg, p32, std::span<const Sequence>(batch), ctx, nullptr).loss();
  EXPECT_NEAR(l32, l64, 1e-5 * l64);
}

}  // namespace
}  // namespace shardcheck::ref

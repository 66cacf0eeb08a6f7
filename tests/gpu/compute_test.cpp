// gpu::DeviceCompute as the thread's ref::Compute: every ref:: op called inside a ComputeScope
// against the same op outside it (the CPU loops), f32 <= 1e-5 and f64 <= 1e-12 normwise relative
// error, fresh random inputs (seed printed on failure), and ops_run() advanced so the op really
// ran on the device; the fallbacks (empty operands, over-long attention rows); a whole reference
// model step (a dense and an MoE layer, GQA, dropout) inside the scope against the CPU. Skips
// without a device. tests/gpu/compute_parallel_test.cpp runs strategies with it.
#include "gpu/device_compute.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/attention.hpp"
#include "reference/compute.hpp"
#include "reference/model.hpp"
#include "reference/ops.hpp"
#include "tests/gpu/support.hpp"

namespace shardcheck::gpu {
namespace {

template <class T>
constexpr double kOpTol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
template <class T>
constexpr double kModelTol = std::is_same_v<T, float> ? 1e-4 : 1e-10;

using Outputs = std::vector<std::vector<double>>;

template <class T>
std::vector<double> wide(const std::vector<T>& v) {
  return {v.begin(), v.end()};
}
template <class T>
std::vector<double> wide(const ref::Tensor<T>& t) {
  return wide(t.vec());
}

// max |got - want| / max |want| (NaN or a size mismatch: infinity).
double rel(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class T>
ref::Tensor<T> rnd(ref::Shape shape, std::mt19937_64& g, double scale = 1.0) {
  ref::Tensor<T> t(std::move(shape));
  std::normal_distribution<double> n(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(n(g));
  return t;
}

// Runs op on the CPU, then inside a ComputeScope of dc: one device call, no fallback, outputs
// within T's tolerance.
template <class T, class Op>
void expect_same(DeviceCompute& dc, const char* what, uint64_t seed, Op&& op) {
  const Outputs want = op();
  const int64_t calls = dc.ops_run(), fallbacks = dc.ops_declined();
  Outputs got;
  {
    ref::ComputeScope scope(&dc);
    got = op();
  }
  EXPECT_EQ(dc.ops_run(), calls + 1) << what << ": not dispatched to the device";
  EXPECT_EQ(dc.ops_declined(), fallbacks) << what;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_LE(rel(got[i], want[i]), kOpTol<T>) << what << " output " << i << " seed " << seed;
}

template <class T>
void check_dense_ops(DeviceCompute& dc) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 g(seed);
  const int64_t rows = 37, in = 50, out = 29;
  const auto x = rnd<T>({rows, in}, g);
  const auto w = rnd<T>({in, out}, g);
  const auto wt = rnd<T>({out, in}, g);
  const auto dy = rnd<T>({rows, out}, g);
  const auto dw0 = rnd<T>({in, out}, g);
  const auto dwt0 = rnd<T>({out, in}, g);
  expect_same<T>(dc, "linear_forward", seed,
                 [&] { return Outputs{wide(ref::linear_forward(x, w))}; });
  expect_same<T>(dc, "linear_backward", seed, [&] {
    ref::Tensor<T> dw = dw0;  // backward adds into it
    const auto dx = ref::linear_backward(dy, x, w, dw);
    return Outputs{wide(dx), wide(dw)};
  });
  expect_same<T>(dc, "linear_t_forward", seed,
                 [&] { return Outputs{wide(ref::linear_t_forward(x, wt))}; });
  expect_same<T>(dc, "linear_t_backward", seed, [&] {
    ref::Tensor<T> dw = dwt0;
    const auto dx = ref::linear_t_backward(dy, x, wt, dw);
    return Outputs{wide(dx), wide(dw)};
  });

  // h above the kernels' block size, so rows are reduced over several strides.
  const int64_t n = 21, h = 300;
  const auto nx = rnd<T>({n, h}, g, 2.0);
  auto nw = rnd<T>({h}, g);
  const auto ndy = rnd<T>({n, h}, g);
  const auto ndw0 = rnd<T>({h}, g);
  expect_same<T>(dc, "rmsnorm_forward", seed, [&] {
    std::vector<T> rstd;
    const auto y = ref::rmsnorm_forward(nx, nw, &rstd);
    return Outputs{wide(y), wide(rstd)};
  });
  expect_same<T>(dc, "rmsnorm_forward (no rstd)", seed,
                 [&] { return Outputs{wide(ref::rmsnorm_forward(nx, nw))}; });
  std::vector<T> rstd;
  (void)ref::rmsnorm_forward(nx, nw, &rstd);
  expect_same<T>(dc, "rmsnorm_backward", seed, [&] {
    ref::Tensor<T> dw = ndw0;
    const auto dx = ref::rmsnorm_backward(ndy, nx, nw, rstd, dw);
    return Outputs{wide(dx), wide(dw)};
  });

  const auto gx = rnd<T>({10, 101}, g, 3.0);
  const auto gdy = rnd<T>({10, 101}, g);
  expect_same<T>(dc, "gelu_forward", seed, [&] { return Outputs{wide(ref::gelu_forward(gx))}; });
  expect_same<T>(dc, "gelu_backward", seed,
                 [&] { return Outputs{wide(ref::gelu_backward(gdy, gx))}; });
}

template <class T>
void check_loss_and_attention(DeviceCompute& dc) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 g(seed);
  const int64_t rows = 13, vocab = 300;
  const auto logits = rnd<T>({rows, vocab}, g, 3.0);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> targets(rows), mask(rows);
  std::vector<double> weight(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const bool on = r % 4 != 1;
    mask[static_cast<std::size_t>(r)] = on ? 1 : 0;
    // A masked row's target is never read: an out-of-vocabulary one must not matter.
    targets[static_cast<std::size_t>(r)] = on ? tok(g) : -1;
    weight[static_cast<std::size_t>(r)] = on ? 0.25 + 0.01 * static_cast<double>(r) : 0.0;
  }
  expect_same<T>(dc, "cross_entropy_forward", seed,
                 [&] { return Outputs{ref::cross_entropy_forward(logits, targets, mask)}; });
  expect_same<T>(dc, "cross_entropy_backward", seed, [&] {
    return Outputs{wide(ref::cross_entropy_backward(logits, targets, weight))};
  });

  // GQA 4/2, two documents and two padding positions, dropout on a head-sharded slice (heads
  // 4..7 of 8, as a TP rank sees them).
  const int64_t s = 19, d = 8;
  const ref::AttentionShape shape{.heads = 4, .kv_heads = 2};
  const auto q = rnd<T>({s, shape.heads * d}, g);
  const auto k = rnd<T>({s, shape.kv_heads * d}, g);
  const auto v = rnd<T>({s, shape.kv_heads * d}, g);
  const auto dout = rnd<T>({s, shape.heads * d}, g);
  std::vector<int32_t> docs(static_cast<std::size_t>(s));
  for (int64_t i = 0; i < s; ++i) docs[static_cast<std::size_t>(i)] = i < 7 ? 0 : (i < 17 ? 1 : -1);
  for (const double rate : {0.0, 0.2}) {
    const ref::AttentionDropout drop{.rate = rate,
                                     .seed = seed,
                                     .layer = 1,
                                     .step = 3,
                                     .sequence = 2,
                                     .head_offset = 4,
                                     .total_heads = 8};
    const std::string tag = " rate " + std::to_string(rate);
    expect_same<T>(dc, ("attention_forward" + tag).c_str(), seed, [&] {
      ref::Tensor<T> probs;
      const auto o = ref::attention_forward(q, k, v, docs, shape, drop, &probs);
      return Outputs{wide(o), wide(probs)};
    });
    expect_same<T>(dc, ("attention_forward (no probs)" + tag).c_str(), seed, [&] {
      return Outputs{wide(ref::attention_forward(q, k, v, docs, shape, drop))};
    });
    ref::Tensor<T> probs;
    (void)ref::attention_forward(q, k, v, docs, shape, drop, &probs);
    expect_same<T>(dc, ("attention_backward" + tag).c_str(), seed, [&] {
      ref::Tensor<T> dq, dk, dv;
      ref::attention_backward(dout, q, k, v, shape, drop, probs, dq, dk, dv);
      return Outputs{wide(dq), wide(dk), wide(dv)};
    });
  }
}

TEST(DeviceCompute, NameAndBadDevice) {
  SC_REQUIRE_GPU();
  DeviceCompute dc(0);
  EXPECT_EQ(dc.name().rfind("cuda:0 (", 0), 0U) << dc.name();
  EXPECT_EQ(dc.ops_run(), 0);
  EXPECT_THROW(DeviceCompute(1 << 20), std::runtime_error);
}

TEST(DeviceCompute, DenseOpsMatchTheCpuF32) {
  SC_REQUIRE_GPU();
  DeviceCompute dc(0);
  check_dense_ops<float>(dc);
}

TEST(DeviceCompute, DenseOpsMatchTheCpuF64) {
  SC_REQUIRE_GPU();
  DeviceCompute dc(0);
  check_dense_ops<double>(dc);
}

TEST(DeviceCompute, LossAndAttentionMatchTheCpuF32) {
  SC_REQUIRE_GPU();
  DeviceCompute dc(0);
  check_loss_and_attention<float>(dc);
}

TEST(DeviceCompute, LossAndAttentionMatchTheCpuF64) {
  SC_REQUIRE_GPU();
  DeviceCompute dc(0);
  check_loss_and_attention<double>(dc);
}

// Empty operands (an expert without tokens, an empty shard) and over-long attention rows go back
// to the CPU (false) instead of launching on zero sizes; the CPU then gives the right result.
TEST(DeviceCompute, FallsBackOnEmptyOperandsAndLongRows) {
  SC_REQUIRE_GPU();
  DeviceCompute dc(0);
  ref::ComputeScope scope(&dc);
  const ref::Tensor<float> x({0, 8}), w({8, 5}, 1.0F), dy({0, 5});
  ref::Tensor<float> dw({8, 5}, 2.0F);
  EXPECT_EQ(ref::linear_forward(x, w).shape(), (ref::Shape{0, 5}));
  const auto dx = ref::linear_backward(dy, x, w, dw);
  EXPECT_EQ(dx.shape(), (ref::Shape{0, 8}));
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_EQ(dw[i], 2.0F);
  EXPECT_EQ(ref::gelu_forward(x).numel(), 0);
  EXPECT_EQ(dc.ops_run(), 0);
  EXPECT_EQ(dc.ops_declined(), 3);

  // One row of f32 probabilities past the shared-memory limit: refused before any copy.
  const auto s = static_cast<int64_t>(kMaxAttentionRowBytes / sizeof(float)) + 1;
  const ref::Tensor<float> q({s, 2}), k({s, 2}), v({s, 2});
  ref::Tensor<float> o({s, 2});
  const std::vector<int32_t> docs(static_cast<std::size_t>(s), 0);
  ref::ComputeOps<float>& ops = dc;
  EXPECT_FALSE(ops.attention_forward(q, k, v, docs, {.heads = 1, .kv_heads = 1}, {}, o, nullptr));
  EXPECT_EQ(dc.ops_run(), 0);
}

// ---- a whole reference model step on the device ------------------------------------------

// Two documents (9 and seq_len - 9 tokens) packed into one sequence.
ref::Sequence two_documents(const ref::ModelConfig& cfg, std::mt19937_64& g, int64_t index) {
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab - 1);
  ref::Sequence s;
  const int lens[] = {9, cfg.seq_len - 9};
  for (int doc = 0; doc < 2; ++doc) {
    std::vector<int32_t> t(static_cast<std::size_t>(lens[doc]));
    for (auto& e : t) e = tok(g);
    for (int i = 0; i < lens[doc]; ++i) {
      const bool last = i + 1 == lens[doc];
      s.tokens.push_back(t[static_cast<std::size_t>(i)]);
      s.targets.push_back(last ? 0 : t[static_cast<std::size_t>(i) + 1]);
      s.loss_mask.push_back(last ? 0 : 1);
      s.doc_ids.push_back(doc);
      s.positions.push_back(i);
    }
  }
  s.index = index;
  return s;
}

template <class T>
void check_model_step(bool checkpointing) {
  ref::ModelConfig cfg;  // layer 0 dense, layer 1 MoE; GQA 4/2
  cfg.vocab = 40;
  cfg.hidden = 32;
  cfg.layers = 2;
  cfg.heads = 4;
  cfg.kv_heads = 2;
  cfg.ffn = 48;
  cfg.seq_len = 16;
  cfg.dropout = 0.1;
  cfg.tie_embeddings = false;
  cfg.moe = ref::MoeConfig{
      .experts = 4, .top_k = 2, .capacity_factor = 1.0, .every = 2, .aux_loss = 0.01};
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 g(seed);
  const auto params = ref::init_params<T>(cfg, seed);
  const std::vector<ref::Sequence> batch{two_documents(cfg, g, 0), two_documents(cfg, g, 1)};
  ref::StepContext ctx;
  ctx.seed = seed;
  ctx.step = 2;
  ctx.recompute = checkpointing ? ref::Recompute::kFull : ref::Recompute::kNone;
  ctx.token_weight = 1.0 / static_cast<double>(batch[0].mask_count() + batch[1].mask_count());
  ctx.sequence_weight = 0.5;

  auto want_grads = params.zeros_like();
  const ref::LossParts want = ref::forward_backward(cfg, params, batch, ctx, &want_grads);
  DeviceCompute dc(0);
  auto got_grads = params.zeros_like();
  ref::LossParts got;
  {
    ref::ComputeScope scope(&dc);
    got = ref::forward_backward(cfg, params, batch, ctx, &got_grads);
  }
  const std::string where =
      "seed " + std::to_string(seed) + " checkpointing " + std::to_string(checkpointing);
  EXPECT_GT(dc.ops_run(), 0) << where;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_LE(rel({got.loss_sum}, {want.loss_sum}), kModelTol<T>) << where;
  EXPECT_LE(rel({got.aux_sum}, {want.aux_sum}), kModelTol<T>) << where;
  ASSERT_EQ(got.per_sequence.size(), want.per_sequence.size());
  for (std::size_t i = 0; i < want.per_sequence.size(); ++i)
    EXPECT_LE(rel(got.per_sequence[i].token_loss, want.per_sequence[i].token_loss), kModelTol<T>)
        << "sequence " << i << " " << where;
  for (const auto& e : want_grads)
    EXPECT_LE(rel(wide(got_grads[e.name]), wide(e.value)), kModelTol<T>) << e.name << " " << where;
}

TEST(DeviceCompute, ModelStepWithMoeMatchesTheCpuF64) {
  SC_REQUIRE_GPU();
  check_model_step<double>(false);
  check_model_step<double>(true);
}

TEST(DeviceCompute, ModelStepWithMoeMatchesTheCpuF32) {
  SC_REQUIRE_GPU();
  check_model_step<float>(false);
  check_model_step<float>(true);
}

}  // namespace
}  // namespace shardcheck::gpu

// CUDA ops against the CPU reference (reference/ops.hpp): fresh random inputs every run (the seed
// is printed on failure), outputs poisoned with NaN before each op, f32 within 1e-5 and f64 within
// 1e-12 normwise relative error (max |gpu - cpu| / max |cpu|). Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "gpu/ops.hpp"
#include "reference/attention.hpp"
#include "reference/ops.hpp"
#include "reference/optim.hpp"
#include "reference/rng.hpp"
#include "tests/gpu/ops_support.hpp"
#include "tests/gpu/support.hpp"

namespace shardcheck::gpu {
namespace {

using testing::DeviceVec;

template <class T>
constexpr double kTol = std::is_same_v<T, float> ? 1e-5 : 1e-12;

using testing::fresh_seed;

template <class T>
ref::Tensor<T> random(ref::Shape shape, std::mt19937_64& g, double scale = 1.0) {
  ref::Tensor<T> t(std::move(shape));
  std::normal_distribution<double> d(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(d(g));
  return t;
}

// A device copy of t, or an output of n elements poisoned with NaN.
template <class T>
struct Dev : DeviceVec<T> {
  explicit Dev(const ref::Tensor<T>& t) : DeviceVec<T>(t.vec()) {}
  explicit Dev(std::size_t n) : DeviceVec<T>(n) { this->poison(); }
};

template <class T>
double rel_err(const std::vector<T>& got, const std::vector<T>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (std::isnan(static_cast<double>(got[i]))) return INFINITY;  // unwritten (poison) or NaN
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class T>
class GpuOps : public testing::SeededGpuTest {};

using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(GpuOps, Types);

TYPED_TEST(GpuOps, LinearAndLinearTForwardBackward) {
  using T = TypeParam;
  const int64_t rows = 37, in = 64, out = 48;
  auto x = random<T>({rows, in}, this->gen_);
  auto w = random<T>({in, out}, this->gen_, 0.2);
  auto dy = random<T>({rows, out}, this->gen_);
  auto dw0 = random<T>({in, out}, this->gen_);  // backward adds into it
  Dev<T> dx_(x), dw_(w), ddy(dy), ddw(dw0);
  Dev<T> y(static_cast<std::size_t>(rows * out)), dx(static_cast<std::size_t>(rows * in));
  ops::linear_forward(*this->ctx_, dx_.data(), dw_.data(), y.data(), rows, in, out);
  ops::linear_backward(*this->ctx_, ddy.data(), dx_.data(), dw_.data(), dx.data(), ddw.data(), rows,
                       in, out);
  this->ctx_->synchronize();
  ref::Tensor<T> dw_ref = dw0;
  EXPECT_LE(rel_err(y.download(), ref::linear_forward(x, w).vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(dx.download(), ref::linear_backward(dy, x, w, dw_ref).vec()), kTol<T>)
      << this->seed_;
  EXPECT_LE(rel_err(ddw.download(), dw_ref.vec()), kTol<T>) << this->seed_;

  // Tied head: w [out, in].
  auto wt = random<T>({out, in}, this->gen_, 0.2);
  auto dwt0 = random<T>({out, in}, this->gen_);
  Dev<T> dwt(wt), ddwt(dwt0);
  Dev<T> yt(static_cast<std::size_t>(rows * out)), dxt(static_cast<std::size_t>(rows * in));
  ops::linear_t_forward(*this->ctx_, dx_.data(), dwt.data(), yt.data(), rows, in, out);
  ops::linear_t_backward(*this->ctx_, ddy.data(), dx_.data(), dwt.data(), dxt.data(), ddwt.data(),
                         rows, in, out);
  this->ctx_->synchronize();
  ref::Tensor<T> dwt_ref = dwt0;
  EXPECT_LE(rel_err(yt.download(), ref::linear_t_forward(x, wt).vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(dxt.download(), ref::linear_t_backward(dy, x, wt, dwt_ref).vec()), kTol<T>)
      << this->seed_;
  EXPECT_LE(rel_err(ddwt.download(), dwt_ref.vec()), kTol<T>) << this->seed_;
}

TYPED_TEST(GpuOps, RmsNormForwardBackward) {
  using T = TypeParam;
  const int64_t rows = 19, h = 300;  // h not a multiple of the block
  auto x = random<T>({rows, h}, this->gen_, 2.0);
  auto w = random<T>({h}, this->gen_);
  auto dy = random<T>({rows, h}, this->gen_);
  auto dw0 = random<T>({h}, this->gen_);
  Dev<T> dx_(x), dw_(w), ddy(dy), ddw(dw0);
  Dev<T> y(static_cast<std::size_t>(rows * h)), rstd(static_cast<std::size_t>(rows)),
      dx(static_cast<std::size_t>(rows * h));
  ops::rmsnorm_forward(*this->ctx_, dx_.data(), dw_.data(), y.data(), rstd.data(), rows, h);
  ops::rmsnorm_backward(*this->ctx_, ddy.data(), dx_.data(), dw_.data(), rstd.data(), dx.data(),
                        ddw.data(), rows, h);
  this->ctx_->synchronize();
  std::vector<T> rstd_ref;
  const auto y_ref = ref::rmsnorm_forward(x, w, &rstd_ref);
  ref::Tensor<T> dw_ref = dw0;
  const auto dx_ref = ref::rmsnorm_backward(dy, x, w, rstd_ref, dw_ref);
  EXPECT_LE(rel_err(y.download(), y_ref.vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(rstd.download(), rstd_ref), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(dx.download(), dx_ref.vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(ddw.download(), dw_ref.vec()), kTol<T>) << this->seed_;
}

TYPED_TEST(GpuOps, GeluForwardBackward) {
  using T = TypeParam;
  const int64_t n = 5000;
  auto x = random<T>({n}, this->gen_, 3.0);
  auto dy = random<T>({n}, this->gen_);
  Dev<T> dx_(x), ddy(dy);
  Dev<T> y(static_cast<std::size_t>(n)), dx(static_cast<std::size_t>(n));
  ops::gelu_forward(*this->ctx_, dx_.data(), y.data(), n);
  ops::gelu_backward(*this->ctx_, ddy.data(), dx_.data(), dx.data(), n);
  this->ctx_->synchronize();
  EXPECT_LE(rel_err(y.download(), ref::gelu_forward(x).vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(dx.download(), ref::gelu_backward(dy, x).vec()), kTol<T>) << this->seed_;
}

TYPED_TEST(GpuOps, EmbeddingForwardBackward) {
  using T = TypeParam;
  const int64_t vocab = 50, h = 33, ntok = 70;  // repeated tokens: backward accumulates
  auto table = random<T>({vocab, h}, this->gen_);
  auto dy = random<T>({ntok, h}, this->gen_);
  auto dt0 = random<T>({vocab, h}, this->gen_);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(ntok));
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(vocab - 1));
  for (auto& t : tokens) t = pick(this->gen_);
  Dev<T> dtab(table), ddy(dy), ddt(dt0);
  DeviceVec<std::int32_t> dtok(tokens);
  Dev<T> y(static_cast<std::size_t>(ntok * h));
  ops::embedding_forward(*this->ctx_, dtab.data(), dtok.data(), y.data(), ntok, vocab, h);
  ops::embedding_backward(*this->ctx_, ddy.data(), dtok.data(), ddt.data(), ntok, h);
  this->ctx_->synchronize();
  ref::Tensor<T> dt_ref = dt0;
  ref::embedding_backward(dy, tokens, dt_ref);
  EXPECT_EQ(y.download(), ref::embedding_forward(table, tokens).vec()) << this->seed_;
  EXPECT_LE(rel_err(ddt.download(), dt_ref.vec()), kTol<T>) << this->seed_;
}

TYPED_TEST(GpuOps, CrossEntropyForwardBackward) {
  using T = TypeParam;
  const int64_t rows = 23, vocab = 1000;
  auto logits = random<T>({rows, vocab}, this->gen_, 3.0);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(rows)), mask(targets.size());
  std::vector<double> weight(targets.size());
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(vocab - 1));
  for (std::size_t r = 0; r < targets.size(); ++r) {
    targets[r] = pick(this->gen_);
    mask[r] = r % 4 == 3 ? 0 : 1;
    weight[r] = mask[r] != 0 ? 1.0 / static_cast<double>(rows) : 0.0;
  }
  Dev<T> dl(logits);
  DeviceVec<std::int32_t> dtgt(targets), dmask(mask);
  DeviceVec<double> dweight(weight), loss(targets.size());
  loss.poison();
  Dev<T> dlogits(static_cast<std::size_t>(rows * vocab));
  ops::cross_entropy_forward(*this->ctx_, dl.data(), dtgt.data(), dmask.data(), loss.data(), rows,
                             vocab);
  ops::cross_entropy_backward(*this->ctx_, dl.data(), dtgt.data(), dweight.data(), dlogits.data(),
                              rows, vocab);
  this->ctx_->synchronize();
  const std::vector<double> loss_ref = ref::cross_entropy_forward(logits, targets, mask);
  const std::vector<double> got = loss.download();
  for (std::size_t r = 0; r < got.size(); ++r)
    EXPECT_NEAR(got[r], loss_ref[r], kTol<T> * std::max(1.0, std::abs(loss_ref[r])))
        << "row " << r << " seed " << this->seed_;
  EXPECT_LE(rel_err(dlogits.download(), ref::cross_entropy_backward(logits, targets, weight).vec()),
            kTol<T>)
      << this->seed_;
}

TYPED_TEST(GpuOps, RopeForwardAndInverse) {
  using T = TypeParam;
  const int64_t s = 29, d = 16;
  const int heads = 3;
  auto x = random<T>({s, heads * d}, this->gen_);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(s));
  for (std::size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<std::int32_t>((t * 7) % 13);
  Dev<T> dxv(x);
  DeviceVec<std::int32_t> dpos(pos);
  ops::rope_apply(*this->ctx_, dxv.data(), dpos.data(), s, heads, d, false);
  this->ctx_->synchronize();
  ref::Tensor<T> want = x;
  ref::rope_apply(want, pos, heads, false, ref::RopeConfig{});
  EXPECT_LE(rel_err(dxv.download(), want.vec()), kTol<T>) << this->seed_;
  ops::rope_apply(*this->ctx_, dxv.data(), dpos.data(), s, heads, d, true);
  this->ctx_->synchronize();
  ref::rope_apply(want, pos, heads, true, ref::RopeConfig{});
  EXPECT_LE(rel_err(dxv.download(), want.vec()), kTol<T>) << this->seed_;
}

TYPED_TEST(GpuOps, AttentionWithDocumentsGqaAndDropout) {
  using T = TypeParam;
  const int64_t s = 40, d = 8;
  const int heads = 4, kv = 2;
  auto q = random<T>({s, heads * d}, this->gen_);
  auto k = random<T>({s, kv * d}, this->gen_);
  auto v = random<T>({s, kv * d}, this->gen_);
  auto dout = random<T>({s, heads * d}, this->gen_);
  std::vector<std::int32_t> doc(static_cast<std::size_t>(s));
  for (std::size_t t = 0; t < doc.size(); ++t) doc[t] = t < 15 ? 0 : 1;
  ref::AttentionDropout rd;
  rd.rate = 0.1;
  rd.seed = this->seed_;
  rd.layer = 2;
  rd.step = 3;
  rd.sequence = 1;
  ops::Dropout gd;
  gd.rate = rd.rate;
  gd.seed = rd.seed;
  gd.layer = rd.layer;
  gd.step = rd.step;
  gd.sequence = rd.sequence;
  Dev<T> dq_in(q), dk_in(k), dv_in(v), ddout(dout);
  DeviceVec<std::int32_t> ddoc(doc);
  const auto n = [](int64_t x) { return static_cast<std::size_t>(x); };
  Dev<T> o(n(s * heads * d)), probs(n(heads * s * s)), dq(n(s * heads * d)), dk(n(s * kv * d)),
      dv(n(s * kv * d));
  ops::attention_forward(*this->ctx_, dq_in.data(), dk_in.data(), dv_in.data(), ddoc.data(), s,
                         heads, kv, d, gd, o.data(), probs.data());
  ops::attention_backward(*this->ctx_, ddout.data(), dq_in.data(), dk_in.data(), dv_in.data(),
                          probs.data(), s, heads, kv, d, gd, dq.data(), dk.data(), dv.data());
  this->ctx_->synchronize();
  ref::Tensor<T> probs_ref;
  const auto o_ref = ref::attention_forward(q, k, v, doc, {heads, kv}, rd, &probs_ref);
  ref::Tensor<T> dq_ref, dk_ref, dv_ref;
  ref::attention_backward(dout, q, k, v, {heads, kv}, rd, probs_ref, dq_ref, dk_ref, dv_ref);
  EXPECT_LE(rel_err(o.download(), o_ref.vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(probs.download(), probs_ref.vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(dq.download(), dq_ref.vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(dk.download(), dk_ref.vec()), kTol<T>) << this->seed_;
  EXPECT_LE(rel_err(dv.download(), dv_ref.vec()), kTol<T>) << this->seed_;
}

TYPED_TEST(GpuOps, AdamWNormAndClipOverThreeSteps) {
  using T = TypeParam;
  ref::OptimizerConfig opt;
  ref::ParamMap<T> params;
  params.add("w", {8, 16}) = random<T>({8, 16}, this->gen_);
  params.add("norm", {16}) = random<T>({16}, this->gen_);
  ref::AdamW<T> adam(opt, params);
  ref::ParamMap<T> dev_m = params.zeros_like(), dev_v = params.zeros_like();
  std::map<std::string, std::unique_ptr<DeviceVec<T>>> p, m, v;
  for (const auto& e : params) {
    p[e.name] = std::make_unique<DeviceVec<T>>(e.value.vec());
    m[e.name] = std::make_unique<DeviceVec<T>>(dev_m[e.name].vec());
    v[e.name] = std::make_unique<DeviceVec<T>>(dev_v[e.name].vec());
  }
  for (int t = 1; t <= 3; ++t) {
    ref::ParamMap<T> grads = params.zeros_like();
    for (auto& e : grads) e.value = random<T>(e.value.shape(), this->gen_, 5.0);
    // Norm and clipping (max norm 1: the random gradients are far above it).
    DeviceVec<double> sq(std::vector<double>{0.0});
    std::map<std::string, std::unique_ptr<DeviceVec<T>>> g;
    for (const auto& e : grads) {
      g[e.name] = std::make_unique<DeviceVec<T>>(e.value.vec());
      ops::add_sum_of_squares(*this->ctx_, g[e.name]->data(), e.value.numel(), sq.data());
    }
    this->ctx_->synchronize();
    const double norm = ref::global_grad_norm(grads);
    const double dev_norm = std::sqrt(sq.download()[0]);
    EXPECT_NEAR(dev_norm, norm, 1e-12 * norm) << this->seed_;
    const double factor = ref::clip_grad_norm(grads, norm, 1.0);
    const double lr = ref::lr_at(opt, t, 3);
    adam.step(params, grads, lr);
    const ops::AdamWStep st{lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, t};
    for (const auto& e : params) {
      ops::scale_inplace(*this->ctx_, g[e.name]->data(), e.value.numel(), factor);
      ops::adamw_update(*this->ctx_, p[e.name]->data(), g[e.name]->data(), m[e.name]->data(),
                        v[e.name]->data(), e.value.numel(), e.value.rank() == 2, st);
    }
    this->ctx_->synchronize();
    for (const auto& e : params) {
      EXPECT_LE(rel_err(p[e.name]->download(), e.value.vec()), kTol<T>) << e.name << " t " << t;
      EXPECT_LE(rel_err(m[e.name]->download(), adam.exp_avg()[e.name].vec()), kTol<T>) << e.name;
      EXPECT_LE(rel_err(v[e.name]->download(), adam.exp_avg_sq()[e.name].vec()), kTol<T>)
          << e.name << " seed " << this->seed_;
    }
  }
}

TEST(GpuRng, PhiloxBlocksAndUniformsAreBitwiseTheReferenceNormalsToAnUlp) {
  SC_REQUIRE_GPU();
  ops::Context ctx(0);
  const std::uint64_t seed = fresh_seed();
  const auto stream = ref::RngStream::of(seed, "dropout/layers.3", 17);
  const std::uint64_t first = (std::uint64_t{1} << 33) - 100;  // crosses the 32-bit boundary
  const int64_t n = 4096;
  DeviceVec<std::uint32_t> blocks(static_cast<std::size_t>(4 * n));
  DeviceVec<double> uni(static_cast<std::size_t>(n)), nor(static_cast<std::size_t>(n));
  ops::philox_blocks(ctx, seed, stream.stream, stream.step, first, blocks.data(), n);
  ops::rng_uniform(ctx, seed, stream.stream, stream.step, first, uni.data(), n);
  ops::rng_normal(ctx, seed, stream.stream, stream.step, first, nor.data(), n);
  ctx.synchronize();
  const auto b = blocks.download();
  const auto u = uni.download();
  const auto z = nor.download();
  for (int64_t i = 0; i < n; ++i) {
    const auto want = stream.block(first + static_cast<std::uint64_t>(i));
    for (std::size_t k = 0; k < 4; ++k)
      ASSERT_EQ(b[static_cast<std::size_t>(4 * i) + k], want[k]) << "i " << i << " seed " << seed;
    ASSERT_EQ(u[static_cast<std::size_t>(i)],
              stream.uniform(first + static_cast<std::uint64_t>(i)));
    const double zn = stream.normal(first + static_cast<std::uint64_t>(i));
    ASSERT_NEAR(z[static_cast<std::size_t>(i)], zn, 1e-14 * std::max(1.0, std::abs(zn)));
  }
}

}  // namespace
}  // namespace shardcheck::gpu

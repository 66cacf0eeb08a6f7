// Training-level checks: the loss falls on the synthetic data, runs are deterministic, dropout is
// keyed per step, and the f32 and bf16 recipes track f64 within stated tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <stdexcept>

#include "reference/bf16.hpp"
#include "reference/data.hpp"
#include "reference/model.hpp"
#include "reference/optim.hpp"
#include "reference/trainer.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref {
namespace {

struct RunSetup {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
};

RunSetup learning_setup(bool moe) {
  RunSetup s;
  s.model = test::tiny_dense();
  s.model.hidden = 32;
  s.model.ffn = 64;
  s.model.seq_len = 16;
  if (moe)
    s.model.moe =
        MoeConfig{.experts = 4, .top_k = 2, .capacity_factor = 1.25, .every = 2, .aux_loss = 0.01};
  s.train.steps = 200;
  s.train.global_batch = 8;
  s.train.micro_batch = 8;
  s.train.optimizer.lr = 1e-2;
  s.train.optimizer.warmup = 10;
  s.train.optimizer.min_lr = 1e-3;
  s.train.optimizer.weight_decay = 0.01;
  s.train.precision = Precision::kF32;
  s.data.documents = 1024;
  s.data.min_len = 4;
  s.data.max_len = 24;
  return s;
}

double mean_loss(const std::vector<StepRecord>& steps, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += steps[i].loss;
  return sum / static_cast<double>(to - from);
}

class LossFalls : public ::testing::TestWithParam<bool> {};

// Benchmark-style: a generous bound on the mean loss of the last 20 steps vs step 1, not a timing.
TEST_P(LossFalls, Over200StepsOnSyntheticData) {
  if (test::kSanitized) GTEST_SKIP() << "200 training steps take minutes under sanitizers";
  const RunSetup s = learning_setup(GetParam());
  const Dataset ds = build_dataset(s.data, s.model, 1);
  DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch, 1,
                             true);
  Trainer trainer(s.model, s.train, 1);
  const TrainResult r = trainer.run(sampler_batch_source(ds, sampler));
  ASSERT_EQ(r.steps.size(), 200u);
  const double first = r.steps[0].loss, last = mean_loss(r.steps, 180, 200);
  std::printf("loss: step 1 %.4f, mean of the last 20 steps %.4f (ln V = %.4f)\n", first, last,
              std::log(s.model.vocab));
  EXPECT_NEAR(first, std::log(s.model.vocab), 0.05);  // init 0.02: near-uniform predictions
  EXPECT_LT(last, 0.6 * first);                       // measured ~0.40 * first
  for (const auto& st : r.steps) ASSERT_TRUE(std::isfinite(st.loss) && std::isfinite(st.grad_norm));
}

INSTANTIATE_TEST_SUITE_P(DenseAndMoe, LossFalls, ::testing::Values(false, true));

TrainResult run_with(RunSetup s, Precision p, int steps) {
  s.train.precision = p;
  s.train.steps = steps;
  const Dataset ds = build_dataset(s.data, s.model, 2);
  DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch, 2,
                             true);
  Trainer trainer(s.model, s.train, 2);
  return trainer.run(sampler_batch_source(ds, sampler));
}

// ||p - p_f64|| / ||p_f64 - p_init|| over all parameters (L2): how far the recipe drifts compared
// with how far training moved the weights. (A max-norm is dominated by Adam's sign-like updates of
// near-zero gradients, which rounding may flip.)
double param_drift(const ParamMap<double>& p, const ParamMap<double>& ref,
                   const ParamMap<double>& init) {
  double diff = 0, moved = 0;
  for (const auto& e : ref)
    for (int64_t i = 0; i < e.value.numel(); ++i) {
      diff += std::pow(p[e.name][i] - e.value[i], 2);
      moved += std::pow(e.value[i] - init[e.name][i], 2);
    }
  return std::sqrt(diff / moved);
}

class Recipes : public ::testing::TestWithParam<bool> {};

// Tolerances (DESIGN.md parity rule): f32 loss relative error <= 1e-5; bf16 recipe loss relative
// error <= 2e-2; parameter drift (L2, below) f32 <= 1e-4 and bf16 <= 0.25 after 5 steps.
TEST_P(Recipes, F32AndBf16TrackF64) {
  RunSetup s = learning_setup(GetParam());
  const int steps = 5;
  const TrainResult r64 = run_with(s, Precision::kF64, steps);
  const TrainResult r32 = run_with(s, Precision::kF32, steps);
  const TrainResult rbf = run_with(s, Precision::kBf16, steps);
  const ParamMap<double> init = init_params<double>(s.model, 2);
  double e32 = 0, ebf = 0;
  for (int i = 0; i < steps; ++i) {
    const double l = r64.steps[static_cast<size_t>(i)].loss;
    e32 = std::max(e32, std::abs(r32.steps[static_cast<size_t>(i)].loss - l) / l);
    ebf = std::max(ebf, std::abs(rbf.steps[static_cast<size_t>(i)].loss - l) / l);
  }
  const double d32 = param_drift(r32.params, r64.params, init);
  const double dbf = param_drift(rbf.params, r64.params, init);
  std::printf("loss rel err: f32 %.3g bf16 %.3g; param drift: f32 %.3g bf16 %.3g\n", e32, ebf, d32,
              dbf);
  EXPECT_LT(e32, 1e-5);
  EXPECT_LT(ebf, 2e-2);
  EXPECT_LT(d32, 1e-4);
  EXPECT_LT(dbf, 0.25);
  EXPECT_GT(ebf, 0.0);  // the recipe really rounds
}

INSTANTIATE_TEST_SUITE_P(DenseAndMoe, Recipes, ::testing::Values(false, true));

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 0x1.0p-8f), 1.0f);                  // tie, 1.0 is even
  EXPECT_EQ(round_to_bf16(1.0f + 3 * 0x1.0p-8f), 1.0f + 0x1.0p-6f);  // tie, rounds up to even
  EXPECT_EQ(round_to_bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 1.0f + 0x1.0p-7f);  // above the tie
  EXPECT_EQ(round_to_bf16(-2.5f), -2.5f);
  EXPECT_TRUE(std::isnan(round_to_bf16(std::nanf(""))));
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()),
            std::numeric_limits<float>::infinity());
}

// The bf16 recipe with the tied embedding's two uses rounded apart (a pipeline's first and last
// stage each round one): the embedding's gradient differs from rounding their sum (by about a bf16
// ulp in some elements, so not bitwise), the other parameters' first step does not; f32 and
// models without tied embeddings are untouched.
TEST(Trainer, TiedUsesRoundedApartChangeOnlyTheBf16TiedGradient) {
  RunSetup s = learning_setup(false);
  s.train.steps = 1;
  const Dataset ds = build_dataset(s.data, s.model, 2);
  const auto grads = [&](Precision p, bool tied, bool apart) {
    RunSetup t = s;
    t.train.precision = p;
    t.model.tie_embeddings = tied;
    DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), t.train.global_batch, 2,
                               true);
    Trainer trainer(t.model, t.train, 2);
    trainer.round_tied_uses_apart(apart);
    trainer.step(gather_batch(ds, sampler.next_global_batch()));
    return trainer.last_grads();
  };
  const ParamMap<double> sum = grads(Precision::kBf16, true, false);
  const ParamMap<double> apart = grads(Precision::kBf16, true, true);
  double moved = 0;
  for (std::size_t i = 0; i < sum["embed.weight"].vec().size(); ++i) {
    const double a = sum["embed.weight"].vec()[i], b = apart["embed.weight"].vec()[i];
    moved = std::max(moved, std::abs(a - b) / std::max(std::abs(a), 1e-30));
  }
  EXPECT_GT(moved, 0.0) << "rounding the uses apart changed nothing";
  EXPECT_LT(moved, 1.0);
  for (const auto& e : sum)
    if (e.name != "embed.weight") {
      EXPECT_EQ(e.value.vec(), apart[e.name].vec()) << e.name;
    }
  for (const bool tied : {true, false}) {
    const Precision p = tied ? Precision::kF32 : Precision::kBf16;
    const ParamMap<double> a = grads(p, tied, false), b = grads(p, tied, true);
    for (const auto& e : a) EXPECT_EQ(e.value.vec(), b[e.name].vec()) << e.name;
  }
}

TEST(Trainer, RunsAreBitwiseDeterministic) {
  RunSetup s = learning_setup(true);
  s.model.dropout = 0.1;
  const TrainResult a = run_with(s, Precision::kF64, 3), b = run_with(s, Precision::kF64, 3);
  for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss);
  for (const auto& e : a.params) EXPECT_EQ(e.value.vec(), b.params[e.name].vec());
}

TEST(Trainer, DropoutIsKeyedByStep) {
  ModelConfig cfg = test::tiny_dense();
  cfg.dropout = 0.3;
  TrainConfig train;
  train.steps = 2;
  train.global_batch = 2;
  train.micro_batch = 2;
  train.optimizer.lr = 0.0;  // weights stay put: only the dropout mask can change the loss
  train.optimizer.min_lr = 0.0;
  const Batch batch = test::tiny_batch(cfg, 2);
  Trainer t(cfg, train, 5);
  const TrainResult r = t.run([&](int) { return batch; });
  EXPECT_NE(r.steps[0].loss, r.steps[1].loss);
  cfg.dropout = 0.0;
  Trainer t0(cfg, train, 5);
  const TrainResult r0 = t0.run([&](int) { return batch; });
  EXPECT_EQ(r0.steps[0].loss, r0.steps[1].loss);
}

TEST(Trainer, ObserverSeesTheContractedNames) {
  const ModelConfig cfg = test::tiny_moe();
  TrainConfig train;
  train.steps = 2;
  train.global_batch = 4;
  train.micro_batch = 2;
  const Batch batch = test::tiny_batch(cfg, 4);
  Trainer t(cfg, train, 5);
  std::set<std::string> names;
  t.set_observer([&](const std::string& n, const HostArray& a) {
    EXPECT_TRUE(names.insert(n).second) << "observed twice: " << n;
    EXPECT_EQ(std::visit([](const auto& v) { return static_cast<int64_t>(v.size()); }, a.data),
              a.numel());
  });
  t.run([&](int) { return batch; });
  const size_t np = param_shapes(cfg).size();
  EXPECT_EQ(names.size(), np /*init*/ + 2 * 5 /*batch*/ + 2 * (1 + 2 * np));
  EXPECT_TRUE(names.count("batch/1/doc_ids"));
  EXPECT_TRUE(names.count("step2/grad/layers.1.moe.experts.3.w_down"));
  EXPECT_TRUE(names.count("init/param/layers.1.moe.router"));
  EXPECT_FALSE(names.count("batch/2/tokens"));
}

// Each step's expert load: every non-padding token's top-k choices counted once per MoE layer,
// kept within capacity, and the drops are what the layers dropped (capacity factor 0.5 forces
// some).
TEST(Trainer, StepRecordsCountEachMoeLayersExpertLoad) {
  ModelConfig cfg = test::tiny_moe();
  cfg.moe->capacity_factor = 0.5;
  TrainConfig train;
  train.steps = 2;
  train.global_batch = 4;
  train.micro_batch = 2;
  Batch batch = test::tiny_batch(cfg, 4);
  for (int t = cfg.seq_len - 4; t < cfg.seq_len; ++t) {  // the last sequence ends in padding
    Sequence& last = batch.back();
    const auto i = static_cast<std::size_t>(t);
    last.tokens[i] = last.targets[i] = last.loss_mask[i] = 0;
    last.doc_ids[i] = -1;
  }
  int64_t tokens = 0;
  for (const Sequence& s : batch)
    for (int32_t id : s.doc_ids) tokens += id >= 0;
  ASSERT_LT(tokens, 4 * cfg.seq_len);  // padding, which is not routed
  Trainer t(cfg, train, 5);
  const TrainResult r = t.run([&](int) { return batch; });
  const ParamMap<double> params = init_params<double>(cfg, 5);
  const LossParts parts =
      forward_backward(cfg, params, std::span<const Sequence>(batch), StepContext{}, nullptr);
  int64_t dropped = 0;
  for (const SequenceLoss& s : parts.per_sequence) dropped += s.moe_dropped;
  ASSERT_GT(dropped, 0);
  ASSERT_EQ(r.moe_load.size(), 2u);
  for (const std::vector<MoeLoad>& step : r.moe_load) {
    ASSERT_EQ(step.size(), 1u);  // layers 0, 1 with every 2: layer 1
    const MoeLoad& l = step[0];
    EXPECT_EQ(l.layer, 1);
    ASSERT_EQ(l.routed.size(), 4u);
    int64_t routed = 0;
    for (std::size_t e = 0; e < 4; ++e) {
      EXPECT_LE(l.kept[e], l.routed[e]);
      routed += l.routed[e];
    }
    EXPECT_EQ(routed, tokens * cfg.moe->top_k);
  }
  // Step 1 routes with the initial parameters, as forward_backward above does.
  EXPECT_EQ(r.moe_load[0], parts.moe_load);
  EXPECT_EQ(r.moe_load[0][0].dropped(), dropped);
  EXPECT_EQ(r.steps[0].moe_dropped, dropped);
  EXPECT_TRUE(
      Trainer(test::tiny_dense(), train, 5).run([&](int) { return batch; }).moe_load[0].empty());
}

class Resume : public ::testing::TestWithParam<Precision> {};

TEST_P(Resume, SaveLoadContinuesBitwise) {
  ModelConfig cfg = test::tiny_moe();
  cfg.dropout = 0.1;
  TrainConfig train;
  train.steps = 4;
  train.global_batch = 2;
  train.micro_batch = 1;
  train.precision = GetParam();
  train.optimizer.lr = 1e-2;
  std::vector<Batch> batches;
  for (int i = 0; i < 4; ++i)
    batches.push_back(test::tiny_batch(cfg, 2, 40 + static_cast<uint64_t>(i)));
  auto source = [&](int step) { return batches.at(static_cast<size_t>(step - 1)); };
  Trainer whole(cfg, train, 6);
  const TrainResult all = whole.run(source);
  Trainer first(cfg, train, 6);
  first.step(source(1));
  first.step(source(2));
  const TrainerState saved = first.save();
  // Same seed (it keys dropout); parameters and moments come from the state.
  Trainer resumed(cfg, train, 6);
  resumed.load(saved);
  const TrainResult rest = resumed.run(source);
  ASSERT_EQ(rest.steps.size(), 2u);
  EXPECT_EQ(rest.steps[0].step, 3);
  EXPECT_EQ(rest.steps[1].loss, all.steps[3].loss);
  for (const auto& e : all.params) EXPECT_EQ(e.value.vec(), rest.params[e.name].vec()) << e.name;
  // A trainer built with another seed takes its weights from the state too.
  Trainer other(cfg, train, 999);
  other.load(saved);
  EXPECT_EQ(other.params()["embed.weight"].vec(), saved.params["embed.weight"].vec());
}

INSTANTIATE_TEST_SUITE_P(Precisions, Resume,
                         ::testing::Values(Precision::kF64, Precision::kF32, Precision::kBf16));

TEST(Trainer, RefusesImpossibleConfigsAndWrongBatchSizes) {
  ModelConfig bad = test::tiny_dense();
  bad.kv_heads = 3;  // does not divide heads
  EXPECT_THROW(Trainer(bad, TrainConfig{}, 1), std::invalid_argument);
  TrainConfig split;
  split.global_batch = 4;
  split.micro_batch = 3;
  EXPECT_THROW(Trainer(test::tiny_dense(), split, 1), std::invalid_argument);
  Trainer t(test::tiny_dense(), TrainConfig{}, 1);  // global_batch 8
  EXPECT_THROW(t.step(test::tiny_batch(test::tiny_dense(), 2)), std::logic_error);
  EXPECT_EQ(t.steps_done(), 0);
}

TEST(Trainer, GradNormIsReportedBeforeClipping) {
  const ModelConfig cfg = test::tiny_dense();
  TrainConfig train;
  train.steps = 1;
  train.global_batch = 2;
  train.micro_batch = 1;
  train.clip_grad_norm = 1e-3;
  Trainer t(cfg, train, 5);
  const StepRecord r = t.step(test::tiny_batch(cfg, 2));
  EXPECT_NEAR(global_grad_norm(t.last_grads()), r.grad_norm, 1e-15 * r.grad_norm);
  EXPECT_GT(r.grad_norm, 1e-3);
  EXPECT_NEAR(r.clip_factor, 1e-3 / (r.grad_norm + 1e-6), 1e-18);
  const Batch b = test::tiny_batch(cfg, 2);
  int64_t real = 0, mask = 0;
  for (const Sequence& seq : b) {
    mask += seq.mask_count();
    for (int32_t id : seq.doc_ids) real += id >= 0;
  }
  EXPECT_EQ(r.non_padding_tokens, real);
  EXPECT_EQ(r.tokens, mask);
  EXPECT_EQ(r.sequences, 2);
}

}  // namespace
}  // namespace shardcheck::ref

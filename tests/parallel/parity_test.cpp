// Parity of DDP and ZeRO-1/2/3 against the single-device reference Trainer on the same global
// batches (DESIGN.md "Parity rule"): DP sizes 1, 2, 3, 4, 8, dense and MoE, f64 (and f32), with
// gradient accumulation, clipping, dropout and uneven shards, 3 steps, every parameter gathered.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <tuple>

#include "parallel/flat.hpp"
#include "reference/model.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::test {
namespace {

// The reference runs once per process and setup.
const Trace& reference_of(const Scenario& s) {
  static std::map<std::string, Trace> cache;
  const std::string key = s.name + "/" + ref::to_string(s.train.precision);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, reference_run(s)).first;
  return it->second;
}

Scenario setup_named(const std::string& name) {
  return name == "moe" ? moe_setup() : dense_setup();
}

constexpr std::size_t kBucketElems = 500;  // several buckets on the tiny models

using Param = StrategyParam;

class DataParallelParity : public ::testing::TestWithParam<Param> {};

TEST_P(DataParallelParity, F64MatchesReferenceEveryStep) {
  const auto& [name, strategy, world] = GetParam();
  const Scenario s = setup_named(name);
  const Trace& want = reference_of(s);
  const DpRun got = dp_run(s, world, {.strategy = strategy, .bucket_elems = kBucketElems});
  const Parity p = compare(want, got);
  std::printf("parity %s %s dp%d: loss %.2e params %.2e\n", name.c_str(),
              std::string(name_of(strategy)).c_str(), world, p.loss, p.params);
  EXPECT_LE(p.max(), kF64Tolerance) << "worst: " << p.worst;
  // Every rank ends each step with bitwise the same parameters (deterministic collectives).
  for (std::size_t r = 1; r < got.ranks.size(); ++r)
    for (std::size_t k = 0; k < want.steps.size(); ++k)
      for (const auto& e : got.ranks[0].params[k])
        ASSERT_EQ(got.ranks[r].params[k][e.name].vec(), e.value.vec())
            << "rank " << r << " step " << k + 1 << " " << e.name;
  // The global records agree too (counts exactly, norms within the tolerance).
  for (const Trace& r : got.ranks)
    for (std::size_t k = 0; k < want.steps.size(); ++k) {
      EXPECT_EQ(r.steps[k].tokens, want.steps[k].tokens);
      EXPECT_EQ(r.steps[k].sequences, want.steps[k].sequences);
      EXPECT_EQ(r.steps[k].non_padding_tokens, want.steps[k].non_padding_tokens);
      EXPECT_LE(rel_err(r.steps[k].grad_norm, want.steps[k].grad_norm), kF64Tolerance);
      EXPECT_LE(rel_err(r.steps[k].clip_factor, want.steps[k].clip_factor), kF64Tolerance);
      EXPECT_EQ(r.steps[k].lr, want.steps[k].lr);
    }
}

INSTANTIATE_TEST_SUITE_P(Matrix, DataParallelParity,
                         ::testing::Combine(::testing::Values("dense", "moe"),
                                            ::testing::Values(Strategy::ddp, Strategy::zero1,
                                                              Strategy::zero2, Strategy::zero3),
                                            ::testing::Values(1, 2, 3, 4, 8)),
                         strategy_param_name);

// The setups exercise what the parity claim is about: clipping on every step, accumulation over
// several microbatches on every rank, and padded (uneven) shards.
TEST(DataParallelSetup, ClippingAccumulationAndUnevenShardsAreExercised) {
  for (const Scenario& s : {dense_setup(), moe_setup()}) {
    for (const ref::StepRecord& r : reference_of(s).steps) {
      EXPECT_LT(r.clip_factor, 1.0) << s.name << " step " << r.step;
      if (s.model.moe) {
        EXPECT_GT(r.aux, 0.0) << s.name << " step " << r.step;
      }
    }
    EXPECT_GE(s.train.global_batch / 8 / s.train.micro_batch, 3) << s.name;
  }
  const auto padding = [](const Scenario& s, int d) {
    return FlatLayout(ref::param_shapes(s.model), d).padding();
  };
  for (int d : {4, 8}) EXPECT_GT(padding(dense_setup(), d), 0u) << "dense dp" << d;
  EXPECT_GT(padding(moe_setup(), 3), 0u);
}

std::string strategy_name(const ::testing::TestParamInfo<Strategy>& info) {
  return std::string(name_of(info.param));
}

// f32: parameters, gradients, moments and collectives in float, against the f32 reference.
class DataParallelParityF32 : public ::testing::TestWithParam<Strategy> {};

TEST_P(DataParallelParityF32, MatchesF32Reference) {
  for (Scenario s : {dense_setup(), moe_setup()}) {
    s.train.precision = ref::Precision::kF32;
    const int world = s.model.moe ? 4 : 3;
    const Parity p = compare(
        reference_of(s), dp_run(s, world, {.strategy = GetParam(), .bucket_elems = kBucketElems}));
    std::printf("parity f32 %s %s dp%d: loss %.2e params %.2e\n", s.name.c_str(),
                std::string(name_of(GetParam())).c_str(), world, p.loss, p.params);
    EXPECT_LE(p.max(), kF32Tolerance) << s.name << " worst: " << p.worst;
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, DataParallelParityF32,
                         ::testing::Values(Strategy::ddp, Strategy::zero1, Strategy::zero2,
                                           Strategy::zero3),
                         strategy_name);

// Knobs that must not change the numbers: bucket size (one bucket per parameter, one bucket for
// everything) and activation checkpointing.
TEST(DataParallelVariants, BucketSizesAndCheckpointingKeepParity) {
  const Scenario s = dense_setup();
  for (std::size_t bucket : {std::size_t{0}, std::size_t{1} << 30}) {
    const Parity p = compare(reference_of(s), dp_run(s, 3, {.bucket_elems = bucket}));
    EXPECT_LE(p.max(), kF64Tolerance) << "bucket " << bucket << ": " << p.worst;
  }
  for (const Scenario& base : {dense_setup(), moe_setup()}) {
    for (const ref::Recompute mode : {ref::Recompute::kSelective, ref::Recompute::kFull}) {
      Scenario ckpt = base;
      ckpt.train.recompute = mode;
      for (Strategy st : {Strategy::ddp, Strategy::zero3}) {
        const Parity p = compare(reference_of(base), dp_run(ckpt, 4, {.strategy = st}));
        EXPECT_LE(p.max(), kF64Tolerance) << base.name << " recompute " << ref::to_string(mode)
                                          << " " << name_of(st) << ": " << p.worst;
      }
    }
  }
}

// ZeRO-3 over one wrap unit, the whole model (the matrix runs the default, per block).
TEST(DataParallelVariants, Zero3WholeModelGather) {
  for (const Scenario& s : {dense_setup(), moe_setup()})
    for (int world : {3, 4}) {
      DataParallelOptions o{.strategy = Strategy::fsdp};
      o.fsdp = {.wrap = WrapPolicy::whole_model, .prefetch = 0};
      const Parity p = compare(reference_of(s), dp_run(s, world, o));
      std::printf("parity %s zero3 whole_model dp%d: loss %.2e params %.2e\n", s.name.c_str(),
                  world, p.loss, p.params);
      EXPECT_LE(p.max(), kF64Tolerance) << s.name << " dp" << world << ": " << p.worst;
    }
}

TEST(DataParallelMesh, RefusesIndivisibleBatches) {
  Scenario s = dense_setup();
  sim::SimWorld(2).run([&](comm::Communicator& c) {
    ref::TrainConfig t = s.train;
    t.global_batch = 6;
    t.micro_batch = 3;
    EXPECT_NO_THROW(MeshEngine(c, s.model, t, 1, dp_mesh(2, {})));
    t.micro_batch = 2;  // 3 sequences per rank
    EXPECT_THROW(MeshEngine(c, s.model, t, 1, dp_mesh(2, {})), MeshConfigError);
  });
  sim::SimWorld(5).run([&](comm::Communicator& c) {  // 48 % 5
    EXPECT_THROW(MeshEngine(c, s.model, s.train, 1, dp_mesh(5, {})), MeshConfigError);
  });
}

}  // namespace
}  // namespace shardcheck::parallel::test

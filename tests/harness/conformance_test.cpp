// The planner's conformance test (issue 17): for every configuration of the parity matrix the
// planner times, the op log of the engine's numeric run and of the planner's timing-only run on the
// same small model agree rank by rank (harness/conformance.hpp); a bug planted in the engine's
// reductions makes them differ. The stage bound's replayed blocks give the full run's sums.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli_support.hpp"
#include "harness/conformance.hpp"
#include "harness/driver.hpp"
#include "harness/plan.hpp"
#include "harness/plan_skeleton.hpp"
#include "harness/scenario.hpp"
#include "harness/sim_options.hpp"
#include "sim/clock.hpp"

namespace shardcheck::harness {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> parity_scenarios() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(shardcheck::testing::kScenarios + "/parity"))
    if (e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Conformance, ThePlannerIssuesWhatTheEngineIssuesOnEveryConfiguration) {
  int checked = 0, tensor_parallel = 0, moe_model_parallel = 0, expert_parallel = 0, ring = 0;
  for (const fs::path& file : parity_scenarios()) {
    const Scenario s = load_scenario(file.string());
    for (const ParallelSpec& p : s.configs) {
      if (!unsupported(s, p).empty()) continue;
      ++checked;
      if (p.mesh.tp > 1) ++tensor_parallel;
      if (s.model.moe && (p.mesh.tp > 1 || p.mesh.cp > 1)) ++moe_model_parallel;
      if (p.mesh.ep > 1) ++expert_parallel;
      if (p.mesh.cp > 1 && p.cp_algo == parallel::CpAlgo::ring) ++ring;
      EXPECT_EQ(conformance(s, p), "") << file.filename().string();
    }
  }
  EXPECT_GT(checked, 150);
  EXPECT_GT(tensor_parallel, 0);
  EXPECT_GT(moe_model_parallel, 0);  // MoE layers under TP
  EXPECT_GT(expert_parallel, 20);    // f64, f32 and bf16; with DP, TP (+SP), PP, CP, ZeRO, FSDP
  EXPECT_GT(ring, 10);               // ring attention, its ranks' steps unalike
  std::printf(
      "conformance: %d configurations checked (%d with TP, %d MoE under TP or CP, %d with EP, %d "
      "with ring CP)\n",
      checked, tensor_parallel, moe_model_parallel, expert_parallel, ring);
}

// The stage bound's run (Skeleton::run_replaying: each kind of block issued once and replayed on a
// bound_only clock) gives each stage representative the sums of the skeleton's full run on the
// same clock: for every configuration of the parity matrix (dense and MoE layers, TP, SP, ring and
// Ulysses CP, EP, pipelines, ZeRO and FSDP), in every precision it has.
TEST(Conformance, TheBoundsReplayedBlocksGiveTheFullRunsSums) {
  int checked = 0, moe = 0;
  for (const fs::path& file : parity_scenarios()) {
    const Scenario s = load_scenario(file.string());
    for (const ParallelSpec& p : s.configs) {
      if (!unsupported(s, p).empty()) continue;
      const int dp = p.mesh.dp;
      const Skeleton k(skeleton_spec(s, p, dp, s.train.global_batch));
      const int world = dp * p.mesh.tp * p.mesh.pp * p.mesh.cp;
      const sim::Topology t = sim_options(s, world).topology;
      for (const int rep : representatives(p, dp).reps) {
        std::vector<sim::ClockStep> steps[2];
        for (const bool replay : {false, true}) {
          sim::SymmetricClock c(world, t, k.splits(), rep);
          c.list_groups(Skeleton::block_groups());
          c.bound_only();
          if (replay)
            k.run_replaying(c);
          else
            k.run(c);
          steps[replay] = c.steps();
        }
        ASSERT_EQ(steps[0].size(), steps[1].size());
        for (std::size_t i = 0; i < steps[0].size(); ++i) {
          const sim::ClockStep &a = steps[0][i], &b = steps[1][i];
          const std::string where = file.filename().string() + " " + p.label() + " rank " +
                                    std::to_string(rep) + " step " + std::to_string(i);
          EXPECT_NEAR(b.forced_busy, a.forced_busy, 1e-12 * a.forced_busy) << where;
          EXPECT_NEAR(b.forced_listed, a.forced_listed, 1e-12 * a.forced_listed) << where;
          EXPECT_NEAR(b.compute_busy, a.compute_busy, 1e-12 * a.compute_busy) << where;
        }
      }
      ++checked;
      moe += s.model.moe.has_value();
    }
  }
  EXPECT_GT(checked, 150);
  EXPECT_GT(moe, 20);
}

// Skeletons with equal split keys state the same split rules (the stage bounds share the splits'
// layouts by that key): over the parity matrix's configurations, every pair with the same key
// (and world) gives every rank the same colours and keys in every split, and some keys are met
// by configurations of other settings (ZeRO, FSDP, schedules, precisions).
TEST(Conformance, EqualSplitKeysStateTheSameSplits) {
  std::map<std::string, std::vector<std::vector<std::pair<int, int>>>> seen;
  int shared = 0;
  for (const fs::path& file : parity_scenarios()) {
    const Scenario s = load_scenario(file.string());
    for (const ParallelSpec& p : s.configs) {
      if (!unsupported(s, p).empty()) continue;
      const Skeleton k(skeleton_spec(s, p, p.mesh.dp, s.train.global_batch));
      const int world = p.mesh.dp * p.mesh.tp * p.mesh.pp * p.mesh.cp;
      std::vector<std::vector<std::pair<int, int>>> rules;
      for (const sim::SplitRule& rule : k.splits()) {
        std::vector<std::pair<int, int>> of;
        for (int r = 0; r < world; ++r) of.emplace_back(rule.color(r), rule.key(r));
        rules.push_back(std::move(of));
      }
      const auto [it, fresh] = seen.emplace(k.split_key(), rules);
      if (!fresh) {
        ++shared;
        EXPECT_EQ(it->second, rules) << file.filename().string() << " " << p.label();
      }
    }
  }
  EXPECT_GT(shared, 50);
}

// One configuration beside the parity matrix's: the scenario's base with this mesh, Ulysses CP,
// and these settings.
struct Variant {
  comm::MeshShape mesh;
  bool sp = false;
  int zero = 0;
  int shard_group = 0;  // > 0: FSDP hybrid_shard with shard groups of this many DP ranks
};

// Each variant the model takes (EP only for MoE) in each precision conforms; returns how many ran.
int check_variants(const Scenario& base, const std::vector<ref::Precision>& precisions,
                   const std::vector<Variant>& variants) {
  int checked = 0;
  for (const ref::Precision precision : precisions) {
    Scenario s = base;
    s.train.precision = precision;
    for (const Variant& v : variants) {
      if (v.mesh.ep > 1 && !s.model.moe) continue;
      ParallelSpec p = s.parallel;
      p.mesh = v.mesh;
      p.sequence_parallel = v.sp;
      p.cp_algo = parallel::CpAlgo::ulysses;
      const std::size_t bucket = p.bucket_elems();
      if (v.shard_group > 0)
        p.data = parallel::Fsdp{.sharding = parallel::ShardingStrategy::hybrid_shard,
                                .shard_group_size = v.shard_group};
      else if (v.zero > 0)
        p.data = parallel::Zero{.stage = v.zero, .bucket_elems = bucket};
      else
        p.data = parallel::Ddp{.bucket_elems = bucket};
      if (const std::string why = unsupported(s, p); !why.empty()) {
        ADD_FAILURE() << p.label() << ": " << why;
        continue;
      }
      EXPECT_EQ(conformance(s, p), "") << p.label();
      ++checked;
    }
  }
  return checked;
}

comm::MeshShape sizes(int dp, int tp, int pp, int cp, int ep) {
  return {.dp = dp, .tp = tp, .pp = pp, .cp = cp, .ep = ep};
}

// MoE layers on one EP rank under TP with and without SP, and under Ulysses CP (the parity
// matrix has no such entry without EP): the router on each rank's own rows, the probabilities
// gathered over TP and CP, and in bf16 the experts' TP partials summed before the rounding; f64
// and the bf16 recipe, DDP, ZeRO-1 and ZeRO-3.
TEST(Conformance, MoeLayersUnderTensorAndContextParallelism) {
  const Scenario s = load_scenario(shardcheck::testing::kScenarios + "/parity/mp_compose_moe.json");
  EXPECT_EQ(check_variants(s, {ref::Precision::kF64, ref::Precision::kBf16},
                           {{sizes(4, 2, 1, 1, 1), true, 0, 0},
                            {sizes(4, 2, 1, 1, 1), false, 1, 0},
                            {sizes(4, 2, 1, 1, 1), true, 3, 0},
                            {sizes(4, 1, 1, 2, 1), false, 0, 0},
                            {sizes(2, 2, 1, 2, 1), true, 1, 0}}),
            10);
}

// kv heads replicated over TP (tp 4 over 2 kv heads, from the TP parity scenario): their
// gradients left out of the DDP buckets and summed over the tp-kv group after the pipeline (bf16:
// per microbatch before the rounding too), per unit before ZeRO-3's reduce_scatter; with SP.
TEST(Conformance, KvHeadsReplicatedOverTensorParallelRanks) {
  Scenario s = load_scenario(shardcheck::testing::kScenarios + "/parity/mp_tp.json");
  s.model.kv_heads = 2;
  EXPECT_EQ(check_variants(s, {ref::Precision::kF64, ref::Precision::kBf16},
                           {{sizes(2, 4, 1, 1, 1), false, 0, 0},
                            {sizes(2, 4, 1, 1, 1), true, 1, 0},
                            {sizes(2, 4, 1, 1, 1), false, 3, 0},
                            {sizes(2, 4, 1, 1, 1), true, 3, 0},
                            {sizes(1, 4, 2, 1, 1), false, 0, 0}}),
            10);
}

// FSDP hybrid_shard with model parallelism: shard groups of shard_group_size x cp over {cp, dp}
// and, for MoE, the experts' over the expert-data-parallel ranks (mesh_rows.hpp), with TP, a
// pipeline, Ulysses CP and EP; dense f64, MoE f64 and bf16.
TEST(Conformance, HybridShardWithModelParallelism) {
  const std::vector<Variant> meshes = {
      {sizes(4, 2, 1, 1, 1), false, 0, 2}, {sizes(2, 2, 2, 1, 1), false, 0, 1},
      {sizes(4, 1, 1, 2, 1), false, 0, 2}, {sizes(4, 1, 1, 2, 2), false, 0, 2},
      {sizes(4, 1, 2, 1, 2), false, 0, 2}, {sizes(4, 1, 1, 1, 2), false, 0, 2}};
  const std::string dir = shardcheck::testing::kScenarios + "/parity/";
  EXPECT_EQ(check_variants(load_scenario(dir + "mp_tp.json"), {ref::Precision::kF64}, meshes), 3);
  EXPECT_EQ(check_variants(load_scenario(dir + "mp_compose_moe.json"),
                           {ref::Precision::kF64, ref::Precision::kBf16}, meshes),
            12);
}

// The check can fail: an engine whose gradient reductions average instead of sum, whose norm
// all_reduce leaves the squared norm out (the local-norm clipping bug), or whose row-parallel
// layers are not reduced over TP issues a different op log from the planner's.
TEST(Conformance, APlantedReductionBugIsADifference) {
  const Scenario s = load_scenario(shardcheck::testing::kScenarios + "/parity/fsdp_dense.json");
  int checked = 0;
  for (const ParallelSpec& p : s.configs) {
    if (model_parallel(p) || !unsupported(s, p).empty() || p.mesh.dp == 1) continue;
    ++checked;
    ASSERT_EQ(conformance(s, p), "") << p.label();
    const std::string d = conformance(s, p, parallel::testing::Mutation::kGradAveragedNotSummed);
    EXPECT_NE(d.find(" avg "), std::string::npos) << p.label() << ": " << d;
  }
  EXPECT_GT(checked, 0);
  const Scenario o = load_scenario(shardcheck::testing::kScenarios + "/parity/ddp_overlap.json");
  const std::string d =
      conformance(o, o.configs.front(), parallel::testing::Mutation::kLocalNormClip);
  EXPECT_NE(d.find("f64 x 3"), std::string::npos) << d;
  // Tensor parallelism: the row-parallel output left unreduced is an all_reduce missing.
  const Scenario t = load_scenario(shardcheck::testing::kScenarios + "/parity/mp_tp.json");
  int tp_checked = 0;
  for (const ParallelSpec& p : t.configs) {
    if (p.mesh.tp == 1 || !unsupported(t, p).empty()) continue;
    ++tp_checked;
    EXPECT_NE(conformance(t, p, parallel::testing::Mutation::kRowParallelNotReduced), "")
        << p.label();
  }
  EXPECT_GT(tp_checked, 0);
  // Expert parallelism: expert gradients summed over the dense group instead of the experts'
  // data-parallel ranks; the MoE dispatch's splits are left to the data, its group is not.
  const Scenario e = load_scenario(shardcheck::testing::kScenarios + "/parity/mp_ep.json");
  int ep_checked = 0;
  for (const ParallelSpec& p : e.configs) {
    // (Under hybrid shard the experts' groups are the hybrid split of edp, which the planted
    // bug leaves alone.)
    if (p.mesh.ep == 1 || !unsupported(e, p).empty() || p.hybrid()) continue;
    ++ep_checked;
    EXPECT_NE(conformance(e, p, parallel::testing::Mutation::kExpertSumOverDenseGroup), "")
        << p.label();
  }
  EXPECT_GT(ep_checked, 4);
  // Ring attention: a rank's own block computed without the causal mask (the planted diagonal)
  // is more FLOPs than the skeleton's blocks.
  const Scenario c = load_scenario(shardcheck::testing::kScenarios + "/parity/mp_cp.json");
  int ring_checked = 0;
  for (const ParallelSpec& p : c.configs) {
    if (p.mesh.cp == 1 || p.cp_algo != parallel::CpAlgo::ring || !unsupported(c, p).empty())
      continue;
    ++ring_checked;
    const std::string diff = conformance(c, p, parallel::testing::Mutation::kRingDiagonalUnmasked);
    EXPECT_NE(diff.find("cp ring attention"), std::string::npos) << p.label() << ": " << diff;
  }
  EXPECT_GT(ring_checked, 2);
}

}  // namespace
}  // namespace shardcheck::harness

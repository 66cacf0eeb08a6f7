// The planner: the symmetric clock against the real SimWorld meta run of the same skeleton (every
// strategy, ranks across nodes), a closed form (DDP, one bucket), scaling efficiency, a candidate
// that cannot fit, and `shardcheck plan` exit codes and --json / --report fields read as JSON.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "cli_support.hpp"
#include "comm/op_log.hpp"
#include "harness/conformance.hpp"
#include "harness/driver.hpp"
#include "harness/plan.hpp"
#include "harness/plan_skeleton.hpp"
#include "harness/runner.hpp"
#include "harness/scenario.hpp"
#include "parallel/costs.hpp"
#include "parallel/flops.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/mesh_ledger.hpp"
#include "reference/model.hpp"

namespace shardcheck::harness {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSmall = std::string(SHARDCHECK_SCENARIOS_DIR) + "/plan/small-dp.json";

json small_json() {
  std::ifstream f(kSmall);
  return json::parse(f);
}

struct Result {
  int code = -1;
  std::string out;
};

// A directory of this process's own: ctest may run the same test from several build trees at once.
fs::path temp_dir(const std::string& name) {
  return fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
}

// `shardcheck ARGS` (cli_support.hpp) as {code, output}.
Result run_cli(const std::string& args) {
  auto [code, out] = shardcheck::testing::shardcheck(args);
  return {code, std::move(out)};
}

// One configuration as a parallel object over the small scenario, at `ranks` ranks.
Scenario with(json base, const json& parallel, int ranks) {
  json p = parallel;
  p["dp"] = ranks;
  base["parallel"] = p;
  base.erase("matrix");
  base["train"]["global_batch"] = 4 * ranks;  // two microbatches of 2 per rank
  return parse_scenario(base);
}

TEST(Plan, SymmetricClockEqualsSimWorldMeta) {
  const json configs[] = {
      {{"zero", 0}, {"bucket_elems", 100000}},
      {{"zero", 1}},
      {{"zero", 2}},
      {{"zero", 3}},
      {{"fsdp", "full_shard"}},
      {{"fsdp", {{"sharding", "full_shard"}, {"prefetch", 2}, {"reshard_after_forward", false}}}},
      {{"fsdp", "shard_grad_op"}},
      {{"fsdp", "no_shard"}},
      {{"fsdp", {{"sharding", "hybrid_shard"}, {"shard_group_size", 4}}}},
  };
  for (int ranks : {8, 16, 64}) {
    for (const json& c : configs) {
      // 64 ranks cost ~1 ms of wall time per collective: the strategies with distinct patterns.
      if (ranks == 64 && c.contains("zero") && c["zero"] != 0 && c["zero"] != 3) continue;
      const Scenario s = with(small_json(), c, ranks);
      const ParallelSpec& p = s.configs.front();
      const StepEval clock = evaluate(s, p, ranks, s.train.global_batch, {});
      const StepEval world = evaluate(s, p, ranks, s.train.global_batch, {}, true);
      EXPECT_GT(clock.step_time_s, 0);
      EXPECT_LE(std::fabs(clock.step_time_s - world.step_time_s), 1e-9 * world.step_time_s)
          << p.label() << " at " << ranks << " ranks: clock " << clock.step_time_s
          << " s, SimWorld " << world.step_time_s << " s";
      EXPECT_FALSE(clock.asymmetric) << p.label();
    }
  }
}

// DDP, one bucket (so nothing overlaps: the bucket is complete only after the last backward), one
// microbatch, f32: step = all_reduce(3 i64 denominators) + compute + all_reduce(N f32) +
// all_reduce(4 f64: squared norm and numerators) + all_gather(1 i32 per rank) + AdamW, with the
// ring formulas written out and each compute report timed as max(FLOPs / peak, bytes / HBM).
// The same with plan.attention_kernel "flash": each block's attention is costed as
// costs.hpp's flash kernel (no probabilities through HBM).
TEST(Plan, DdpOneBucketIsTheClosedForm) {
  for (const bool flash : {false, true}) {
    namespace costs = parallel::costs;
    json j = small_json();
    j["train"]["precision"] = "f32";
    j["plan"]["attention_kernel"] = flash ? "flash" : "engine";
    Scenario s = with(j, {{"zero", 0}, {"bucket_elems", 1 << 30}}, 16);
    s.train.global_batch = 32;  // one microbatch of 2 per rank
    const ParallelSpec& p = s.configs.front();
    const StepEval e = evaluate(s, p, 16, 32, {});

    const double n = 16, a = 10e-6, b = 1.0 / 50e9, peak = 989e12, hbm = 4800e9;
    const auto ring_all_reduce = [&](double bytes) {
      return 2 * (n - 1) * a + 2 * (n - 1) / n * bytes * b;
    };
    const auto all_gather = [&](double bytes) { return (n - 1) * a + (n - 1) / n * bytes * b; };
    const auto t = [&](const comm::ComputeCost& c) {
      return std::max(c.flops / peak, c.bytes / hbm);
    };
    double params = 0;
    for (const auto& [name, shape] : ref::param_shapes(s.model)) {
      double x = 1;
      for (auto d : shape) x *= static_cast<double>(d);
      params += x;
    }
    const ref::ModelConfig& m = s.model;
    const double sq = m.seq_len, h = m.hidden, q = m.heads * m.head_dim(),
                 kv = m.kv_heads * m.head_dim();
    const costs::UlyssesShape u{m.seq_len, m.heads, m.kv_heads, m.head_dim()};
    const double attention =
        flash ? t(costs::flash_forward(u, 4)) + t(costs::flash_backward(u, 4))
              : t(costs::ulysses_forward(u, 4)) + t(costs::ulysses_backward(u, true, 4));
    const double block = t(costs::qkv(sq, h, q, kv)) + attention + t(costs::wo(sq, q, h)) +
                         t(costs::mlp(sq, h, m.ffn, m.gated_mlp())) +
                         t(costs::mlp_backward(sq, h, m.ffn, m.gated_mlp())) +
                         t(costs::projections_backward(sq, h, q, kv));
    const double sequence = m.layers * block + t(costs::vocab_head_forward(sq, h, m.vocab, 4)) +
                            t(costs::vocab_head_backward(sq, h, m.vocab, 4));
    const double compute = 2 * sequence;
    const double adam = t(costs::adamw(params, parallel::recipe_of(ref::Precision::kF32)));
    const double want = ring_all_reduce(24) + compute + ring_all_reduce(4 * params) +
                        ring_all_reduce(32) + all_gather(4 * n) + adam;
    EXPECT_NEAR(e.step_time_s, want, 1e-12 * want) << flash;
    EXPECT_NEAR(e.exposed_comm_s, want - compute - adam, 1e-9 * want) << flash;
  }
}

TEST(Plan, StrongScalingEfficiencyFallsAcrossNodes) {
  json j = small_json();
  j["matrix"] = json::array({{{"zero", 0}}, {{"fsdp", "full_shard"}}});
  j["plan"]["world_sizes"] = {4, 8, 16, 32};
  const PlanResult r = plan_scenario(parse_scenario(j));
  ASSERT_EQ(r.configs.size(), 2u);
  for (const ConfigPlan& c : r.configs) {
    ASSERT_EQ(c.strong.size(), 4u);
    EXPECT_DOUBLE_EQ(c.strong[0].efficiency, 1.0) << c.config;
    for (std::size_t i = 1; i < c.strong.size(); ++i) {
      ASSERT_TRUE(c.strong[i].valid) << c.config << " " << c.strong[i].why_not;
      EXPECT_LE(c.strong[i].efficiency, 1.0) << c.config;
      EXPECT_LT(c.strong[i].efficiency, c.strong[i - 1].efficiency)
          << c.config << " at " << c.strong[i].world_size;
    }
    for (const ScalePoint& w : c.weak) EXPECT_LE(w.efficiency, 1.0 + 1e-12) << c.config;
  }
}

// Device memory between ZeRO-3's and DDP's per-rank totals: DDP does not fit, ZeRO-3 does and is
// the recommendation, and the reason says so.
TEST(Plan, ACandidateThatCannotFitIsReportedSo) {
  json j = small_json();
  j["matrix"] = json::array({{{"zero", 0}}, {{"zero", 3}}});
  Scenario s = parse_scenario(j);
  const auto total = [&](const ParallelSpec& p) {  // the engine's ledger, its fullest rank
    return static_cast<double>(
        parallel::mesh_ledger_fullest(s.model, s.train, engine_options(s, p)).row.total());
  };
  const double ddp = total(s.configs[0]), z3 = total(s.configs[1]);
  ASSERT_LT(z3, ddp);
  s.topology.memory_gib = (ddp + z3) / 2 / (1024.0 * 1024.0 * 1024.0);
  const PlanResult r = plan_scenario(s);
  ASSERT_EQ(r.configs.size(), 2u);
  EXPECT_FALSE(r.configs[0].fits);
  EXPECT_TRUE(r.configs[1].fits);
  EXPECT_EQ(r.best, 1);
  EXPECT_NE(r.configs[0].note.find("does not fit"), std::string::npos) << r.configs[0].note;
  EXPECT_NE(r.configs[1].note.find("fastest that fits"), std::string::npos) << r.configs[1].note;
}

// Placement follows the order string against ranks_per_node: with TP innermost ("tp-..."),
// each TP group of 4 sits in one node of 4 and every DP group spans both nodes; with DP
// innermost, the other way round. A model-parallel mesh's memory is its fullest rank's in the
// mesh engine's ledger: the most any rank holds (each rank's row computed, not only the ranks at
// data-parallel position 0 the planner reads).
TEST(Plan, PlacementNamesTheLinkEachGroupCrossesAndMeshMemoryIsTheFullestRank) {
  json j = small_json();
  j["topology"]["ranks_per_node"] = 4;
  j["matrix"] = json::array({{{"dp", 2}, {"tp", 4}, {"pp", 1}},
                             {{"dp", 2}, {"tp", 4}, {"order", "dp-tp-cp-ep-pp"}},
                             {{"dp", 2}, {"pp", 2}, {"tp", 2}, {"zero", 1}}});
  const Scenario s = parse_scenario(j);
  const PlanResult r = plan_scenario(s);
  ASSERT_EQ(r.configs.size(), 3u);
  const auto axis = [](const ConfigPlan& c, comm::Axis a) {
    for (const AxisPlacement& x : c.placement)
      if (x.axis == a) return x;
    ADD_FAILURE() << c.config << " has no " << comm::name_of(a) << " placement";
    return AxisPlacement{};
  };
  const AxisPlacement tp0 = axis(r.configs[0], comm::Axis::tp),
                      dp0 = axis(r.configs[0], comm::Axis::dp);
  EXPECT_EQ(tp0.groups, 2);
  EXPECT_EQ(tp0.crossing, 0);
  EXPECT_EQ(tp0.bandwidth_gbps, s.topology.intra_node.bandwidth_gbps);
  EXPECT_EQ(dp0.groups, 4);
  EXPECT_EQ(dp0.crossing, 4);
  EXPECT_EQ(dp0.bandwidth_gbps, s.topology.inter_node.bandwidth_gbps);
  const AxisPlacement tp1 = axis(r.configs[1], comm::Axis::tp),
                      dp1 = axis(r.configs[1], comm::Axis::dp);
  EXPECT_EQ(tp1.crossing, 2);
  EXPECT_EQ(tp1.nodes_spanned, 2);
  EXPECT_EQ(dp1.crossing, 0);
  ASSERT_EQ(r.configs[2].stages.size(), 2u);  // pp 2: one fullest rank per stage
  EXPECT_EQ(std::max(r.configs[2].stages[0].row.total(), r.configs[2].stages[1].row.total()),
            r.configs[2].memory_per_rank_bytes);
  EXPECT_NE(r.configs[2].stages[0].row.total(), r.configs[2].stages[1].row.total());
  for (const ConfigPlan& c : r.configs) {
    EXPECT_TRUE(c.modelled) << c.config;  // TP and PP are timed
    std::size_t most = 0;
    for (const parallel::LedgerRow& row :
         parallel::mesh_ledger_ranks(s.model, s.train, engine_options(s, c.spec)))
      most = std::max(most, row.total());
    EXPECT_EQ(c.memory_per_rank_bytes, most) << c.config;
  }
}

// The planner against the engine it stands for: the same scenario trained by the mesh engine on
// the simulator (`run`: numerics, its virtual clock) and planned (the skeleton on the symmetric
// clock). The skeleton issues what the engine issues (the conformance test), so for every
// data-parallel strategy, in every precision, inside a node and across nodes, the step times agree
// to rounding.
TEST(Plan, StepTimeIsTheEngines) {
  std::ifstream f(shardcheck::testing::kScenarios + "/parity/data_parallel_f32.json");
  json base = json::parse(f);
  base["model"].erase("dropout");
  base["train"]["steps"] = 2;
  base["train"]["global_batch"] = 48;
  base["plan"] = {{"world_sizes", json::array({4})}};
  for (const char* precision : {"f32", "bf16", "f64"})
    for (const int per_node : {2, 8}) {
      json j = base;
      j["train"]["precision"] = precision;
      j["topology"] = {{"ranks_per_node", per_node}};
      j["matrix"] = json::array(
          {{{"dp", 4}},
           {{"dp", 8}, {"bucket_elems", 200}},
           {{"dp", 4}, {"zero", 1}},
           {{"dp", 4}, {"zero", 2}},
           {{"dp", 4}, {"zero", 3}},
           {{"dp", 4}, {"fsdp", "full_shard"}},
           {{"dp", 4}, {"fsdp", "shard_grad_op"}},
           {{"dp", 4}, {"fsdp", "no_shard"}},
           {{"dp", 8}, {"fsdp", {{"sharding", "hybrid_shard"}, {"shard_group_size", 2}}}}});
      const Scenario s = parse_scenario(j);
      const RunResult run = run_scenario(s);
      const PlanResult plan = plan_scenario(s);
      ASSERT_EQ(run.configs.size(), plan.configs.size());
      for (std::size_t i = 0; i < run.configs.size(); ++i) {
        const double engine = run.configs[i].timing.step_time_s,
                     planned = plan.configs[i].eval.step_time_s;
        ASSERT_TRUE(run.configs[i].timing.valid) << plan.configs[i].config;
        EXPECT_NEAR(planned, engine, 1e-9 * engine)
            << precision << " " << plan.configs[i].config << ", " << per_node << " ranks per node";
      }
    }
}

// The tensor-, pipeline- and (Ulysses) context-parallel scenarios of the parity matrix, with
// `device` merged into each one's topology.device.
const char* const kModelParallelScenarios[] = {"mp_tp.json", "mp_pp.json", "mp_cp.json"};
json model_parallel_scenario(const std::string& name, const json& device) {
  std::ifstream f(shardcheck::testing::kScenarios + "/parity/" + name);
  json j = json::parse(f);
  j["plan"] = {{"world_sizes", json::array()}};
  for (const auto& [key, value] : device.items()) j["topology"]["device"][key] = value;
  return j;
}

// On each of those scenarios, the plan's step time is the engine's own run's on the simulator, to
// rounding, for every configuration both time; check(name, plan, i) sees each such one. Returns
// how many were compared.
template <class Check>
int plan_is_the_engines_run(const json& device, const Check& check) {
  int compared = 0;
  for (const char* name : kModelParallelScenarios) {
    const Scenario s = parse_scenario(model_parallel_scenario(name, device));
    const RunResult run = run_scenario(s);
    const PlanResult plan = plan_scenario(s);
    EXPECT_EQ(run.configs.size(), plan.configs.size());
    for (std::size_t i = 0; i < std::min(run.configs.size(), plan.configs.size()); ++i) {
      if (!plan.configs[i].modelled || !run.configs[i].timing.valid) continue;
      ++compared;
      const double engine = run.configs[i].timing.step_time_s,
                   planned = plan.configs[i].eval.step_time_s;
      EXPECT_NEAR(planned, engine, 1e-9 * engine) << name << " " << plan.configs[i].config;
      check(name, plan, i);
    }
  }
  return compared;
}

// The same on the tensor-, pipeline- and (Ulysses) context-parallel meshes of the parity matrix:
// the symmetric clock (TP, CP) and the stage representatives (PP: GPipe, 1F1B, interleaved) give
// the step time the engine's own run on the simulator gives, to rounding.
TEST(Plan, StepTimeIsTheEnginesOnModelParallelMeshes) {
  EXPECT_GT(
      plan_is_the_engines_run(json::object(), [](const char*, const PlanResult&, std::size_t) {}),
      9);
}

// GEMM efficiency by shape (topology.device.sm_count): the engine's run on the simulator and the
// plan time the same GEMMs in whole tiles and waves, on TP, PP and CP meshes; every configuration
// is slower than without the model (this model's shapes fill few 16 x 32 tiles of 3 SMs).
TEST(Plan, GemmTilesAndWavesAreTimedAsTheEngineRunsThem) {
  std::map<std::string, PlanResult> without;
  for (const char* name : kModelParallelScenarios)
    without[name] = plan_scenario(parse_scenario(model_parallel_scenario(name, json::object())));
  const json device = {{"sm_count", 3}, {"gemm_tile_m", 16}, {"gemm_tile_n", 32}};
  const int compared =
      plan_is_the_engines_run(device, [&](const char* name, const PlanResult& plan, std::size_t i) {
        EXPECT_EQ(plan.gemm_model, "whole 16 x 32 tiles in waves of 3 SMs");
        EXPECT_GT(plan.configs[i].eval.compute_s, without[name].configs[i].eval.compute_s * 1.01)
            << name << " " << plan.configs[i].config;
      });
  EXPECT_GT(compared, 9);
}

// Expert-parallel meshes (bf16: the expert-parts sums too; with TP, SP, PP, Ulysses CP, ZeRO-1
// and ZeRO-3): the symmetric clock or the stage representatives give the step time that every
// rank on SimWorld in meta mode gives, running the same skeleton (its routing assumption:
// ceil(rows x top_k / ep) rows to each EP rank).
TEST(Plan, ExpertParallelMeshesAreTimedAsOnEveryRank) {
  int compared = 0;
  for (const char* name : {"mp_ep_bf16.json", "mp_compose_moe.json"}) {
    const Scenario s = load_scenario(shardcheck::testing::kScenarios + "/parity/" + name);
    for (const ParallelSpec& p : s.configs) {
      if (p.mesh.ep == 1) continue;
      const StepEval clock = evaluate(s, p, p.mesh.dp, s.train.global_batch, {});
      const StepEval world = evaluate(s, p, p.mesh.dp, s.train.global_batch, {}, true);
      EXPECT_GT(clock.step_time_s, 0) << p.label();
      EXPECT_NEAR(clock.step_time_s, world.step_time_s, 1e-9 * world.step_time_s) << p.label();
      EXPECT_GT(clock.comm_s, 0) << p.label();
      ++compared;
    }
  }
  EXPECT_GE(compared, 10);
}

// A mesh the scenario accepts but the engine does not build yet (FSDP no_shard with TP) is
// reported so, with no memory or placement, and the other candidates are still planned.
TEST(Plan, AMeshTheEngineDoesNotBuildIsReportedNotBuilt) {
  json j = small_json();
  j["matrix"] = json::array({{{"dp", 4}, {"tp", 2}, {"fsdp", "no_shard"}}, {{"zero", 1}}});
  const Scenario s = parse_scenario(j);
  const PlanResult r = plan_scenario(s);
  ASSERT_EQ(r.configs.size(), 2u);
  EXPECT_FALSE(r.configs[0].not_built.empty());
  EXPECT_NE(r.configs[0].note.find("not built by the engine yet"), std::string::npos)
      << r.configs[0].note;
  EXPECT_TRUE(r.configs[0].placement.empty());
  EXPECT_TRUE(r.configs[1].modelled);
  const json out = plan_json(r);
  EXPECT_TRUE(out.at("candidates").at(0).at("memory_per_rank_bytes").is_null());
}

TEST(Plan, GoodputFollowsTheStatedFormula) {
  const Scenario s = parse_scenario(small_json());
  const PlanResult r = plan_scenario(s);
  const ConfigPlan& c = r.configs.front();
  const PlanSpec& f = s.plan;
  const double lambda = 8 / (f.mtbf_gpu_hours * 3600),
               tau = f.checkpoint_every_steps * c.eval.step_time_s, d = f.checkpoint_save_s,
               R = f.restart_s;
  const double want = tau / (tau + d) * (1 - lambda * ((tau + d) / 2 + R));
  EXPECT_NEAR(c.goodput.fraction, want, 1e-12);
  EXPECT_NEAR(c.goodput.effective_tokens_per_s, c.tokens_per_s * want, 1e-6 * c.tokens_per_s);
}

// Selective recompute recomputes the engine kernel's attention core (hardware FLOPs above those
// without recompute), not a flash kernel's, which keeps no probabilities to drop (the same
// FLOPs). Hardware FLOPs count the causal pairs the kernels compute, below the model FLOPs' s x s.
TEST(Plan, SelectiveRecomputeAddsNoAttentionCoreToAFlashKernel) {
  for (const bool flash : {false, true}) {
    double flops[2] = {};
    for (const bool selective : {false, true}) {
      json j = small_json();
      j["plan"]["attention_kernel"] = flash ? "flash" : "engine";
      j["train"]["activation_checkpointing"] = selective ? "selective" : "none";
      const Scenario s = with(j, {{"zero", 0}}, 8);
      const Skeleton k(skeleton_spec(s, s.configs.front(), 8, s.train.global_batch));
      flops[selective] = k.hardware_flops_per_step();
      // Without recompute, what the kernels execute: the causal half of the convention's core.
      if (!selective) {
        EXPECT_LT(flops[0], k.model_flops_per_step());
      }
    }
    if (flash)
      EXPECT_DOUBLE_EQ(flops[1], flops[0]);
    else
      EXPECT_GT(flops[1], flops[0]);
  }
}

// Ring attention computes whole blocks of its layout's chunk pairs: on each CP rank its own block
// three chunk pairs of four, every other block two, so over the ring p (2p + 1) chunk x chunk
// pairs per head and channel, above the causal kernel's s (s + 1) / 2; 14 FLOPs per pair and
// channel (forward 4, backward 10), 18 with full recompute.
TEST(Plan, TheRingsHardwareFlopsAreItsWholeBlocks) {
  for (const int cp : {2, 4})
    for (const std::string rc : {"none", "full"}) {
      json j = small_json();
      j["train"]["activation_checkpointing"] = rc;
      const Scenario s = with(j, {{"cp", cp}, {"cp_algo", "ring"}}, 2);
      const Skeleton k(skeleton_spec(s, s.configs.front(), 2, s.train.global_batch));
      const ref::ModelConfig& m = s.model;
      const double chunk = static_cast<double>(m.seq_len) / (2 * cp);
      const double per = rc == "full" ? 18 : 14;
      const double want = per * cp * (2 * cp + 1) * chunk * chunk * m.heads * m.head_dim();
      EXPECT_DOUBLE_EQ(k.executed_attention_core(), want) << cp << " " << rc;
      EXPECT_GT(k.executed_attention_core(),
                parallel::costs::causal_attention_flops(m.seq_len, m.heads, m.head_dim(), per));
    }
}

// plan.bf16_rounding "local" (a what-if): no per-microbatch sums before the bf16 rounding, so a
// CP mesh in the bf16 recipe issues no all_reduce over its CP groups (the engine's "sum_first"
// issues one per microbatch and parameter class) and its step is shorter; the f32 recipe rounds
// nothing, so the key changes nothing there. The conformance check ignores the what-if.
TEST(Plan, LocalBf16RoundingDropsTheMicrobatchSums) {
  const auto cp_all_reduces = [](const Scenario& s) {
    int n = 0;
    for (const comm::OpLog& log : planner_op_logs(s, s.configs.front()))
      for (const comm::OpRecord& r : log.records)
        if (r.kind == comm::OpRecord::Kind::all_reduce &&
            log.groups[static_cast<std::size_t>(r.group)].name.starts_with("cp"))
          ++n;
    return n;
  };
  for (const std::string precision : {"bf16", "f32"}) {
    StepEval e[2];
    int sums[2] = {0, 0};
    for (const bool local : {false, true}) {
      json j = small_json();
      j["train"]["precision"] = precision;
      j["plan"]["bf16_rounding"] = local ? "local" : "sum_first";
      Scenario s = with(j, {{"cp", 2}, {"tp", 2}, {"sequence_parallel", true}, {"zero", 1}}, 2);
      const ParallelSpec& p = s.configs.front();
      e[local] = evaluate(s, p, 2, s.train.global_batch, {});
      sums[local] = cp_all_reduces(s);
    }
    if (precision == "bf16") {
      EXPECT_GT(sums[0], 0);
      EXPECT_EQ(sums[1], 0);
      EXPECT_LT(e[1].step_time_s, e[0].step_time_s);
      EXPECT_LT(e[1].comm_ops, e[0].comm_ops);
    } else {
      EXPECT_EQ(sums[0], sums[1]);
      EXPECT_EQ(e[1].step_time_s, e[0].step_time_s);
    }
  }
  // The conformance check compares the engine's rounding whatever the what-if (a parity
  // scenario's bf16 ring CP configuration: a small model).
  std::ifstream f(std::string(SHARDCHECK_SCENARIOS_DIR) + "/parity/mp_bf16.json");
  json j = json::parse(f);
  j["plan"]["bf16_rounding"] = "local";
  j["parallel"] = {{"tp", 1}, {"cp", 2}, {"cp_algo", "ring"}};
  j.erase("matrix");
  const Scenario s = parse_scenario(j);
  EXPECT_EQ(conformance(s, s.configs.front()), "");
}

TEST(Plan, BadInputExitsTwo) {
  const fs::path dir = temp_dir("shardcheck_plan_bad");
  fs::create_directories(dir);
  json j = small_json();
  j["plan"]["world_sizes"] = {0};
  std::ofstream(dir / "bad.json") << j.dump();
  j = small_json();
  j["plan"]["attention_kernel"] = "xformers";
  std::ofstream(dir / "kernel.json") << j.dump();
  j = small_json();
  j["plan"]["bf16_rounding"] = "stochastic";
  std::ofstream(dir / "rounding.json") << j.dump();
  j = small_json();
  j["topology"]["device"]["sm_count"] = -1;
  std::ofstream(dir / "sms.json") << j.dump();
  const std::pair<std::string, std::string> cases[] = {
      {"plan " + (dir / "missing.json").string(), "missing.json"},
      {"plan " + (dir / "bad.json").string(), "world_sizes"},
      {"plan " + (dir / "kernel.json").string(), "$.plan.attention_kernel"},
      {"plan " + (dir / "rounding.json").string(), "$.plan.bf16_rounding"},
      {"plan " + (dir / "sms.json").string(), "$.topology.device.sm_count"},
      {"plan " + kSmall + " --compute-efficiency 1.5", "--compute-efficiency"},
      {"plan " + kSmall + " --reduce-dtype i8", "--reduce-dtype"},
      {"plan", "scenario"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
  }
  fs::remove_all(dir);
}

TEST(Plan, JsonAndReportFields) {
  const fs::path dir = temp_dir("shardcheck_plan_report");
  fs::remove_all(dir);
  const Result r =
      run_cli("plan " + kSmall + " --json --simulate-ranks 8 --report " + dir.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const json out = json::parse(r.out);
  const json& plan = out.at("plan");
  ASSERT_EQ(plan.at("candidates").size(), 9u);
  EXPECT_EQ(plan.at("assumptions").at("gemm_model"),
            "every GEMM at the compute efficiency (topology.device.sm_count 0)");
  int modelled = 0;
  for (const json& c : plan["candidates"]) {
    for (const char* k : {"config", "mesh", "step_time_s", "memory_per_rank_bytes", "fits",
                          "tokens_per_s", "mfu", "goodput", "note"})
      EXPECT_TRUE(c.contains(k)) << k << " in " << c.dump();
    EXPECT_TRUE(c.at("placement").is_array()) << c.dump();
    EXPECT_EQ(c.at("memory").at("total"), c.at("memory_per_rank_bytes")) << c.dump();
    EXPECT_TRUE(c.at("modelled").get<bool>()) << c.dump();
    EXPECT_EQ(c.at("memory").at("source"), "mesh engine ledger") << c.dump();
    if (c.at("config") == "dp4-cp2-ring") {
      EXPECT_EQ(c.at("placement").size(), 2u) << c.dump();  // dp 4, cp 2
    }
    ++modelled;
    EXPECT_GT(c.at("step_time_s").get<double>(), 0);
    EXPECT_GT(c.at("mfu").get<double>(), 0);
    EXPECT_LT(c.at("mfu").get<double>(), 1);
    if (c.at("config").get<std::string>().find("-pp") != std::string::npos) {  // the schedule's
      EXPECT_GT(c.at("bubble_fraction").get<double>(), 0) << c.dump();
      EXPECT_LT(c.at("bubble_fraction").get<double>(), 1) << c.dump();
      EXPECT_GT(c.at("bubble_formula").get<double>(), 0) << c.dump();
    } else {
      EXPECT_EQ(c.at("bubble_fraction").get<double>(), 0);
    }
    EXPECT_LE(c.at("exposed_comm_s").get<double>(), c.at("step_time_s").get<double>());
    EXPECT_LE(c.at("simulated_rel_diff").get<double>(), 1e-9);
  }
  EXPECT_EQ(modelled, 9);  // every entry, the ring dp4-cp2 one too
  EXPECT_TRUE(plan.at("best").is_string());
  for (const char* series : {"strong", "weak"})
    for (const json& p : plan.at("scaling").at(series)) {
      EXPECT_TRUE(p.contains("world_size"));
      EXPECT_TRUE(p.contains("step_time_s"));
      EXPECT_TRUE(p.contains("tokens_per_s"));
      EXPECT_TRUE(p.contains("efficiency"));
    }
  EXPECT_TRUE(plan.at("goodput").contains("fraction"));
  std::ifstream f(dir / "report.json");
  const json report = json::parse(f);
  EXPECT_TRUE(report.at("pass").get<bool>());
  EXPECT_EQ(report.at("plan").at("candidates").size(), 9u);
  EXPECT_TRUE(fs::file_size(dir / "index.html") > 1000);
  fs::remove_all(dir);
}

// A plan.world_sizes entry at which a configuration's data-parallel ranks cannot split the global
// batch is refused before any work (exit 2), naming the entry's JSON path, the world size and the
// configuration; it was exit 3 "the run broke" from inside the scaling curve.
TEST(Plan, WorldSizeTheBatchCannotSplitIsRefusedAtLoad) {
  json j = small_json();  // global batch 64, micro batch 2
  j["plan"]["world_sizes"] = {4, 3, 8};
  const Scenario s = parse_scenario(j);
  try {
    plan_scenario(s);
    ADD_FAILURE() << "world size 3 accepted";
  } catch (const ScenarioError& e) {
    EXPECT_EQ(e.path(), "$.plan.world_sizes[1]");
    EXPECT_NE(std::string(e.what()).find("world size 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dp8"), std::string::npos) << e.what();
  }
  const fs::path dir = temp_dir("shardcheck_plan_world_sizes");
  fs::create_directories(dir);
  j["plan"]["world_sizes"] = {8, 64};  // dp 64 x micro batch 2 = 128 > 64
  std::ofstream(dir / "ws.json") << j.dump();
  const Result r = run_cli("plan " + (dir / "ws.json").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("$.plan.world_sizes[1]: world size 64"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("the run broke"), std::string::npos) << r.out;
  // A world size that is not a multiple of a mesh's model-parallel ranks stays a point "not
  // evaluated" (dp4-tp2 at 5 ranks), and the plan runs.
  j["plan"]["world_sizes"] = {4, 8};
  EXPECT_NO_THROW(plan_scenario(parse_scenario(j)));
  fs::remove_all(dir);
}

// Numbers in the table fit their column: a step of 4.29e295 s (--compute-efficiency 1e-300)
// prints in scientific form, not as the first 31 of its 296 digits.
TEST(Plan, TableNumbersFitTheirColumns) {
  const Result r = run_cli("plan " + kSmall + " --compute-efficiency 1e-300");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("e+295 s"), std::string::npos) << r.out;
  int run = 0, longest = 0;
  for (const char ch : r.out) {
    run = std::isdigit(static_cast<unsigned char>(ch)) ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  EXPECT_LT(longest, 16) << r.out;
}

// --simulate-ranks is guarded by a cost model (the collectives the symmetric clock counts x ranks
// x a per-rank cost per op, budget.hpp) before any simulation starts: the 70B scenario's 1,024-rank
// configurations are refused under a small --max-time (and --max-memory), naming the estimate and
// how to shrink it; a small one still runs (JsonAndReportFields).
TEST(Plan, SimulateRanksPastMaxTimeIsRefusedBeforeRunning) {
  const std::string big = std::string(SHARDCHECK_SCENARIOS_DIR) + "/plan/llama-70b-class.json";
  Result r = run_cli("plan " + big + " --simulate-ranks 1048576 --max-time 5");
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* part :
       {"plan --simulate-ranks: needs at least", "--max-time", "lower --simulate-ranks below 1024"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  r = run_cli("plan " + big + " --simulate-ranks 1048576 --max-memory 64MB");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--max-memory"), std::string::npos) << r.out;
  r = run_cli("plan " + kSmall + " --simulate-ranks 8 --max-time nan");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--max-time"), std::string::npos) << r.out;
  r = run_cli("plan " + kSmall + " --compute-efficiency nan");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--compute-efficiency"), std::string::npos) << r.out;
  r = run_cli("plan " + kSmall + " --simulate-ranks 8 --max-time 600");
  EXPECT_EQ(r.code, 0) << r.out;
}

}  // namespace
}  // namespace shardcheck::harness

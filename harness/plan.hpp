// The planner behind `shardcheck plan`: for every configuration of a scenario that the engine
// builds, memory on its fullest rank (the mesh engine's own ledger, parallel/mp/mesh_ledger.hpp)
// and where its groups sit (placement.hpp); the step skeleton (plan_skeleton.hpp) timed on the
// symmetric clock or one clock per representative (sim/clock.hpp), tokens/s, MFU, strong and
// weak scaling over plan.world_sizes, goodput under the scenario's failure model, and a ranking
// of the candidates with a reason. Formulas are in harness/PLANNER.md.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/dtype.hpp"
#include "harness/placement.hpp"
#include "harness/scenario.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/mesh_ledger.hpp"

namespace shardcheck::harness {

// One configuration's --simulate-ranks run, counted before any of them starts (PlanOptions's
// check_simulate): its ranks, the collectives each issues per step on the symmetric clock (the
// busiest stage's), and the steps simulated.
struct SimulateWork {
  std::string config;
  int world = 0;
  std::size_t comm_ops_per_step = 0;
  int steps = 0;
};

struct PlanOptions {
  // Also run the real SimWorld meta simulation for configurations of at most this many ranks
  // (0: never) and report its step time next to the symmetric clock's.
  int simulate_ranks = 0;
  double compute_efficiency = 1.0;          // achieved fraction of peak FLOP/s, in (0, 1]
  std::optional<comm::DType> reduce_dtype;  // what-if gradient reduction dtype (default: recipe)
  int steps = 2;                            // steps simulated (all alike; the mean is reported)
  // Called with every configuration simulate_ranks selects, after the symmetric clock has timed
  // them all and before the first simulation: it throws to refuse the work (the command's time
  // and memory guards).
  std::function<void(const std::vector<SimulateWork>&)> check_simulate;
};

// How the device times GEMMs (topology.device.sm_count, gemm_tile_m / _n): "whole 128 x 256 tiles
// in waves of 108 SMs", or "every GEMM at the compute efficiency (topology.device.sm_count 0)".
std::string gemm_model_text(const TopologySpec& t);

// The ranks whose programs differ, one representative each: one per pipeline stage; every other
// rank issues what the representative of its stage issues (tp, dp, cp and ep ranks alike: ring
// attention's blocks are alike on every CP rank at each step, costs::ring_run_pairs). class_of
// maps a world rank to its stage, reps[stage] is its representative: the pp group of rank 0.
struct Representatives {
  std::vector<int> reps;
  std::function<int(int world_rank)> class_of;
};
Representatives representatives(const ParallelSpec& p, int dp);

// One timed evaluation of a configuration at a world size and global batch.
struct StepEval {
  double step_time_s = 0;
  double compute_s = 0;       // compute stream busy time per step
  double comm_s = 0;          // communication busy time per step
  double exposed_comm_s = 0;  // step time not covered by compute: step_time - compute
  // The pipeline's own bubble: the mean over stages of the compute stream's idle share of the
  // step with communication free (the schedule, uneven stages); 0 without a pipeline. What the
  // network adds is in exposed_comm_s.
  double bubble_fraction = 0;
  std::size_t comm_ops = 0;  // collectives per step
  bool asymmetric = false;   // groups differ (the clock charged the slowest): an upper bound
  double wall_s = 0;         // wall time of the evaluation
};

struct ScalePoint {
  int world_size = 0;
  int global_batch = 0;
  bool valid = false;
  std::string why_not;  // when not valid (batch does not divide, shard group does not divide)
  StepEval eval;
  double tokens_per_s = 0;
  double efficiency = 0;  // T_n / (T_0 * n / n_0), T = tokens/s, 0 = the first valid point
  std::size_t memory_per_rank_bytes = 0;
  bool fits = false;
};

struct Goodput {
  bool valid = false;
  std::string note;
  double failure_rate_per_s = 0;  // lambda = world / (mtbf_gpu_hours * 3600)
  double job_mtbf_s = 0;          // 1 / lambda
  double interval_s = 0;          // tau = checkpoint_every_steps * step time
  double fraction = 0;            // tau/(tau+delta) * (1 - lambda*((tau+delta)/2 + R))
  double effective_tokens_per_s = 0;
  double young_interval_steps = 0;  // sqrt(2 delta / lambda) / step time
  double fraction_at_young = 0;
};

struct ConfigPlan {
  std::string config;  // ParallelSpec::label()
  ParallelSpec spec;
  std::string strategy;
  int world_size = 0;
  bool modelled = false;                 // timed (every configuration the engine builds)
  std::string note;                      // the ranking's one-line why (or why not built)
  std::vector<AxisPlacement> placement;  // every configuration the engine builds
  std::string not_built;                 // why the engine does not build this mesh ("" if it does)
  StepEval eval;
  double bubble_fraction = 0;                // StepEval's; 0 without a pipeline
  double bubble_formula = 0;                 // (p-1)/(v*m+p-1) for a pipeline
  parallel::LedgerRow ledger;                // the fullest rank's, every configuration
  int memory_rank = 0;                       // that rank
  std::size_t memory_per_rank_bytes = 0;     // its LedgerRow::total()
  std::vector<parallel::RankLedger> stages;  // pp > 1: each pipeline stage's fullest rank
  bool fits = false;
  double tokens_per_step = 0;  // train.global_batch * model.seq_len
  double tokens_per_s = 0;
  double model_flops_per_step = 0;
  double mfu = 0;  // model FLOPs / (step time * world * peak)
  double hfu = 0;  // the same with recompute counted
  Goodput goodput;
  std::optional<StepEval> simulated;  // SimWorld meta run (--simulate-ranks)
  double simulated_rel_diff = 0;
  std::vector<ScalePoint> strong, weak;
};

struct PlanResult {
  std::string scenario;
  std::string description;
  double device_memory_bytes = 0;
  double compute_efficiency = 1;
  std::string reduce_dtype;                 // dtype of gradient reductions in the skeleton
  std::string attention_kernel = "engine";  // the scenario's plan.attention_kernel
  std::string moe_routing = "uniform";      // the scenario's plan.moe_routing
  std::string bf16_rounding = "sum_first";  // the scenario's plan.bf16_rounding
  std::string gemm_model;                   // gemm_model_text of the scenario's device
  std::vector<ConfigPlan> configs;
  int best = -1;            // fastest configuration that fits, or -1
  int fastest = -1;         // fastest modelled configuration, fitting or not
  int scaling_config = -1;  // whose scaling curves report.json's plan.scaling shows
  double wall_s = 0;
};

// Throws ScenarioError (exit 2) when the scenario's plan section is unusable, before any work: a
// plan.world_sizes entry at which a configuration's data-parallel ranks do not split
// train.global_batch into whole microbatches names $.plan.world_sizes[i], the world size and the
// configuration. (A world size that is not a multiple of a configuration's model-parallel ranks
// is a scaling point "not evaluated", with the reason.)
PlanResult plan_scenario(const Scenario& s, const PlanOptions& o = {});

// Evaluates one configuration at DP size `dp` (world: dp x its TP ranks) with this global batch on
// the symmetric clock (or, with simulate, on a SimWorld in meta mode). Throws ScenarioError when
// the batch does not split.
// bubble: a pipeline's bubble_fraction too (a second stage-world run with free communication).
StepEval evaluate(const Scenario& s, const ParallelSpec& p, int dp, int global_batch,
                  const PlanOptions& o, bool simulate = false, bool bubble = true);

// Lower bounds of evaluate()'s step time for representatives (pipeline stages:
// representatives(); one entry without a pipeline), the means over the steps of its
// sim::ClockStep::forced_busy and forced_listed (the collectives of Skeleton::block_groups()
// only), timed alone on a sim::SymmetricClock (no StageWorld: what the other representatives do
// only delays it further). The step time is at least the largest entry of either. Unless
// every_stage, only the first stage of each distinct program is timed (the same layers' kinds
// per chunk, embedding and head): the largest of a subset is a lower bound as well.
struct StageLowerBound {
  double forced = 0;
  double listed = 0;
};
// The splits' layouts are remembered per thread for the last meshes (Skeleton::split_key, the
// topology's nodes and links): a search bounds many settings of each mesh.
std::vector<StageLowerBound> stage_lower_bounds(const Scenario& s, const ParallelSpec& p, int dp,
                                                int global_batch, const PlanOptions& o,
                                                bool every_stage = false);

// The largest of stage_lower_bounds for p (p.mesh.dp ranks in data parallelism, the scenario's
// micro batch). Each stage's bound grows by the same amount with each microbatch (each issues the
// same compute and collectives, in the same order within its chunks; the step's own ops are the
// constant), so with more than 2 x pp microbatches they are timed at the fewest the schedule
// allows (m1 = pp: a microbatch per stage) and at one more (interleaved: another group of pp),
// and extended along the line through both: a pipeline of m microbatches costs two of at most
// 2 x pp. Under ZeRO-3 / FSDP (sharded parameters) whether a unit's gather or reduce_scatter is
// waited at once depends on where the schedule puts the microbatch, so there the line goes
// through the listed bound (compute and the blocks' own collectives), which it does not change.
double stage_bound(const Scenario& s, const ParallelSpec& p, int global_batch,
                   const PlanOptions& o);

// At most stage_bound(s, p, ...) under every rank order of p's mesh, and the same number for all
// of them: the stage bound with every group on the scenario's best link (the larger bandwidth
// and the smaller latency of its two). The stage bound is a sum of op seconds, each falling with
// the link's latency and time per byte, and a rank order only places groups on links.
double stage_bound_any_order(const Scenario& s, const ParallelSpec& p, int global_batch,
                             const PlanOptions& o);

// Goodput of a run of `world` ranks at this step time under the plan's failure model
// (harness/PLANNER.md).
Goodput goodput_of(const PlanSpec& f, int world, double step_s, double tokens_per_s);

// The `plan` object of report.json (DESIGN.md; html.cpp draws candidates and scaling).
nlohmann::json plan_json(const PlanResult& r);

}  // namespace shardcheck::harness

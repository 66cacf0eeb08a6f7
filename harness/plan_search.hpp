// `shardcheck plan SCENARIO --search`: every mesh of the scenario's model on a world size, ranked.
// It enumerates (dp, tp, pp, cp, ep, ZeRO stage or FSDP sharding, sequence parallelism, pipeline
// schedule and virtual stages, micro batch, recompute, rank order) over the scenario's model,
// global batch, precision and cluster. Each candidate then goes through these steps, in order:
//   1. the engine's own validation (parallel::validate_mesh);
//   2. the mesh engine's memory ledger against the device memory;
//   3. the planner's clock (plan.hpp's evaluate), unless a bound rules it out.
// The bound, the larger of two lower bounds of the step: the hardware FLOPs (what the kernels
// execute: Skeleton::hardware_flops_per_step) at peak over the world, and the busiest stage's
// compute plus the collectives its compute stream waits on at once (TP and SP collectives, the
// FSDP gathers waited at use: plan.hpp's stage_lower_bounds), with what overlaps, the messages
// and the pipeline's fill and drain free. A candidate whose bound is above the K-th best and its
// family's best is not timed. Candidates are ranked by step time. Their reasons compare
// each with the best. The best of each family (DDP, FSDP, TP + DP, FSDP + TP, TP + PP + DP, + CP,
// + EP) says why it lost. Rules and their caveats are in harness/PLANNER.md.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/plan.hpp"
#include "harness/scenario.hpp"
#include "parallel/ledger.hpp"
#include "reference/config.hpp"

namespace shardcheck::harness {

// The work a search has enumerated, before any ledger, bound or clock runs (SearchOptions's
// check_work): the meshes of the world, those the engine builds, and the candidates (each
// setting of a built mesh in each rank order that places its groups differently, in the three
// recompute modes) the ledger, the bound and the clock go through.
struct SearchWork {
  int world = 0;
  std::size_t meshes = 0, meshes_built = 0, candidates = 0;
  int layers = 0;  // the model's: the skeleton each candidate's bound and clock replay
  // false: candidates counts one rank order per mesh (a lower bound, before the orders are
  // placed); true: every order that places the groups differently.
  bool orders_counted = false;
};

struct SearchOptions {
  int world = 0;  // ranks to plan for; 0: the scenario's own (its parallel block's) world size
  int top = 10;   // candidates listed
  PlanOptions plan;
  // Skip the candidates the compute bound rules out (off: time every fitting one; the tests
  // check that the ranking does not change).
  bool prune = true;
  // Micro batches tried: the divisors of the per-rank batch up to this.
  int max_micro_batch = 8;
  // CP sizes tried: up to this (Llama 3 trained its 128K context with 16). A ring's steps grow
  // with cp, and so does the clock's work: cp ring steps per layer and microbatch.
  int max_cp = 16;
  // Called once the meshes and their settings are enumerated, before the work on them: it throws
  // to refuse a search too large (the command's time and memory guards).
  std::function<void(const SearchWork&)> check_work;
};

struct SearchCandidate {
  ParallelSpec spec;
  int micro_batch = 1;
  ref::Recompute recompute = ref::Recompute::kNone;
  std::string family;          // family_of(spec)
  std::string label;           // spec.label() + "-mb<m>-rc_<recompute>"
  parallel::LedgerRow ledger;  // the fullest rank's
  std::size_t memory_per_rank_bytes = 0;
  double bound_s = 0;  // the bound (a lower bound of the step: see the file's opening)
  // bound_s includes the stage bound of the candidate's own order (else only the one of every
  // order: plan.hpp's stage_bound_any_order).
  bool bound_own_order = false;
  bool timed = false;
  StepEval eval;
  double bubble_formula = 0;                   // (p-1)/(v*m+p-1); 0 without a pipeline
  double model_flops = 0, hardware_flops = 0;  // per step (hardware: recompute counted)
  double tokens_per_s = 0, mfu = 0, hfu = 0, goodput = 0;
  std::string reason;  // why it ranks where it does
};

struct FamilyBest {
  std::string family;
  std::size_t candidates = 0;  // of this family
  bool found = false;          // a timed candidate of this family fits
  SearchCandidate best;        // found: its fastest; else the one needing least memory, if any
  bool any_built = false;      // some candidate of the family is built and has a ledger
  std::string why;             // why it lost (or that it is the best)
};

struct SearchResult {
  std::string scenario;
  std::string attention_kernel = "engine";  // the scenario's plan.attention_kernel
  std::string moe_routing = "uniform";      // the scenario's plan.moe_routing
  std::string bf16_rounding = "sum_first";  // the scenario's plan.bf16_rounding
  std::string gemm_model;                   // gemm_model_text of the scenario's device
  int world = 0;
  int global_batch = 0;
  double device_memory_bytes = 0;
  // Meshes: (dp, tp, pp, cp, ep, CP algorithm) of the world size; those the engine refuses at
  // its most permissive settings, and those the planner does not time (their settings are not
  // enumerated).
  std::size_t meshes = 0, meshes_not_built = 0;
  int max_cp = 0;  // SearchOptions's
  // Candidates: every setting of the other meshes (orders that place every group alike: one).
  std::size_t candidates = 0;
  std::size_t not_built = 0;         // refused by the engine's validation
  std::size_t not_fitting = 0;       // over device memory
  std::size_t recompute_pruned = 0;  // a lighter recompute of the same settings fits
  std::size_t bound_pruned = 0;      // fit, ruled out by the bound
  std::size_t any_order_pruned = 0;  // of those: by the bound of every order of the setting
  std::size_t timed = 0;
  std::vector<SearchCandidate> ranked;  // timed and fitting, fastest first (all of them)
  std::vector<FamilyBest> families;
  int top = 10;
  double wall_s = 0;
  // Of wall_s: enumeration, validation and the memory ledger; the compute bounds; the clock.
  double enumerate_s = 0, bound_wall_s = 0, timing_s = 0;
};

// "DDP" (data parallel, parameters replicated: ZeRO 0-2, FSDP no_shard), "FSDP" (ZeRO-3 or FSDP
// sharding parameters), "TP + DP", "FSDP + TP", "TP + PP + DP" (any pipeline), "+ CP", "+ EP".
std::string family_of(const ParallelSpec& p);

// Throws ScenarioError when the world size or the scenario cannot be searched.
SearchResult search_plans(const Scenario& s, const SearchOptions& o);

// The `search` object of report.json and of `plan --search --json`.
nlohmann::json search_json(const SearchResult& r);

}  // namespace shardcheck::harness

// The step skeleton of a data-parallel configuration: the communication pattern the former
// data-parallel engine issued (per-microbatch reduce_scatters; the mesh engine that replaced it
// reduces once per step, issue 17) with its compute() costs
// (parallel/flops.hpp), sized for the real model, issued with null buffers and real counts. It runs
// on any comm::Communicator that moves no data: sim::SimWorld in meta mode (every rank a thread)
// or the planner's SymmetricClock (one representative rank). Timing only: no numerics, no memory
// books (the planner takes memory from parallel::ledger).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "harness/plan_clock.hpp"
#include "harness/scenario.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/flat.hpp"
#include "parallel/fsdp.hpp"
#include "parallel/ledger.hpp"
#include "reference/config.hpp"

namespace shardcheck::harness {

struct SkeletonSpec {
  ref::ModelConfig model;
  parallel::Recipe recipe;
  parallel::DataParallelOptions options;        // strategy, buckets, overlap, FSDP details
  comm::DType param_dtype = comm::DType::bf16;  // what parameter all_gathers move
  comm::DType grad_dtype = comm::DType::f32;    // what gradient reductions move
  int dp = 1;                                   // ranks in the data-parallel group (the world)
  int local_batch = 1;                          // sequences per rank per step
  int micro_batch = 1;                          // sequences per microbatch
  ref::Recompute recompute = ref::Recompute::kNone;
  bool health_check = true;  // the one-i32-per-rank all_gather `shardcheck run` turns on
  int steps = 2;
};

// The skeleton of configuration p at DP size dp with this global batch (sequences per step).
// reduce_dtype overrides the recipe's gradient reduction dtype (a what-if: the engine reduces in
// the recipe's grad dtype, f32 in the bf16 recipe). Throws ScenarioError when the batch does not
// split into whole microbatches per rank.
SkeletonSpec skeleton_spec(const Scenario& s, const ParallelSpec& p, int dp, int global_batch,
                           const comm::DType* reduce_dtype = nullptr);

// Shapes the skeleton needs, computed once per spec and shared read-only by all ranks.
class Skeleton {
 public:
  explicit Skeleton(SkeletonSpec spec);
  const SkeletonSpec& spec() const { return spec_; }
  // Rules of the splits run() makes (hybrid shard: shard group, then replicate group), for a
  // SymmetricClock.
  std::vector<SplitRule> splits() const;
  // Issues spec().steps steps on this rank of the DP group.
  void run(comm::Communicator& dp) const;
  // Model FLOPs of one step over the whole world (forward + backward = 3 x forward, recompute
  // not counted) and the hardware FLOPs actually issued (recompute included).
  double model_flops_per_step() const;
  double hardware_flops_per_step() const;

  struct Unit {              // one wrap unit's flat buffer
    std::vector<int> units;  // layerwise units
    std::size_t padded = 0;  // elements of the padded buffer (P_u)
    std::size_t shard = 0;   // elements each rank owns (S_u)
  };

 private:
  friend class SkeletonRun;
  SkeletonSpec spec_;
  bool full_buckets_ = false;    // DDP / ZeRO-1: bucketed all_reduce in the last microbatch
  bool sharded_params_ = false;  // ZeRO-3 / FSDP (not no_shard)
  bool sharded_grads_ = false;   // norm all_reduce over the shard group
  bool no_shard_ = false;
  bool gather_after_update_ = false;  // ZeRO-1/2
  int shard_size_ = 1;                // members of the sharding group
  std::vector<Unit> groups_;
  std::vector<int> group_of_;  // layerwise unit -> group
  std::vector<parallel::Range> buckets_;
  std::vector<std::vector<int>> bucket_units_;
  std::vector<int> uses_;  // for the residency plan
  parallel::ResidencyPlan plan_{{}, false, 0, 0, -1};
  std::size_t owned_elems_ = 0;      // optimizer elements per rank
  std::vector<double> block_flops_;  // forward FLOPs of one microbatch per block
  double head_flops_ = 0;
  std::vector<std::string> names_;  // timeline labels
};

}  // namespace shardcheck::harness

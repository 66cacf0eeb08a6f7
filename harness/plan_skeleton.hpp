// The planner's view of one configuration: the engine's timing-only backend
// (parallel/mp/mesh_timing.hpp: the step of parallel/mp/mesh_step.hpp on null buffers) set up from
// a scenario, the rules of the splits it makes (for a sim::SymmetricClock), the key naming them,
// and the step's model and hardware FLOPs. It runs on any comm::Communicator that moves no data:
// sim::SimWorld in meta mode (every rank a thread), the planner's sim::SymmetricClock (one
// representative rank: every rank of a mesh without a pipeline issues alike) or sim::StageWorld
// (one representative per pipeline stage). The conformance test (harness/conformance.hpp) checks
// that it issues what the numeric engine issues, op for op, for every configuration of the
// parity matrix.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "harness/scenario.hpp"
#include "parallel/mp/mesh_timing.hpp"
#include "reference/config.hpp"
#include "sim/clock.hpp"

namespace shardcheck::harness {

// The skeleton of configuration p at DP size dp with this global batch (sequences per step).
// reduce_dtype overrides the gradient reduction dtype (a what-if: the engine reduces in its
// numeric type, f32 in the bf16 recipe). Throws ScenarioError when the batch does not split into
// whole microbatches per rank.
parallel::TimingSpec skeleton_spec(const Scenario& s, const ParallelSpec& p, int dp,
                                   int global_batch, const comm::DType* reduce_dtype = nullptr);

// A configuration as the planner runs and counts it; shared read-only by all ranks' runs.
class Skeleton {
 public:
  explicit Skeleton(parallel::TimingSpec spec);
  const parallel::TimingSpec& spec() const { return timing_.spec(); }
  // Rules of the splits run() makes: the engine's groups (parallel/mp/mesh_groups.hpp), for a
  // sim::SymmetricClock.
  std::vector<sim::SplitRule> splits() const;
  // Every input of splits(): skeletons with equal keys state the same rules (the mesh's shape and
  // order, kv replicas, expert parts, hybrid shard and its shard group size).
  std::string split_key() const;
  // Issues spec().steps steps on this rank of the world (its ranks the mesh's).
  void run(comm::Communicator& world) const { timing_.run(world); }
  // run() on a sim::SymmetricClock (alone or a StageWorld's representative), each kind of block
  // (forward or backward, dense or MoE) issued once and replayed for the other layers and
  // sequences where the clock allows (SymmetricClock::memo_region): the same sums and times.
  void run_replaying(sim::SymmetricClock& clock) const;
  // The names of the groups whose collectives run inside a microbatch's blocks and are waited
  // where the block's own program waits them, whatever the schedule (tp, tp-kv, cp, ep): a
  // sim::SymmetricClock::list_groups list (the data-parallel groups' are not among them).
  // The names are the splits' own (build_groups' axis names, mesh_rows.hpp's kTpKvGroup).
  static std::vector<std::string> block_groups();
  // Ring attention over CP ranks (cp_ring.cpp): flash-style, its backward computes the scores
  // again itself, so selective recompute adds no attention core.
  bool ring_attention() const {
    return mesh().size(comm::Axis::cp) > 1 && spec().mesh.cp_algo == parallel::CpAlgo::ring;
  }
  // Attention whose backward computes the scores again itself, so selective recompute adds no
  // attention core: the ring, or a flash kernel (MeshOptions::attention).
  bool flash_style_attention() const {
    return ring_attention() || spec().mesh.attention == parallel::AttentionKernel::flash;
  }
  // Model FLOPs of one step over the whole world (forward + backward = 3 x forward, the full
  // s x s attention core of the MFU convention, recompute not counted) and the hardware FLOPs
  // the kernels execute: recompute included, each attention core as its kernel computes it
  // (executed_attention_core), so at most what the clock's compute time allows at peak.
  double model_flops_per_step() const;
  double hardware_flops_per_step() const;
  // One layer's attention core over one sequence as the kernels execute it, forward, backward
  // and recompute: the causal pairs (the engine's and flash kernels; the ring: whole blocks of
  // its chunk pairs, costs::ring_run_pairs), 4 FLOPs per pair and channel forward, 10 backward
  // (the scores again inside), 4 more when recompute repeats the core (full recompute, or
  // selective without a flash-style kernel).
  double executed_attention_core() const;
  // Recompute repeats the attention core: full recompute, or selective without a flash-style
  // kernel (which computes the scores again inside its backward whatever the recompute).
  bool core_recomputed() const;

 private:
  parallel::MeshTiming timing_;
  int shard_size_ = 1;  // DP ranks in each shard group (hybrid: shard_group_size; else dp)
  const comm::DeviceMesh& mesh() const { return timing_.mesh(); }
  const parallel::TokenLayout& layout() const { return timing_.layout(); }
  bool hybrid_shard() const { return timing_.rules().hybrid_shard; }
  int ep() const { return mesh().size(comm::Axis::ep); }
  // TP ranks sharing one kv head (tp above kv_heads), 1 otherwise.
  int kv_replicas() const {
    return spec().tp > spec().model.kv_heads ? spec().tp / spec().model.kv_heads : 1;
  }
  // The bf16 recipe on a MoE model: the engine's expert-parts group (mesh_bf16.hpp).
  bool expert_parts() const {
    return spec().train.precision == ref::Precision::kBf16 && spec().model.moe.has_value();
  }
};

}  // namespace shardcheck::harness

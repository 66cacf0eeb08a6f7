// The step skeleton of a configuration: what the mesh engine (parallel/mp/mesh_impl.hpp)
// issues on a dp x tp x pp x cp mesh (data parallelism with DDP / ZeRO / FSDP, tensor parallelism
// with or without sequence parallelism, GPipe / 1F1B / interleaved pipelines, ring and Ulysses
// context parallelism, expert parallelism), sized for the real model, with null buffers and real
// counts. Its layout, order and collectives come from the engine's own pieces, each written once
// and run by both: the process groups in split order (mesh_groups.hpp), what the data-parallel
// options mean (mesh_engine.hpp's data_parallel_rules), the rank's parameters (local_params),
// stage plans, flat buffers and their shards in their groups (mesh_classes.hpp), the optimizer's
// collectives (mesh_class_comm.hpp's ClassComm, on null buffers here), ZeRO-3 / FSDP residency
// (Residency) and per-microbatch reductions (mesh_unit_reducer.hpp's UnitReducer), the pipeline's
// executor (run_pipeline with a NullPipeStage), each chunk's walk (mesh_walk.hpp: its steps, the
// units they use, the gradients each completes), DDP's bucket fill (mesh_buckets.hpp), the sums
// before a reduction (mesh_rows.hpp's replica_sums and no_shard_sums, mesh_bf16.hpp's
// microbatch_presums), the tied embedding's exchange, each sequence's embedding, blocks and head
// (tp_block.hpp's, with cp_attention, cp_ring, ep_moe and vocab_parallel, on Meta tensors:
// plan_block.hpp), the step's scalar collectives (parallel/step.hpp's global_counts, global_sums
// and agree_health), the update's (ClassComm::update) and the compute reports (parallel/costs.hpp).
// What it still writes itself (the order of the step's phases and of a chunk's end) is checked
// against the engine by the conformance test (harness/conformance.hpp: the op logs of both runs are
// equal for every configuration of the parity matrix). It runs on any comm::Communicator that moves
// no data: sim::SimWorld in meta mode (every rank a thread), the planner's sim::SymmetricClock (one
// representative rank: every rank of a mesh without a pipeline issues alike) or sim::StageWorld
// (one representative per pipeline stage). Timing only: no numerics, no memory books. Stated
// assumptions (plan_block.hpp): every sequence is one document without padding; MoE experts
// receive what plan.moe_routing says (parallel::MoeRouting): every top-k assignment kept and
// spread evenly over the EP ranks (ceil(rows x top_k / ep) rows to each), or every expert its
// full capacity of every sequence.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "harness/scenario.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/ep_moe.hpp"
#include "parallel/mp/mesh_classes.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "parallel/mp/mesh_groups.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/tokens.hpp"
#include "reference/config.hpp"
#include "sim/clock.hpp"

namespace shardcheck::harness {

// The engine's numeric type (what activations, and its gradients outside the bf16 recipe, are):
// f64, else f32.
inline comm::DType numeric_dtype(ref::Precision p) {
  return p == ref::Precision::kF64 ? comm::DType::f64 : comm::DType::f32;
}

struct SkeletonSpec {
  ref::ModelConfig model;
  ref::TrainConfig train;      // precision, micro batch, recompute
  parallel::MeshOptions mesh;  // the engine's options (zero, fsdp, buckets, overlap, health)
  parallel::Recipe recipe;
  comm::DType param_dtype = comm::DType::bf16;  // what parameter all_gathers move
  comm::DType grad_dtype = comm::DType::f32;    // what gradient reductions move
  int dp = 1;                                   // ranks in the data-parallel group
  int tp = 1;                                   // ranks in the tensor-parallel group
  int local_batch = 1;                          // sequences per rank per step
  parallel::MoeRouting moe_routing = parallel::MoeRouting::uniform;  // plan.moe_routing
  // The bf16 recipe's per-microbatch sums before rounding (microbatch_presums): issued, as the
  // engine does, unless plan.bf16_rounding is "local" (a what-if).
  bool microbatch_presums = true;
  int steps = 2;
};

// The skeleton of configuration p at DP size dp with this global batch (sequences per step).
// reduce_dtype overrides the gradient reduction dtype (a what-if: the engine reduces in its
// numeric type, f32 in the bf16 recipe). Throws ScenarioError when the batch does not split into
// whole microbatches per rank.
SkeletonSpec skeleton_spec(const Scenario& s, const ParallelSpec& p, int dp, int global_batch,
                           const comm::DType* reduce_dtype = nullptr);

// Shapes the skeleton needs, computed once per spec and shared read-only by all ranks.
class Skeleton {
 public:
  explicit Skeleton(SkeletonSpec spec);
  const SkeletonSpec& spec() const { return spec_; }
  // Rules of the splits run() makes: the engine's groups (parallel/mp/mesh_groups.hpp), for a
  // sim::SymmetricClock.
  std::vector<sim::SplitRule> splits() const;
  // Every input of splits(): skeletons with equal keys state the same rules (the mesh's shape and
  // order, kv replicas, expert parts, hybrid shard and its shard group size).
  std::string split_key() const;
  // Issues spec().steps steps on this rank of the world (dp x tp ranks).
  void run(comm::Communicator& world) const;
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
    return mesh_.size(comm::Axis::cp) > 1 && spec_.mesh.cp_algo == parallel::CpAlgo::ring;
  }
  // Attention whose backward computes the scores again itself, so selective recompute adds no
  // attention core: the ring, or a flash kernel (MeshOptions::attention).
  bool flash_style_attention() const {
    return ring_attention() || spec_.mesh.attention == parallel::AttentionKernel::flash;
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
  friend class SkeletonRun;
  SkeletonSpec spec_;
  parallel::DataParallelRules rules_;  // what the data-parallel options mean (mesh_engine.hpp)
  int shard_size_ = 1;  // DP ranks in each shard group (hybrid: shard_group_size; else dp)
  bool hybrid_shard() const { return rules_.hybrid_shard; }
  double elem_ = 4;  // bytes of the engine's numeric type
  comm::DeviceMesh mesh_{comm::MeshShape{}};
  parallel::TokenLayout layout_{1, 1, 1, false};
  int ep() const { return mesh_.size(comm::Axis::ep); }
  // TP ranks sharing one kv head (tp above kv_heads), 1 otherwise.
  int kv_replicas() const {
    return spec_.tp > spec_.model.kv_heads ? spec_.tp / spec_.model.kv_heads : 1;
  }
  // The bf16 recipe on a MoE model: the engine's expert-parts group (mesh_bf16.hpp).
  bool expert_parts() const {
    return spec_.train.precision == ref::Precision::kBf16 && spec_.model.moe.has_value();
  }
  std::vector<parallel::mesh_detail::GroupSplit> group_splits_;  // the engine's, in order
  std::map<int, int> wrap_of_;                                   // layerwise unit -> wrap unit
};

}  // namespace shardcheck::harness

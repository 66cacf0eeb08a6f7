// Training of the reference model on a DP x TP x PP x CP x EP mesh (Megatron-Core style), written
// only against comm::Communicator. Composes the pieces of parallel/mp/: vocab-parallel embedding
// and head, the TP (+SP) block with CP attention (ring / Ulysses) and EP MoE, pipeline schedules
// (GPipe, 1F1B, interleaved), and data parallelism over DP (and EP: EP ranks read different
// sequences, as Megatron carves EP out of data parallelism).
//
// One step:
//   1. all_reduce of the loss denominators over the data group (dp), before any backward;
//   2. the pipeline schedule over this rank's local batch in microbatches (send/recv between
//      stages; every sublayer's TP/CP/EP collectives inside);
//   3. gradient sums: the tied embedding between the first and last stage; under SP the
//      TP-replicated parameters (norms, router, experts) over TP; non-expert parameters over
//      dp x cp, experts over edp (the expert-DP group, dp x cp / ep ranks);
//   4. the global L2 norm (every element counted once in the world), numerators over the world,
//      the health check (an i32 per world rank; a skipped step applies no update);
//   5. clip and AdamW on the local slices (the reference's arithmetic), bf16 recipe as the trainer;
//      with MeshOptions::zero >= 1 on the owned shard only, then all_gather of the parameters
//      (zero 1/2). Zero 3 / FSDP keeps only the shards of each wrap unit between uses and gathers
//      a unit before its use in a chunk's forward or backward (mesh_residency.hpp: prefetch,
//      reshard after forward or keep until the backward).
// Every buffer is reported to world.memory() (params, grads, optimizer state, the activations the
// pipeline keeps between a chunk's forward and its backward, collective temporaries).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.hpp"
#include "comm/memory.hpp"
#include "comm/mesh.hpp"
#include "parallel/config.hpp"
#include "parallel/fsdp.hpp"
#include "parallel/mp/cp_attention.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/pipeline.hpp"
#include "parallel/state.hpp"
#include "parallel/step.hpp"
#include "parallel/testing.hpp"
#include "reference/batch.hpp"
#include "reference/config.hpp"
#include "reference/tensor.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::parallel {

// Whether the bf16 recipe on this mesh rounds parts of one microbatch gradient to bf16 apart where
// the reference rounds their sum: the tied embedding's two uses, on the first and the last stage
// (pp > 1), are summed over the embedding group after the step. (CP, kv and TP replicas are
// summed per microbatch before the rounding.) Parity widens its bound for such a mesh.
inline bool rounds_gradient_parts(const ref::ModelConfig& model, const ref::TrainConfig& train,
                                  const comm::MeshShape& shape) {
  return train.precision == ref::Precision::kBf16 && model.tie_embeddings && shape.pp > 1;
}

struct MeshOptions {
  comm::MeshShape shape;
  std::string order = "tp-cp-ep-dp-pp";
  bool sequence_parallel = false;
  PipeSchedule schedule = PipeSchedule::one_f_one_b;
  int virtual_stages = 1;
  CpAlgo cp_algo = CpAlgo::ring;
  // The attention kernel (without CP, or Ulysses) the planner's timing-only run and the ledger
  // describe: the engine's own, which keeps the s x s probabilities, or flash (costs.hpp's
  // flash_forward: a log-sum-exp per row and head instead). The numeric engine has only its own
  // and refuses flash. Ring CP is flash-style either way.
  AttentionKernel attention = AttentionKernel::engine;
  // ZeRO stage on the data-parallel axes (mesh_zero.hpp): 0 replicated optimizer state; 1 moments
  // and bf16 master sharded over each parameter class's gradient-sum group (dp x cp for
  // non-expert, dp x cp for expert parameters), updated shards all_gathered; 2 also gradients
  // reduce_scattered; 3 also parameters sharded (each pipeline chunk's parameters all_gathered
  // before its forward and again before its backward, freed after each).
  int zero = 0;
  // FSDP on the data-parallel axes (parallel/fsdp.hpp), per parameter class: full_shard,
  // shard_grad_op and hybrid_shard are zero 3 with one flat buffer per wrap unit (wrap, prefetch
  // and reshard_after_forward as PyTorch's; shard_grad_op keeps a forward's gathers until the
  // microbatch's backward ends; hybrid_shard shards over shard_group_size data-parallel ranks with
  // every CP rank, replicated across the others). no_shard keeps everything replicated and sums
  // each microbatch's gradient after its backward (data-parallel meshes only). A zero stage other
  // than 0 or 3 beside fsdp is refused by validate_mesh. Plain zero 3
  // is full_shard with block units and no prefetch.
  std::optional<FsdpOptions> fsdp;
  // DDP overlap (zero 0/1): each pipeline chunk's gradient all_reduce (per parameter class) is
  // issued asynchronously right after the chunk's last microbatch backward, so it overlaps the rest
  // of the backward; the tied embedding and the TP/kv-replicated gradients wait for their own sums
  // first. false: every sum after the pipeline. The same bits either way.
  bool overlap = true;
  // DDP overlap buckets: completed gradients join the open bucket, which is issued once it holds
  // at least this many elements (1: every layer's as soon as it is complete); a chunk's backward
  // issues what is left at its end.
  std::size_t bucket_elems = 1;
  // The non-finite-gradient check over the world (step.hpp; ranks named by world rank) and the
  // hook, called after each chunk's backward of a microbatch for the parameters it wrote.
  GradHealthOptions health{};
  GradHook grad_hook{};
  // Internal use (tests): a known bug planted in this engine or its pieces (parallel/testing.hpp).
  testing::Mutation planted = testing::Mutation::kNone;
};

// What the data-parallel options mean for the step: one rule for the engine, its memory ledger
// and the planner's timing-only run. FSDP other than no_shard is zero 3; no_shard keeps
// everything replicated and sums each microbatch's gradient after its backward; zero 3 keeps a
// forward's gathers until the backward under shard_grad_op or without reshard_after_forward;
// DDP's buckets overlap the backward at zero 0/1 (not no_shard) with `overlap`.
struct DataParallelRules {
  int zero = 0;
  bool no_shard = false;
  bool hybrid_shard = false;  // shards over shard groups, replicated across them
  bool keep_after_forward = false;
  bool ddp_overlap = false;
  FsdpOptions fsdp;  // the options, or without FSDP the defaults with no prefetch
};
// From the options' data-parallel part as a configuration (data_parallel_of), the rules of
// ParallelConfig (parallel/config.hpp); ddp_overlap also reads MeshOptions::overlap.
DataParallelRules data_parallel_rules(const MeshOptions& o);

// The engine's options for a configuration (the mesh and its layout, schedule, CP algorithm,
// ZeRO / FSDP settings, DDP buckets; no health check, the engine's attention kernel). An unset
// hybrid_shard group (0) is gcd(dp, ranks_per_node), PyTorch's HYBRID_SHARD default (shard inside
// a node, replicate across nodes).
MeshOptions mesh_options(const ParallelConfig& c, int ranks_per_node);
// The options' data-parallel part as the configuration's variant: fsdp if set (a zero stage
// beside it, which validate_mesh refuses unless 3, dropped), else ZeRO, else DDP.
DataParallel data_parallel_of(const MeshOptions& o);

// Throws MeshConfigError naming the field when the model, batch or mesh do not fit together.
void validate_mesh(const ref::ModelConfig& model, const ref::TrainConfig& train,
                   const MeshOptions& options);

class MeshEngine {
 public:
  // Collective over world (world.size() == shape.world_size()): builds every group.
  MeshEngine(comm::Communicator& world, const ref::ModelConfig& model,
             const ref::TrainConfig& train, uint64_t seed, MeshOptions options);
  ~MeshEngine();
  MeshEngine(const MeshEngine&) = delete;
  MeshEngine& operator=(const MeshEngine&) = delete;

  const comm::DeviceMesh& mesh() const;
  // This rank's slice of the global batch: data_rank() of data_world() (= dp; ep ranks are among
  // the data-parallel ranks and read different sequences, as in Megatron).
  int data_rank() const;
  int data_world() const;
  // This rank's slice of a global batch (rank_batch over data_rank() of data_world(); the planted
  // kSameSamples sampler bug applies here).
  ref::Batch local_batch(const ref::Dataset& data, const std::vector<int64_t>& global_ids) const;

  // One optimizer step over the local batch (global_batch / data_world() sequences with global
  // Sequence::index). Collective over the world; returns the same global record on every rank.
  ref::StepRecord step(const ref::Batch& local_batch);

  // world.memory()'s holdings when the last step's optimizer began (gradients reduced,
  // activations freed): the model state per rank.
  const comm::MemoryBreakdown& last_model_state() const;
  // Parameter elements this rank holds between steps (ZeRO-3 / FSDP: its shards).
  std::size_t resident_param_elems() const;
  // The health verdict of the last step (the same on every rank) and the steps skipped so far.
  const StepHealth& last_step_health() const;
  int skipped_steps() const;

  // Every parameter at full shape in f64 (master weights). Collective over the world.
  ref::ParamMap<double> full_params();

  // Checkpoint state as neutral pieces (parallel/state.hpp):
  // over the world every element of every logical tensor is written exactly once (a slice held
  // by several ranks is written by its DP/CP/EP/TP rank 0 copy). Not collective.
  std::vector<StatePiece> export_state() const;
  // Every parameter element this rank's forward reads, replicas included (param/<name>; see
  // MeshOptimizer::export_held), so a parity check can compare each copy. Not collective.
  std::vector<StatePiece> held_params() const;
  // Reads the slices this rank holds from any exporter (any mesh of the same precision recipe). Not
  // collective; call on every rank before the next step.
  void import_state(const StateReader& read);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardcheck::parallel

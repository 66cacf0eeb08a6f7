// The mesh engine's timing-only backend: the step of mesh_step.hpp on a dp x tp x pp x cp x ep
// mesh (DDP / ZeRO / FSDP, TP with or without SP, GPipe / 1F1B / interleaved pipelines, ring and
// Ulysses CP, EP), sized for the real model, with null buffers of the real counts and no data.
// Beside the numeric backend (MeshImpl<T>, mesh_impl.hpp) it supplies only what a call does
// without data: the optimizer's collectives on null buffers (mesh_class_comm.hpp's ClassComm),
// each sequence's embedding, blocks and head on Meta tensors (mesh_sequence_ops.hpp), the sums
// before a reduction counted from the parameters' shapes, the pipeline's executor with a
// NullPipeStage. The planner (harness/plan.cpp) times it on a sim::SymmetricClock; the
// conformance test (harness/conformance.hpp) compares its op log with the numeric engine's for
// every configuration of the parity matrix. No numerics, no memory books (the ledger has those).
//
// Stated assumptions where a numeric run reads its data: every sequence is one document without
// padding; MoE experts receive what `moe_routing` says (MoeRouting): every top-k assignment kept
// and spread evenly over the EP ranks, or every expert its full capacity of every sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/dtype.hpp"
#include "comm/mesh.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/ep_moe.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "parallel/mp/mesh_groups.hpp"
#include "parallel/mp/tokens.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel {

// The engine's numeric type (what activations, and its gradients outside the bf16 recipe, are):
// f64, else f32.
inline comm::DType numeric_dtype(ref::Precision p) {
  return p == ref::Precision::kF64 ? comm::DType::f64 : comm::DType::f32;
}

struct TimingSpec {
  ref::ModelConfig model;
  ref::TrainConfig train;  // precision, micro batch, recompute
  MeshOptions mesh;        // the engine's options (zero, fsdp, buckets, overlap, health)
  Recipe recipe;
  comm::DType param_dtype = comm::DType::bf16;  // what parameter all_gathers move
  comm::DType grad_dtype = comm::DType::f32;    // what gradient reductions move
  int dp = 1;                                   // ranks in the data-parallel group
  int tp = 1;                                   // ranks in the tensor-parallel group
  int local_batch = 1;                          // sequences per rank per step
  MoeRouting moe_routing = MoeRouting::uniform;
  // The bf16 recipe's per-microbatch sums before rounding (microbatch_presums): issued, as the
  // engine does, unless a what-if leaves them out (Megatron-style f32 main gradients).
  bool microbatch_presums = true;
  int steps = 2;
};

// Each kind of block (`key`: forward or backward, dense or MoE) issues the same ops for every
// layer of its kind, waits what it issues, and its groups are inside the stage: a memo may run
// `ops` once and replay its effect after (sim::SymmetricClock::memo_region).
using BlockMemo = std::function<void(std::uint64_t key, const std::function<void()>& ops)>;

// The shapes of one configuration, worked out once and shared read-only by every rank's run.
class MeshTiming {
 public:
  explicit MeshTiming(TimingSpec spec);
  const TimingSpec& spec() const { return spec_; }
  const comm::DeviceMesh& mesh() const { return mesh_; }
  const TokenLayout& layout() const { return layout_; }
  const DataParallelRules& rules() const { return rules_; }
  // The engine's groups in split order (mesh_groups.hpp).
  const std::vector<mesh_detail::GroupSplit>& group_splits() const { return group_splits_; }
  const std::map<int, int>& wrap_of() const { return wrap_of_; }

  // Issues spec().steps steps on this rank of `world` (its ranks the mesh's); with a memo, each
  // kind of block through it.
  void run(comm::Communicator& world, const BlockMemo* memo = nullptr) const;

 private:
  TimingSpec spec_;
  DataParallelRules rules_;  // what the data-parallel options mean (mesh_engine.hpp)
  comm::DeviceMesh mesh_{comm::MeshShape{}};
  TokenLayout layout_{1, 1, 1, false};
  std::vector<mesh_detail::GroupSplit> group_splits_;
  std::map<int, int> wrap_of_;  // layerwise unit -> wrap unit
};

}  // namespace shardcheck::parallel

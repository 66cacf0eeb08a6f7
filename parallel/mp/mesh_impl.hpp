// Internal to the mesh engine (mesh_engine.hpp): MeshEngine::Impl and MeshImpl<T>, the engine's
// state on one rank: the numeric backend of the step's order (mesh_step.hpp, which also holds the
// step's gradient sums). Defined in mesh_engine.cpp (construction, the step's phases, the tied
// embedding's sum, the state's export and import) and mesh_chunks.cpp (one chunk's forward and
// backward over a microbatch on data, and what the order asks of the gradients: the hook, DDP's
// buckets, the bf16 rounding, the sums before a reduction). Model math in tp_block.cpp, parameter
// slices in mesh_params.cpp, validation in mesh_validate.cpp.
#pragma once

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/memory.hpp"
#include "parallel/flops.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/mesh_bf16.hpp"
#include "parallel/mp/mesh_buckets.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "parallel/mp/mesh_groups.hpp"
#include "parallel/mp/mesh_memory.hpp"
#include "parallel/mp/mesh_residency.hpp"
#include "parallel/mp/mesh_rows.hpp"
#include "parallel/mp/mesh_step.hpp"
#include "parallel/mp/mesh_unit_reducer.hpp"
#include "parallel/mp/mesh_walk.hpp"
#include "parallel/mp/mesh_zero.hpp"
#include "parallel/mp/tp_block.hpp"
#include "parallel/testing.hpp"
#include "reference/bf16.hpp"
#include "reference/model.hpp"
#include "reference/optim.hpp"

namespace shardcheck::parallel {

struct MeshEngine::Impl {
  explicit Impl(comm::DeviceMesh m) : mesh(std::move(m)) {}
  virtual ~Impl() = default;
  virtual ref::StepRecord step(const ref::Batch& local) = 0;
  virtual ref::ParamMap<double> full_params() = 0;
  virtual std::vector<StatePiece> export_state() const = 0;
  virtual std::vector<StatePiece> held_params() const = 0;
  virtual void import_state(const StateReader& read) = 0;
  comm::DeviceMesh mesh;
  comm::MemoryBreakdown model_state;
  StepHealth health;
  int skipped = 0;
  int data_rank = 0, data_world = 1;
  testing::Mutation planted = testing::Mutation::kNone;
  std::size_t resident_params = 0;
};

namespace mesh_detail {

using ref::Tensor;

// The mesh engine's Units: MeshOptimizer's reductions of the microbatch gradients in *grads.
template <class T>
struct OptimizerUnits {
  using Pending = typename MeshOptimizer<T>::UnitReduce;
  MeshOptimizer<T>* opt = nullptr;
  ref::ParamMap<T>* grads = nullptr;
  Pending issue(std::size_t cls) { return opt->issue_unit_reduce(cls, *grads); }
  void complete(Pending& r) { opt->complete_unit_reduce(r); }
  void reduce_each_microbatch(std::vector<bool> classes) {
    opt->reduce_each_microbatch(std::move(classes));
  }
};

template <class T>
class MeshImpl final : public MeshEngine::Impl, StepOrder<MeshImpl<T>> {
  using Order = StepOrder<MeshImpl<T>>;
  friend Order;

 public:
  MeshImpl(comm::Communicator& world, const ref::ModelConfig& model, const ref::TrainConfig& train,
           uint64_t seed, MeshOptions options);
  ref::StepRecord step(const ref::Batch& local) override;
  ref::ParamMap<double> full_params() override;
  std::vector<StatePiece> export_state() const override;
  std::vector<StatePiece> held_params() const override;
  void import_state(const StateReader& read) override;

 private:
  const ref::ParamMap<T>& weights() const { return params_; }
  // Whether the backward writes each microbatch's gradient apart (mb_grads_) before it is added
  // into the step's accumulator: the bf16 recipe's rounding, FSDP no_shard's per-microbatch sum,
  // ZeRO-3's per-microbatch reduce_scatter.
  bool microbatch_grads() const {
    return train_.precision == ref::Precision::kBf16 || this->order().no_shard || opt_.zero == 3;
  }
  ref::ParamMap<T>& grad_target() { return microbatch_grads() ? mb_grads_ : grads_; }

  // The order's hooks (mesh_step.hpp): the step's phases, and what its calls do to the data.
  void count();
  void pipeline();
  void reduced();
  void sum();
  void update();
  MeshResidency<T>* residency() { return residency_.get(); }
  UnitReducer<OptimizerUnits<T>>& units() { return *units_; }
  void sync_tied_embedding();
  void reduce() { zopt_->reduce(grads_); }
  void round_microbatch(GradScope scope);
  // The sums of replica_sums: at the step's end (deferred) on the step's gradients of the
  // parameters reduced then; for a ZeRO-3 buffer, on its microbatch gradient.
  struct ReplicaSums {
    std::vector<LocalParam> specs;  // the scope's parameters
    ref::ParamMap<T>& grads;
    void sum(comm::Communicator* g, ParamPick pick) {
      if (g != nullptr) all_reduce_picked(specs, *g, pick, grads);
    }
  };
  ReplicaSums replica_ops(GradScope scope);
  // FSDP no_shard: each microbatch's gradient summed (planted: the dense parameters left out).
  struct MicrobatchSums {
    MeshImpl& e;
    void sum(comm::Communicator* g, ParamPick pick) {
      if (g == nullptr) return;
      if (g == e.dense_.get() && e.opt_.planted == testing::Mutation::kSkipBucket) return;
      all_reduce_picked(e.specs_, *g, pick, e.mb_grads_, e.zopt_->sum());  // planted: avg
    }
  };
  MicrobatchSums microbatch_sum_ops() { return {*this}; }
  void accumulate_microbatch();
  void completed(int mb, const ChunkStep& step) {
    check_gradients(mb, grad_target(), [&step](const LocalParam& p) { return step.completes(p); });
  }
  // The scope's parameters: a flat class's, or those the step's end reduces.
  std::vector<LocalParam> scope_params(GradScope scope) const;

  Tensor<T> forward(int mb, int chunk, Tensor<T> input);

  Tensor<T> backward(int mb, int chunk, Tensor<T> dout);

  // DDP overlap: the chunk's gradients are complete after its last microbatch; those summed only
  // over their class's group go now (the tied embedding, SP's TP-replicated and the replicated kv
  // heads need another sum first, in sync_gradients).
  // Buckets fill in completion order and go once they hold bucket_elems elements; what a chunk's
  // backward leaves goes at its end (flush).
  void issue_bucket(const typename MeshOptimizer<T>::Pick& pick, bool flush);

  // The grad hook and the health flag on this rank's local gradients of the picked parameters,
  // complete for this microbatch, before any reduction over another rank (the bf16 recipe: before
  // the rounding).
  void check_gradients(int mb, ref::ParamMap<T>& grads,
                       const typename MeshOptimizer<T>::Pick& pick);

  // What a block keeps from its forward for its backward (ref::Recompute): selective drops the
  // attention core's probabilities (Ulysses keeps them; the ring, flash-style, never does), full
  // everything but the block input.
  void keep_for_backward(MpBlockCache<T>& c) const;

  const ref::Sequence& seq(int mb, int i) const {
    return (*batch_)[static_cast<std::size_t>(mb * train_.micro_batch + i)];
  }

  comm::Communicator& world_;
  ref::ModelConfig model_;
  ref::TrainConfig train_;
  uint64_t seed_;
  MeshOptions opt_;
  comm::MemoryTracker& mem_;
  Recipe recipe_;
  TokenLayout layout_;
  comm::MeshGroups g_;
  std::unique_ptr<comm::Communicator> data_, dense_, expert_, kv_;
  HybridGroups dense_h_, expert_h_;  // hybrid_shard: shard and replica groups
  std::map<int, int> wrap_of_;       // layerwise unit -> wrap unit
  BucketFill buckets_;               // DDP overlap
  BlockEnv env_;
  int stage_ = 0;
  StagePlan plan_;
  std::vector<LocalParam> specs_;
  // params_: the forward weights (f64/f32: the master; bf16: the rounded working copy).
  ref::ParamMap<T> params_, grads_, mb_grads_;
  // The bf16 recipe with MoE: who rounds which expert gradients together; with parts, the
  // microbatch's expert gradients per part until they are rounded (mesh_bf16.hpp).
  std::unique_ptr<ExpertParts> experts_;
  std::vector<ref::ParamMap<T>> expert_parts_;
  comm::TrackedBytes params_held_;
  std::unique_ptr<MeshOptimizer<T>> zopt_;
  std::unique_ptr<MeshResidency<T>> residency_;            // zero 3
  std::unique_ptr<UnitReducer<OptimizerUnits<T>>> units_;  // zero 3: per-microbatch reductions
  std::string prefix_;
  int steps_ = 0;
  ref::StepContext ctx_;
  const ref::Batch* batch_ = nullptr;
  std::vector<double> counted_;  // loss_sum, aux_sum, dropped this rank counts
  bool nonfinite_ = false;       // this step's local gradients held a NaN or infinity
  // This step's: its denominators, its record, the gradients held through it.
  LossCounts den_{};
  ref::StepRecord record_;
  comm::TrackedBytes grads_held_, mb_held_;
  std::map<std::pair<int, int>, ChunkCache<T>> caches_;
};

}  // namespace mesh_detail
}  // namespace shardcheck::parallel

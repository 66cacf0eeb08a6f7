// The step skeleton of plan_skeleton.hpp: the engine's step order (parallel/mp/mesh_step.hpp) on
// a dp x tp x pp x cp mesh without data, its timing-only backend beside the numeric MeshImpl; the
// conformance test (tests/harness/conformance_test.cpp) compares the two op logs.
#include "harness/plan_skeleton.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <utility>

#include "harness/driver.hpp"
#include "harness/plan_block.hpp"
#include "parallel/flops.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/mp/mesh_bf16.hpp"
#include "parallel/mp/mesh_buckets.hpp"
#include "parallel/mp/mesh_class_comm.hpp"
#include "parallel/mp/mesh_residency.hpp"
#include "parallel/mp/mesh_rows.hpp"
#include "parallel/mp/mesh_step.hpp"
#include "parallel/mp/mesh_unit_reducer.hpp"
#include "parallel/mp/pipeline.hpp"

namespace shardcheck::harness {

namespace {

using parallel::FlatClass;
using parallel::LocalParam;

comm::Buffer null_buf(std::size_t count, comm::DType t) {
  return comm::Buffer{nullptr, count, t, {}};
}
std::size_t count_of(int64_t n) {
  return static_cast<std::size_t>(n);
}

}  // namespace

// One rank's execution of the skeleton: the timing-only backend of the engine's step order
// (parallel/mp/mesh_step.hpp), with the engine's step state (residency, buckets, issued
// reductions) and no data.
class SkeletonRun : parallel::mesh_detail::StepOrder<SkeletonRun> {
  using ClassComm = parallel::ClassComm<parallel::NullClassData>;
  using Order = parallel::mesh_detail::StepOrder<SkeletonRun>;
  using ChunkStep = parallel::mesh_detail::ChunkStep;
  using GradScope = parallel::mesh_detail::GradScope;
  friend Order;

 public:
  // memo: world itself when it is a clock whose blocks may be replayed (run_replaying).
  SkeletonRun(const Skeleton& k, comm::Communicator& world, sim::SymmetricClock* memo = nullptr)
      : memo_(memo),
        k_(k),
        sp_(k.spec_),
        world_(world),
        data_(&world),
        group_(&world),
        params_(parallel::shared_local_params(k.spec_.model, k.mesh_, world.world_rank(),
                                              k.spec_.mesh.virtual_stages)) {
    const ref::ModelConfig& m = sp_.model;
    const int v = sp_.mesh.virtual_stages;
    stage_ = k_.mesh_.coord(world.world_rank(), comm::Axis::pp);
    plan_ = parallel::stage_plan(m, pp(), v, stage_);
    buckets_ =
        parallel::mesh_detail::BucketFill({.tied_across_stages = m.tie_embeddings && pp() > 1,
                                           .sequence_parallel = sp(),
                                           .bucket_elems = sp_.mesh.bucket_elems});
    flat_ = parallel::flat_classes(specs_, k_.rules_.zero,
                                   [&](const LocalParam& p) { return k_.wrap_of_.at(p.unit); });
    // ZeRO-3's buffers reduced every microbatch and when (mesh_unit_reducer.hpp).
    units_.emplace(Units::Setup{.model = &m,
                                .wrap_of = &k_.wrap_of_,
                                .plan = &plan_,
                                .pp = pp(),
                                .virtual_stages = v,
                                .stage = stage_,
                                .zero = k_.rules_.zero,
                                .bytes_per_elem = 0,  // timing only
                                .planted = parallel::testing::Mutation::kNone,
                                .classes = &flat_},
                   specs_, NullUnits{this}, world.memory());
  }

  void run() {
    const int r = world_.rank();
    // The engine's groups, split as it splits them (mesh_groups.hpp); those of one rank unused.
    using G = parallel::mesh_detail::Group;
    groups_.emplace(world_, k_.mesh_, k_.group_splits_);
    const auto used = [&](G g) {
      comm::Communicator* c = groups_->get(g);
      return c != nullptr && c->size() > 1 ? c : nullptr;
    };
    tp_ = used(G::tp);
    pp_ = used(G::pp);
    cp_ = used(G::cp);
    kv_ = groups_->get(G::kv);
    data_ = groups_->get(G::data);
    group_ = groups_->get(G::dense);
    if ((parts_ = groups_->get(G::parts)) != nullptr)
      expert_parts_ = parallel::mesh_detail::expert_part_count(k_.mesh_, r);
    seq_.emplace(SequenceOps::Setup{.model = &sp_.model,
                                    .layout = &k_.layout_,
                                    .precision = sp_.train.precision,
                                    .recompute = sp_.train.recompute,
                                    .cp_algo = sp_.mesh.cp_algo,
                                    .attention = sp_.mesh.attention,
                                    .moe_routing = sp_.moe_routing,
                                    .params = &specs_,
                                    .tp = groups_->get(G::tp),
                                    .cp = groups_->get(G::cp),
                                    .ep = groups_->get(G::ep)});
    if (comm::Communicator* shard = groups_->get(G::dense_shard)) group_ = shard;
    // The classes in their groups (MeshOptimizer's): the experts' over the expert-data-parallel
    // ranks, the others' over dp x cp (hybrid shard: their shard groups, and replicas).
    comm::Communicator* expert_shard = groups_->get(G::expert_shard);
    classes_ = parallel::shard_classes(
        flat_, k_.rules_.zero,
        {.dense = group_,
         .expert = expert_shard != nullptr ? expert_shard : groups_->get(G::expert),
         .dense_replicas = groups_->get(G::dense_replicas),
         .expert_replicas = groups_->get(G::expert_replicas)});
    if (k_.rules_.zero == 3)
      residency_ = std::make_unique<Residency>(
          Gathers{this}, world_.memory(), sp_.recipe.param,
          Residency::Options{.prefetch = k_.rules_.fsdp.prefetch,
                             .keep_after_forward = k_.rules_.keep_after_forward});
    set_order({.model = &sp_.model,
               .wrap_of = &k_.wrap_of_,
               .plan = &plan_,
               .pp = pp(),
               .virtual_stages = sp_.mesh.virtual_stages,
               .stage = stage_,
               .micro_batch = sp_.train.micro_batch,
               .precision = sp_.train.precision,
               .recompute = sp_.train.recompute,
               .no_shard = k_.rules_.no_shard,
               .ddp_overlap = k_.rules_.ddp_overlap,
               .sp_tp = sp() ? tp_ : nullptr,
               .kv = kv_,
               .dense = groups_->get(G::dense),
               .expert = groups_->get(G::expert)});
    microbatches_ = sp_.local_batch / sp_.train.micro_batch;
    events_ = parallel::pipeline_events(sp_.mesh.schedule, pp(), stage_, microbatches_,
                                        sp_.mesh.virtual_stages);
    for (step_ = 1; step_ <= sp_.steps; ++step_) run_step();
  }

 private:
  // The optimizer's unit gathers (MeshOptimizer::issue_gather / complete_gather: ClassComm's).
  struct Gathers {
    using Pending = ClassComm::Gather;
    SkeletonRun* run = nullptr;
    Pending issue(int u) { return run->comm_.issue_gather(run->classes_, run->null_, u); }
    void complete(Pending& p) { run->comm_.complete_gather(run->classes_, run->null_, p); }
    void release(int /*u*/) {}
    int64_t elems(int u) const { return ClassComm::unit_elems(run->classes_, u); }
  };
  using Residency = parallel::mesh_detail::Residency<Gathers>;

  // The step's phases (MeshImpl's count, pipeline, reduced, sum, update) without data.
  void count() {
    world_.begin_step(step_);
    parallel::global_counts(*data_, {});
    buckets_.clear(specs_.size());
  }
  // The engine's executor (run_pipeline) with null buffers.
  void pipeline() {
    const parallel::NullPipeStage stage{
        .forward = [this](int mb, int chunk) { forward(mb, chunk); },
        .backward = [this](int mb, int chunk) { backward(mb, chunk); },
        .activation_shape =
            [this](int, int) {
              return parallel::mesh_detail::chunk_activation_shape(sp_.model, k_.layout_,
                                                                   sp_.train.micro_batch);
            },
        .dtype = activation()};
    parallel::run_pipeline(*groups_->get(parallel::mesh_detail::Group::pp), events_, stage);
  }
  void reduced() {}
  void sum() {
    parallel::global_sums(world_, {});
    if (sp_.mesh.health.check) parallel::agree_health(world_, false);
  }
  // MeshOptimizer::update's collectives and report, without the AdamW arithmetic.
  void update() {
    comm_.update(
        classes_, null_, [](const parallel::ShardedClass&) {}, world_, sp_.recipe);
  }
  Residency* residency() { return residency_.get(); }

  comm::DType numeric() const { return sp_.grad_dtype; }
  // What activations and their gradients move in: the engine's numeric type.
  comm::DType activation() const { return numeric_dtype(sp_.train.precision); }
  bool sp() const { return sp_.mesh.sequence_parallel && sp_.tp > 1; }

  int pp() const { return k_.mesh_.size(comm::Axis::pp); }
  // MeshImpl::sync_tied_embedding.
  void sync_tied_embedding() {
    const int other = parallel::mesh_detail::tied_embedding_peer(sp_.model, plan_, pp());
    if (other < 0) return;
    std::size_t n = 0;
    for (const LocalParam& p : specs_)
      if (p.name == "embed.weight") n = count_of(ref::numel_of(p.local_shape));
    parallel::mesh_detail::exchange_tied_embedding(*pp_, other, null_buf(n, numeric()),
                                                   null_buf(n, numeric()));
  }

  // One sequence's block of this layer (run_replaying: each kind of block once per run, replayed
  // after: a block issues the same ops for every layer of its kind, waits what it issues, and
  // its groups are inside the stage).
  void block(int layer, bool forward) {
    const auto ops = [&] { forward ? seq_->block_forward(layer) : seq_->block_backward(layer); };
    if (!memo_) return ops();
    memo_->memo_region(2 * std::uint64_t{forward} + std::uint64_t{sp_.model.is_moe_layer(layer)},
                       ops);
  }

  // A chunk's forward and backward (MeshImpl::forward and backward): the sequence pieces.
  void forward(int mb, int chunk) {
    struct Parts {
      SkeletonRun& r;
      void forward(const ChunkStep& step, int /*sequence*/) {
        if (step.part == ChunkStep::Part::embed) r.seq_->embed_forward();
        if (step.part == ChunkStep::Part::layer) r.block(step.layer, true);
        if (step.part == ChunkStep::Part::head) r.seq_->head_forward();
      }
      void walked() {}
    };
    forward_chunk(mb, chunk, Parts{*this});
  }
  void backward(int mb, int chunk) {
    struct Parts {
      SkeletonRun& r;
      void recompute(const ChunkStep& step, int /*sequence*/) { r.block(step.layer, true); }
      void backward(const ChunkStep& step, int /*sequence*/) {
        if (step.part == ChunkStep::Part::head) r.seq_->head_backward();
        if (step.part == ChunkStep::Part::layer) r.block(step.layer, false);
        if (step.part == ChunkStep::Part::embed) r.seq_->embed_backward();
      }
      void walked() {}
    };
    backward_chunk(mb, chunk, Parts{*this});
  }

  // Elements of the picked parameters among those in scope (reduced at the step's end, or one
  // class's): the same for every microbatch, so counted once per run.
  int64_t numel_where(parallel::mesh_detail::ParamPick pick, GradScope scope) {
    const auto [it, fresh] = counts_.try_emplace({pick, scope.cls}, 0);
    if (!fresh) return it->second;
    int64_t n = 0;
    const auto add = [&](std::size_t i) {
      if (units_->deferred(i) == scope.deferred() && pick(specs_[i]))
        n += ref::numel_of(specs_[i].local_shape);
    };
    if (!scope.deferred())
      for (const std::size_t i : classes_[scope.cls].specs) add(i);
    else
      for (std::size_t i = 0; i < specs_.size(); ++i) add(i);
    return it->second = n;
  }

  // mesh_detail::all_reduce_picked on the scope's gradients: the picked parameters' summed over
  // g in one all_reduce (none when g is null or of one rank, or nothing is picked). The sums of
  // replica_sums, no_shard_sums and microbatch_presums.
  struct PickedSums {
    SkeletonRun& r;
    GradScope scope;
    void part(int /*k*/) {}
    void sum(comm::Communicator* g, parallel::mesh_detail::ParamPick pick) {
      if (g == nullptr || g->size() == 1) return;
      const int64_t n = r.numel_where(pick, scope);
      if (n > 0) g->all_reduce(null_buf(count_of(n), r.numeric()))->wait();
    }
    void round(bool /*expert*/) {}
  };
  PickedSums replica_ops(GradScope scope) { return {*this, scope}; }
  PickedSums microbatch_sum_ops() { return {*this, GradScope{}}; }
  // round_microbatch_gradient's sums (none under the "local" what-if).
  void round_microbatch(GradScope scope) {
    if (!sp_.microbatch_presums) return;
    parallel::mesh_detail::microbatch_presums(cp_, kv_, sp() ? tp_ : nullptr, parts_, expert_parts_,
                                              PickedSums{*this, scope});
  }
  void accumulate_microbatch() {}
  void completed(int /*mb*/, const ChunkStep& /*step*/) {}

  // The optimizer's per-microbatch reductions (UnitReducer's Units) on null buffers.
  struct NullUnits {
    using Pending = ClassComm::UnitReduce;
    SkeletonRun* run = nullptr;
    Pending issue(std::size_t ci) { return run->comm_.issue_unit(run->classes_, run->null_, ci); }
    void complete(Pending& r) { run->comm_.complete_unit(run->classes_, run->null_, r); }
    void reduce_each_microbatch(std::vector<bool> classes) {
      run->comm_.reduce_each_microbatch(std::move(classes));
    }
  };
  using Units = parallel::mesh_detail::UnitReducer<NullUnits>;
  Units& units() { return *units_; }

  // MeshImpl::issue_bucket: the picked gradients join the open bucket (mesh_buckets.hpp).
  template <class Pick>
  void issue_bucket(const Pick& pick, bool flush) {
    if (const std::vector<std::size_t> bucket = buckets_.add(specs_, pick, flush); !bucket.empty())
      comm_.issue(classes_, null_, bucket);  // MeshOptimizer::issue_reduce
  }

  // MeshOptimizer::reduce.
  void reduce() { comm_.reduce(classes_, null_); }

  sim::SymmetricClock* memo_;
  const Skeleton& k_;
  const SkeletonSpec& sp_;
  comm::Communicator& world_;
  comm::Communicator* data_;   // the data-parallel ranks (the loss denominators)
  comm::Communicator* group_;  // the dense classes' sharding (and summing) group
  std::optional<parallel::mesh_detail::MeshGroupSet> groups_;
  // The groups of more than one rank (else null): tp, pp, cp; the TP ranks sharing a replicated
  // kv head; the bf16 recipe's expert-parts group (mesh_bf16.hpp) and how many parts it keeps
  // (0: whole).
  comm::Communicator *tp_ = nullptr, *pp_ = nullptr, *cp_ = nullptr;
  comm::Communicator *kv_ = nullptr, *parts_ = nullptr;
  int expert_parts_ = 0;
  int stage_ = 0;
  int step_ = 0;
  parallel::StagePlan plan_;
  std::shared_ptr<const std::vector<LocalParam>> params_;  // this rank's parameters
  const std::vector<LocalParam>& specs_ = *params_;
  std::vector<FlatClass> flat_;                  // the rank's flat buffers
  std::vector<parallel::ShardedClass> classes_;  // the same in their groups (run())
  std::unique_ptr<Residency> residency_;
  std::vector<parallel::PipeEvent> events_;    // the pipeline schedule's, on this stage
  std::optional<SequenceOps> seq_;             // one sequence's sublayers on this rank
  parallel::mesh_detail::BucketFill buckets_;  // DDP overlap
  // The optimizer's collectives (mesh_class_comm.hpp) on null buffers.
  parallel::NullClassData null_{.grad = sp_.grad_dtype, .param = sp_.param_dtype};
  ClassComm comm_{&specs_, {.zero = k_.rules_.zero, .sum = {}, .planted = {}}};
  std::optional<Units> units_;  // ZeRO-3's per-microbatch reductions
  // numel_where's counts by (pick, scope)
  std::map<std::pair<parallel::mesh_detail::ParamPick, std::size_t>, int64_t> counts_;
};

void Skeleton::run(comm::Communicator& dp) const {
  SkeletonRun(*this, dp).run();
}

void Skeleton::run_replaying(sim::SymmetricClock& clock) const {
  SkeletonRun(*this, clock, &clock).run();
}

}  // namespace shardcheck::harness

// mesh_timing.hpp: the timing-only backend of the engine's step order (mesh_step.hpp), and the
// shapes its runs share.
#include "parallel/mp/mesh_timing.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "parallel/flat.hpp"
#include "parallel/mp/mesh_bf16.hpp"
#include "parallel/mp/mesh_buckets.hpp"
#include "parallel/mp/mesh_class_comm.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/mesh_residency.hpp"
#include "parallel/mp/mesh_rows.hpp"
#include "parallel/mp/mesh_sequence_ops.hpp"
#include "parallel/mp/mesh_step.hpp"
#include "parallel/mp/mesh_unit_reducer.hpp"
#include "parallel/mp/pipeline.hpp"
#include "parallel/step.hpp"

namespace shardcheck::parallel {

namespace {

comm::Buffer null_buf(std::size_t count, comm::DType t) {
  return comm::Buffer{nullptr, count, t, {}};
}
std::size_t count_of(int64_t n) {
  return static_cast<std::size_t>(n);
}

// One rank's run: the timing-only backend of the step order, with the engine's step state
// (residency, buckets, reductions in flight) and no data.
class TimingRun : mesh_detail::StepOrder<TimingRun> {
  using NullComm = ClassComm<NullClassData>;
  using Order = mesh_detail::StepOrder<TimingRun>;
  using ChunkStep = mesh_detail::ChunkStep;
  using GradScope = mesh_detail::GradScope;
  friend Order;

 public:
  // memo: each kind of block through it (null: every block run).
  TimingRun(const MeshTiming& k, comm::Communicator& world, const BlockMemo* memo)
      : memo_(memo),
        k_(k),
        sp_(k.spec()),
        world_(world),
        data_(&world),
        group_(&world),
        params_(shared_local_params(k.spec().model, k.mesh(), world.world_rank(),
                                    k.spec().mesh.virtual_stages)) {
    const ref::ModelConfig& m = sp_.model;
    const int v = sp_.mesh.virtual_stages;
    stage_ = k_.mesh().coord(world.world_rank(), comm::Axis::pp);
    plan_ = stage_plan(m, pp(), v, stage_);
    buckets_ = mesh_detail::BucketFill({.tied_across_stages = m.tie_embeddings && pp() > 1,
                                        .sequence_parallel = sp(),
                                        .bucket_elems = sp_.mesh.bucket_elems});
    flat_ = flat_classes(specs_, k_.rules().zero,
                         [&](const LocalParam& p) { return k_.wrap_of().at(p.unit); });
    // ZeRO-3's buffers reduced every microbatch and when (mesh_unit_reducer.hpp).
    units_.emplace(Units::Setup{.model = &m,
                                .wrap_of = &k_.wrap_of(),
                                .plan = &plan_,
                                .pp = pp(),
                                .virtual_stages = v,
                                .stage = stage_,
                                .zero = k_.rules().zero,
                                .bytes_per_elem = 0,  // timing only
                                .planted = testing::Mutation::kNone,
                                .classes = &flat_},
                   specs_, NullUnits{this}, world.memory());
  }

  void run() {
    const int r = world_.rank();
    // The engine's groups, split as it splits them (mesh_groups.hpp); those of one rank unused.
    using G = mesh_detail::Group;
    groups_.emplace(world_, k_.mesh(), k_.group_splits());
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
      expert_parts_ = mesh_detail::expert_part_count(k_.mesh(), r);
    seq_.emplace(SequenceOps::Setup{.model = &sp_.model,
                                    .layout = &k_.layout(),
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
    classes_ =
        shard_classes(flat_, k_.rules().zero,
                      {.dense = group_,
                       .expert = expert_shard != nullptr ? expert_shard : groups_->get(G::expert),
                       .dense_replicas = groups_->get(G::dense_replicas),
                       .expert_replicas = groups_->get(G::expert_replicas)});
    if (k_.rules().zero == 3)
      residency_ = std::make_unique<Residency>(
          Gathers{this}, world_.memory(), sp_.recipe.param,
          Residency::Options{.prefetch = k_.rules().fsdp.prefetch,
                             .keep_after_forward = k_.rules().keep_after_forward});
    set_order({.model = &sp_.model,
               .wrap_of = &k_.wrap_of(),
               .plan = &plan_,
               .pp = pp(),
               .virtual_stages = sp_.mesh.virtual_stages,
               .stage = stage_,
               .micro_batch = sp_.train.micro_batch,
               .precision = sp_.train.precision,
               .recompute = sp_.train.recompute,
               .no_shard = k_.rules().no_shard,
               .ddp_overlap = k_.rules().ddp_overlap,
               .sp_tp = sp() ? tp_ : nullptr,
               .kv = kv_,
               .dense = groups_->get(G::dense),
               .expert = groups_->get(G::expert)});
    microbatches_ = sp_.local_batch / sp_.train.micro_batch;
    events_ =
        pipeline_events(sp_.mesh.schedule, pp(), stage_, microbatches_, sp_.mesh.virtual_stages);
    for (step_ = 1; step_ <= sp_.steps; ++step_) run_step();
  }

 private:
  // The optimizer's unit gathers (MeshOptimizer::issue_gather / complete_gather: ClassComm's).
  struct Gathers {
    using Pending = NullComm::Gather;
    TimingRun* run = nullptr;
    Pending issue(int u) { return run->comm_.issue_gather(run->classes_, run->null_, u); }
    void complete(Pending& p) { run->comm_.complete_gather(run->classes_, run->null_, p); }
    void release(int /*u*/) {}
    int64_t elems(int u) const { return NullComm::unit_elems(run->classes_, u); }
  };
  using Residency = mesh_detail::Residency<Gathers>;

  // The step's phases (MeshImpl's count, pipeline, reduced, sum, update) without data.
  void count() {
    world_.begin_step(step_);
    global_counts(*data_, {});
    buckets_.clear(specs_.size());
  }
  // The engine's executor (run_pipeline) with null buffers.
  void pipeline() {
    const NullPipeStage stage{.forward = [this](int mb, int chunk) { forward(mb, chunk); },
                              .backward = [this](int mb, int chunk) { backward(mb, chunk); },
                              .activation_shape =
                                  [this](int, int) {
                                    return mesh_detail::chunk_activation_shape(
                                        sp_.model, k_.layout(), sp_.train.micro_batch);
                                  },
                              .dtype = activation()};
    run_pipeline(*groups_->get(mesh_detail::Group::pp), events_, stage);
  }
  void reduced() {}
  void sum() {
    global_sums(world_, {});
    if (sp_.mesh.health.check) agree_health(world_, false);
  }
  // MeshOptimizer::update's collectives and report, without the AdamW arithmetic.
  void update() {
    comm_.update(
        classes_, null_, [](const ShardedClass&) {}, world_, sp_.recipe);
  }
  Residency* residency() { return residency_.get(); }

  comm::DType numeric() const { return sp_.grad_dtype; }
  // What activations and their gradients move in: the engine's numeric type.
  comm::DType activation() const { return numeric_dtype(sp_.train.precision); }
  bool sp() const { return sp_.mesh.sequence_parallel && sp_.tp > 1; }

  int pp() const { return k_.mesh().size(comm::Axis::pp); }
  // MeshImpl::sync_tied_embedding.
  void sync_tied_embedding() {
    const int other = mesh_detail::tied_embedding_peer(sp_.model, plan_, pp());
    if (other < 0) return;
    std::size_t n = 0;
    for (const LocalParam& p : specs_)
      if (p.name == "embed.weight") n = count_of(ref::numel_of(p.local_shape));
    mesh_detail::exchange_tied_embedding(*pp_, other, null_buf(n, numeric()),
                                         null_buf(n, numeric()));
  }

  // One sequence's block of this layer, through the memo when there is one.
  void block(int layer, bool forward) {
    // Captured by value: small enough for std::function to hold without allocating.
    const auto ops = [this, layer, forward] {
      forward ? seq_->block_forward(layer) : seq_->block_backward(layer);
    };
    if (memo_ == nullptr) return ops();
    (*memo_)(2 * std::uint64_t{forward} + std::uint64_t{sp_.model.is_moe_layer(layer)}, ops);
  }

  // A chunk's forward and backward (MeshImpl::forward and backward): the sequence pieces.
  void forward(int mb, int chunk) {
    struct Parts {
      TimingRun& r;
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
      TimingRun& r;
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
  int64_t numel_where(mesh_detail::ParamPick pick, GradScope scope) {
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
    TimingRun& r;
    GradScope scope;
    void part(int /*k*/) {}
    void sum(comm::Communicator* g, mesh_detail::ParamPick pick) {
      if (g == nullptr || g->size() == 1) return;
      const int64_t n = r.numel_where(pick, scope);
      if (n > 0) g->all_reduce(null_buf(count_of(n), r.numeric()))->wait();
    }
    void round(bool /*expert*/) {}
  };
  PickedSums replica_ops(GradScope scope) { return {*this, scope}; }
  PickedSums microbatch_sum_ops() { return {*this, GradScope{}}; }
  // round_microbatch_gradient's sums (none when the spec leaves them out: a what-if).
  void round_microbatch(GradScope scope) {
    if (!sp_.microbatch_presums) return;
    mesh_detail::microbatch_presums(cp_, kv_, sp() ? tp_ : nullptr, parts_, expert_parts_,
                                    PickedSums{*this, scope});
  }
  void accumulate_microbatch() {}
  void completed(int /*mb*/, const ChunkStep& /*step*/) {}

  // The optimizer's per-microbatch reductions (UnitReducer's Units) on null buffers.
  struct NullUnits {
    using Pending = NullComm::UnitReduce;
    TimingRun* run = nullptr;
    Pending issue(std::size_t ci) { return run->comm_.issue_unit(run->classes_, run->null_, ci); }
    void complete(Pending& r) { run->comm_.complete_unit(run->classes_, run->null_, r); }
    void reduce_each_microbatch(std::vector<bool> classes) {
      run->comm_.reduce_each_microbatch(std::move(classes));
    }
  };
  using Units = mesh_detail::UnitReducer<NullUnits>;
  Units& units() { return *units_; }

  // MeshImpl::issue_bucket: the picked gradients join the open bucket (mesh_buckets.hpp).
  template <class Pick>
  void issue_bucket(const Pick& pick, bool flush) {
    if (const std::vector<std::size_t> bucket = buckets_.add(specs_, pick, flush); !bucket.empty())
      comm_.issue(classes_, null_, bucket);  // MeshOptimizer::issue_reduce
  }

  // MeshOptimizer::reduce.
  void reduce() { comm_.reduce(classes_, null_); }

  const BlockMemo* memo_;
  const MeshTiming& k_;
  const TimingSpec& sp_;
  comm::Communicator& world_;
  comm::Communicator* data_;   // the data-parallel ranks (the loss denominators)
  comm::Communicator* group_;  // the dense classes' sharding (and summing) group
  std::optional<mesh_detail::MeshGroupSet> groups_;
  // The groups of more than one rank (else null): tp, pp, cp; the TP ranks sharing a replicated
  // kv head; the bf16 recipe's expert-parts group (mesh_bf16.hpp) and how many parts it keeps
  // (0: whole).
  comm::Communicator *tp_ = nullptr, *pp_ = nullptr, *cp_ = nullptr;
  comm::Communicator *kv_ = nullptr, *parts_ = nullptr;
  int expert_parts_ = 0;
  int stage_ = 0;
  int step_ = 0;
  StagePlan plan_;
  std::shared_ptr<const std::vector<LocalParam>> params_;  // this rank's parameters
  const std::vector<LocalParam>& specs_ = *params_;
  std::vector<FlatClass> flat_;        // the rank's flat buffers
  std::vector<ShardedClass> classes_;  // the same in their groups (run())
  std::unique_ptr<Residency> residency_;
  std::vector<PipeEvent> events_;    // the pipeline schedule's, on this stage
  std::optional<SequenceOps> seq_;   // one sequence's sublayers on this rank
  mesh_detail::BucketFill buckets_;  // DDP overlap
  // The optimizer's collectives (mesh_class_comm.hpp) on null buffers.
  NullClassData null_{.grad = sp_.grad_dtype, .param = sp_.param_dtype};
  NullComm comm_{&specs_, {.zero = k_.rules().zero, .sum = {}, .planted = {}}};
  std::optional<Units> units_;  // ZeRO-3's per-microbatch reductions
  // numel_where's counts by (pick, scope)
  std::map<std::pair<mesh_detail::ParamPick, std::size_t>, int64_t> counts_;
};

}  // namespace

MeshTiming::MeshTiming(TimingSpec spec) : spec_(std::move(spec)) {
  const MeshOptions& o = spec_.mesh;
  const ref::ModelConfig& m = spec_.model;
  rules_ = data_parallel_rules(o);
  wrap_of_ = mesh_detail::wrap_map(m, rules_.fsdp);
  comm::MeshShape shape = o.shape;
  shape.dp = spec_.dp;
  shape.tp = spec_.tp;
  mesh_ = comm::DeviceMesh(shape, o.order);
  layout_ = TokenLayout(m.seq_len, shape.cp, shape.tp, o.sequence_parallel);
  MeshOptions on_mesh = o;
  on_mesh.shape = shape;
  group_splits_ = mesh_detail::group_splits(mesh_, m, spec_.train.precision, on_mesh);
}

void MeshTiming::run(comm::Communicator& world, const BlockMemo* memo) const {
  TimingRun(*this, world, memo).run();
}

}  // namespace shardcheck::parallel

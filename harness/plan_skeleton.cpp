// The step skeleton of plan_skeleton.hpp: MeshImpl::step (parallel/mp/mesh_engine.cpp) on a
// dp x tp x pp x cp mesh, call for call, without data. Each part names the engine function it
// follows; the conformance test (tests/harness/conformance_test.cpp) compares the two op logs.
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
#include "parallel/mp/mesh_unit_reducer.hpp"
#include "parallel/mp/mesh_walk.hpp"
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

// One rank's execution of the skeleton: the engine's step state (residency, buckets, issued
// reductions) without any data.
class SkeletonRun {
  using ClassComm = parallel::ClassComm<parallel::NullClassData>;

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
    ep_ = used(G::ep);
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
    microbatches_ = sp_.local_batch / sp_.train.micro_batch;
    chunk_steps_.resize(static_cast<std::size_t>(2 * sp_.mesh.virtual_stages));
    const std::vector<parallel::PipeEvent> events = parallel::pipeline_events(
        sp_.mesh.schedule, pp(), stage_, microbatches_, sp_.mesh.virtual_stages);
    const parallel::NullPipeStage stage{
        .forward = [this](int mb, int chunk) { forward(mb, chunk); },
        .backward = [this](int mb, int chunk) { backward(mb, chunk); },
        .activation_shape =
            [this](int, int) {
              return parallel::mesh_detail::chunk_activation_shape(sp_.model, k_.layout_,
                                                                   sp_.train.micro_batch);
            },
        .dtype = activation()};
    for (int step = 1; step <= sp_.steps; ++step) {
      // MeshImpl::step: 1. the loss denominators.
      world_.begin_step(step);
      parallel::global_counts(*data_, {});
      buckets_.clear(specs_.size());
      // 2. the pipeline: the engine's executor (run_pipeline) with null buffers.
      parallel::run_pipeline(*groups_->get(G::pp), events, stage);
      // 3. gradient sums (sync_gradients): the tied embedding between the first and last stage,
      // SP's TP-replicated parameters over TP, then the optimizer's.
      sync_tied_embedding();
      parallel::mesh_detail::replica_sums(sp() ? tp_ : nullptr, kv_,
                                          PickedSums{*this, true, nullptr});
      if (!k_.rules_.no_shard) reduce();
      // 4. norm and numerators, the health check.
      parallel::global_sums(world_, {});
      if (sp_.mesh.health.check) parallel::agree_health(world_, false);
      // 5. the update (MeshOptimizer::update).
      update();
    }
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

  const LocalParam& spec(std::size_t i) const { return specs_[i]; }
  comm::DType numeric() const { return sp_.grad_dtype; }
  // What activations and their gradients move in: the engine's numeric type.
  comm::DType activation() const { return numeric_dtype(sp_.train.precision); }
  bool sp() const { return sp_.mesh.sequence_parallel && sp_.tp > 1; }

  int cp() const { return k_.mesh_.size(comm::Axis::cp); }

  int pp() const { return k_.mesh_.size(comm::Axis::pp); }
  int virtual_stage(int chunk) const { return chunk * pp() + stage_; }
  int last_virtual_stage() const { return pp() * sp_.mesh.virtual_stages - 1; }
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

  // The steps of a chunk's forward or backward (mesh_walk.hpp) and the units they use: the same
  // for every microbatch, so built once per chunk and direction.
  struct Steps {
    std::vector<parallel::mesh_detail::ChunkStep> steps;
    std::vector<std::vector<int>> uses;
  };
  const Steps& chunk_steps(int chunk, bool forward) {
    std::optional<Steps>& s = chunk_steps_[static_cast<std::size_t>(2 * chunk + forward)];
    if (!s) {
      const int vs = virtual_stage(chunk);
      s.emplace();
      s->steps = parallel::mesh_detail::chunk_steps(
          sp_.model, k_.wrap_of_, plan_.chunk_layers[static_cast<std::size_t>(chunk)], vs == 0,
          vs == last_virtual_stage(), plan_.has_embed, forward);
      s->uses = parallel::mesh_detail::step_uses(s->steps);
    }
    return *s;
  }
  // MeshImpl::begin_uses / use / end_uses.
  void begin_uses(int mb, int chunk, bool forward, const Steps& s) {
    if (residency_) residency_->begin(mb, chunk, forward, s.uses);
  }
  void use() {
    if (residency_) residency_->next();
  }
  void end_uses() {
    if (residency_) residency_->end();
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

  // MeshImpl::forward.
  void forward(int mb, int chunk) {
    using Part = parallel::mesh_detail::ChunkStep::Part;
    const Steps& s = chunk_steps(chunk, true);
    begin_uses(mb, chunk, true, s);
    struct Walk {
      SkeletonRun& r;
      void use() { r.use(); }
      void forward(const parallel::mesh_detail::ChunkStep& step, int /*sequence*/) {
        if (step.part == Part::embed) r.seq_->embed_forward();
        if (step.part == Part::layer) r.block(step.layer, true);
        if (step.part == Part::head) r.seq_->head_forward();
      }
    };
    parallel::mesh_detail::walk_forward(s.steps, sp_.train.micro_batch, Walk{*this});
    end_uses();
  }

  bool chunk_writes(int chunk, const LocalParam& p) const {
    return parallel::chunk_writes(sp_.model, plan_, chunk, virtual_stage(chunk),
                                  last_virtual_stage(), p);
  }

  // MeshImpl::backward.
  void backward(int mb, int chunk) {
    using Part = parallel::mesh_detail::ChunkStep::Part;
    const bool last = mb == microbatches_ - 1;
    const bool bf16 = sp_.train.precision == ref::Precision::kBf16;
    const Steps& s = chunk_steps(chunk, false);
    begin_uses(mb, chunk, false, s);
    struct Walk {
      SkeletonRun& r;
      int chunk;
      bool bucket;  // DDP overlap, f64/f32, the last microbatch: buckets issued as they fill
      void use() { r.use(); }
      void begin(std::size_t step) { r.units_->begin(chunk, step); }
      void recompute(const parallel::mesh_detail::ChunkStep& step, int /*sequence*/) {
        r.block(step.layer, true);
      }
      void backward(const parallel::mesh_detail::ChunkStep& step, int /*sequence*/) {
        if (step.part == Part::head) r.seq_->head_backward();
        if (step.part == Part::layer) r.block(step.layer, false);
        if (step.part == Part::embed) r.seq_->embed_backward();
      }
      void complete(const parallel::mesh_detail::ChunkStep& step, std::size_t k) {
        if (bucket) r.issue_bucket([&](const LocalParam& p) { return step.completes(p); }, false);
        r.unit_ready(chunk, k);
      }
    };
    parallel::mesh_detail::walk_backward(s.steps, sp_.train.micro_batch,
                                         sp_.train.recompute == ref::Recompute::kFull,
                                         Walk{*this, chunk, !bf16 && ddp_overlap() && last});
    end_uses();
    units_->finish();
    if (bf16) round_presums(true);
    if (k_.rules_.no_shard)  // each microbatch's gradient summed (MeshImpl::backward)
      parallel::mesh_detail::no_shard_sums(groups_->get(parallel::mesh_detail::Group::dense),
                                           groups_->get(parallel::mesh_detail::Group::expert),
                                           PickedSums{*this, true, nullptr});
    if (ddp_overlap() && last)
      issue_bucket([&](const LocalParam& p) { return chunk_writes(chunk, p); }, true);
  }

  bool ddp_overlap() const { return k_.rules_.ddp_overlap; }

  // Elements of the picked parameters among those reduced at the step's end (deferred) or not
  // (`only`: one class's): the same for every microbatch, so counted once per run.
  int64_t numel_where(parallel::mesh_detail::ParamPick pick, bool deferred,
                      const std::vector<std::size_t>* only) {
    const auto [it, fresh] = counts_.try_emplace({pick, deferred, only}, 0);
    if (!fresh) return it->second;
    int64_t n = 0;
    const auto add = [&](std::size_t i) {
      if (units_->deferred(i) == deferred && pick(spec(i))) n += ref::numel_of(spec(i).local_shape);
    };
    if (only != nullptr)
      for (const std::size_t i : *only) add(i);
    else
      for (std::size_t i = 0; i < specs_.size(); ++i) add(i);
    return it->second = n;
  }

  // mesh_detail::all_reduce_picked: the picked parameters' gradients (reduced at the step's end,
  // deferred, or not; `only`: one class's) summed over g in one all_reduce (none when g is null
  // or of one rank, or nothing is picked).
  void sum_picked(comm::Communicator* g, parallel::mesh_detail::ParamPick pick, bool deferred,
                  const std::vector<std::size_t>* only) {
    if (g == nullptr || g->size() == 1) return;
    const int64_t n = numel_where(pick, deferred, only);
    if (n > 0) g->all_reduce(null_buf(count_of(n), numeric()))->wait();
  }

  // The sums of mesh_rows.hpp's replica_sums and mesh_bf16.hpp's microbatch_presums over some
  // parameters (`only`: one class's; else those reduced at the step's end, or not: deferred).
  struct PickedSums {
    SkeletonRun& r;
    bool deferred;
    const std::vector<std::size_t>* only;
    void part(int /*k*/) {}
    void sum(comm::Communicator* g, parallel::mesh_detail::ParamPick pick) {
      r.sum_picked(g, pick, deferred, only);
    }
    void round(bool /*expert*/) {}
  };
  // round_microbatch_gradient's sums (none under the "local" what-if).
  void round_presums(bool deferred, const std::vector<std::size_t>* only = nullptr) {
    if (!sp_.microbatch_presums) return;
    parallel::mesh_detail::microbatch_presums(cp_, kv_, sp() ? tp_ : nullptr, parts_, expert_parts_,
                                              PickedSums{*this, deferred, only});
  }

  // MeshImpl::unit_ready: each buffer the step completes is rounded (bf16) and its
  // TP-replicated parameters summed over TP (SP) before its reduce_scatter.
  void unit_ready(int chunk, std::size_t step) {
    units_->ready(chunk, step, [&](std::size_t ci) {
      const std::vector<std::size_t>& only = classes_[ci].specs;
      if (sp_.train.precision == ref::Precision::kBf16) round_presums(false, &only);
      parallel::mesh_detail::replica_sums(sp() ? tp_ : nullptr, kv_,
                                          PickedSums{*this, false, &only});
    });
  }
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

  // MeshImpl::issue_bucket: the picked gradients join the open bucket (mesh_buckets.hpp).
  template <class Pick>
  void issue_bucket(const Pick& pick, bool flush) {
    if (const std::vector<std::size_t> bucket = buckets_.add(specs_, pick, flush); !bucket.empty())
      comm_.issue(classes_, null_, bucket);  // MeshOptimizer::issue_reduce
  }

  // MeshOptimizer::reduce.
  void reduce() { comm_.reduce(classes_, null_); }

  // MeshOptimizer::update's collectives and report, without the AdamW arithmetic.
  void update() {
    comm_.update(
        classes_, null_, [](const parallel::ShardedClass&) {}, world_, sp_.recipe);
  }

  sim::SymmetricClock* memo_;
  const Skeleton& k_;
  const SkeletonSpec& sp_;
  comm::Communicator& world_;
  comm::Communicator* data_;   // the data-parallel ranks (the loss denominators)
  comm::Communicator* group_;  // the dense classes' sharding (and summing) group
  std::optional<parallel::mesh_detail::MeshGroupSet> groups_;
  // The groups of more than one rank (else null): tp, pp, cp, ep; the TP ranks sharing a
  // replicated kv head; the bf16 recipe's expert-parts group (mesh_bf16.hpp) and how many parts it
  // keeps (0: whole).
  comm::Communicator *tp_ = nullptr, *pp_ = nullptr, *cp_ = nullptr, *ep_ = nullptr;
  comm::Communicator *kv_ = nullptr, *parts_ = nullptr;
  int expert_parts_ = 0;
  int stage_ = 0;
  parallel::StagePlan plan_;
  std::shared_ptr<const std::vector<LocalParam>> params_;  // this rank's parameters
  const std::vector<LocalParam>& specs_ = *params_;
  std::vector<FlatClass> flat_;                  // the rank's flat buffers
  std::vector<parallel::ShardedClass> classes_;  // the same in their groups (run())
  std::unique_ptr<Residency> residency_;
  std::vector<std::optional<Steps>> chunk_steps_;  // per chunk: backward, forward
  std::optional<SequenceOps> seq_;                 // one sequence's sublayers on this rank
  int microbatches_ = 1;
  parallel::mesh_detail::BucketFill buckets_;  // DDP overlap
  // The optimizer's collectives (mesh_class_comm.hpp) on null buffers.
  parallel::NullClassData null_{.grad = sp_.grad_dtype, .param = sp_.param_dtype};
  ClassComm comm_{&specs_, {.zero = k_.rules_.zero, .sum = {}, .planted = {}}};
  std::optional<Units> units_;  // ZeRO-3's per-microbatch reductions
  // numel_where's counts by (pick, deferred, class's specs or null)
  std::map<std::tuple<parallel::mesh_detail::ParamPick, bool, const std::vector<std::size_t>*>,
           int64_t>
      counts_;
};

void Skeleton::run(comm::Communicator& dp) const {
  SkeletonRun(*this, dp).run();
}

void Skeleton::run_replaying(sim::SymmetricClock& clock) const {
  SkeletonRun(*this, clock, &clock).run();
}

}  // namespace shardcheck::harness

// The step skeleton of plan_skeleton.hpp: MeshImpl::step (parallel/mp/mesh_engine.cpp) on a mesh
// of dp ranks, call for call, without data. Each part names the engine function it follows; the
// conformance test (tests/harness/conformance_test.cpp) compares the two op logs.
#include "harness/plan_skeleton.hpp"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "harness/driver.hpp"
#include "parallel/costs.hpp"
#include "parallel/flops.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/mp/mesh_residency.hpp"
#include "parallel/mp/pipeline.hpp"

namespace shardcheck::harness {

namespace {

namespace costs = parallel::costs;
using parallel::FlatClass;
using parallel::LocalParam;

comm::DType numeric_dtype(ref::Precision p) {
  return p == ref::Precision::kF64 ? comm::DType::f64 : comm::DType::f32;
}

comm::Buffer null_buf(std::size_t count, comm::DType t) {
  return comm::Buffer{nullptr, count, t, {}};
}

std::size_t count_of(int64_t n) {
  return static_cast<std::size_t>(n);
}

}  // namespace

SkeletonSpec skeleton_spec(const Scenario& s, const ParallelSpec& p, int dp, int global_batch,
                           const comm::DType* reduce_dtype) {
  ParallelSpec q = p;
  q.mesh.dp = dp;
  SkeletonSpec k;
  k.model = s.model;
  k.train = s.train;
  k.mesh = engine_options(s, q);
  k.recipe = parallel::recipe_of(s.train.precision);
  k.param_dtype = s.train.precision == ref::Precision::kBf16 ? comm::DType::bf16
                                                             : numeric_dtype(s.train.precision);
  k.grad_dtype = reduce_dtype ? *reduce_dtype : numeric_dtype(s.train.precision);
  k.dp = dp;
  if (global_batch % dp != 0 || (global_batch / dp) % s.train.micro_batch != 0 ||
      global_batch / dp == 0)
    throw ScenarioError("$.train.global_batch", "global batch " + std::to_string(global_batch) +
                                                    " does not split into " + std::to_string(dp) +
                                                    " ranks x whole microbatches of " +
                                                    std::to_string(s.train.micro_batch));
  k.local_batch = global_batch / dp;
  return k;
}

Skeleton::Skeleton(SkeletonSpec spec) : spec_(std::move(spec)) {
  const parallel::MeshOptions& o = spec_.mesh;
  const ref::ModelConfig& m = spec_.model;
  const parallel::FsdpOptions f = o.fsdp.value_or(parallel::FsdpOptions{.prefetch = 0});
  no_shard_ = o.fsdp && f.sharding == parallel::ShardingStrategy::no_shard;
  zero_ = o.fsdp && !no_shard_ ? 3 : o.zero;
  shard_size_ = spec_.dp;
  if (o.fsdp && f.sharding == parallel::ShardingStrategy::hybrid_shard) {
    if (f.shard_group_size < 1 || spec_.dp % f.shard_group_size != 0)
      throw ScenarioError("$.parallel.fsdp.shard_group_size", std::to_string(f.shard_group_size) +
                                                                  " does not divide the DP size " +
                                                                  std::to_string(spec_.dp));
    shard_size_ = f.shard_group_size;
  }
  elem_ = spec_.train.precision == ref::Precision::kF64 ? 8 : 4;
  wrap_of_ = parallel::mesh_detail::wrap_map(m, f);
  comm::MeshShape shape = o.shape;
  shape.dp = spec_.dp;
  specs_ = parallel::local_params(m, comm::DeviceMesh(shape, o.order), 0, 1);
  classes_ = parallel::flat_classes(specs_, zero_, [&](const LocalParam& p) {
    return wrap_of_.at(parallel::unit_of(m, p.name));
  });
}

std::vector<SplitRule> Skeleton::splits() const {
  if (shard_size_ == spec_.dp) return {};
  const int s = shard_size_;
  return {SplitRule{[s](int r) { return r / s; }, [](int r) { return r; }},
          SplitRule{[s](int r) { return r % s; }, [](int r) { return r; }}};
}

double Skeleton::model_flops_per_step() const {
  return 3.0 * parallel::model_forward_flops(spec_.model, spec_.model.seq_len) *
         static_cast<double>(spec_.local_batch) * spec_.dp;
}

double Skeleton::hardware_flops_per_step() const {
  double recompute = 0;
  for (int i = 0; i < spec_.model.layers; ++i) {
    if (spec_.train.recompute == ref::Recompute::kFull)
      recompute += parallel::block_forward_flops(spec_.model, i, spec_.model.seq_len);
    if (spec_.train.recompute == ref::Recompute::kSelective)
      recompute += parallel::attention_core_flops(spec_.model, spec_.model.seq_len);
  }
  return model_flops_per_step() + recompute * static_cast<double>(spec_.local_batch) * spec_.dp;
}

// One rank's execution of the skeleton: the engine's step state (residency, buckets, issued
// reductions) without any data.
class SkeletonRun {
 public:
  SkeletonRun(const Skeleton& k, comm::Communicator& world)
      : k_(k), sp_(k.spec_), world_(world), group_(&world) {}

  void run() {
    if (!k_.splits().empty()) {  // mesh_rows.hpp's hybrid_split over the data-parallel ranks
      const int s = k_.shard_size_, r = world_.rank();
      shard_ = world_.split(r / s, r, {.name = "dp-cp-shard"});
      replicas_ = world_.split(r % s, r, {.name = "dp-cp-replicas"});
      group_ = shard_.get();
    }
    const parallel::FsdpOptions f = sp_.mesh.fsdp.value_or(parallel::FsdpOptions{.prefetch = 0});
    if (k_.zero_ == 3) {
      const bool keep =
          f.sharding == parallel::ShardingStrategy::shard_grad_op || !f.reshard_after_forward;
      residency_ = std::make_unique<Residency>(
          Gathers{this}, world_.memory(), sp_.recipe.param,
          Residency::Options{.prefetch = f.prefetch, .keep_after_forward = keep});
    }
    microbatches_ = sp_.local_batch / sp_.train.micro_batch;
    const std::vector<parallel::PipeAction> schedule =
        parallel::pipeline_schedule(sp_.mesh.schedule, 1, 0, microbatches_, 1);
    for (int step = 1; step <= sp_.steps; ++step) {
      // MeshImpl::step: 1. the loss denominators.
      world_.begin_step(step);
      world_.all_reduce(null_buf(3, comm::DType::i64))->wait();
      bucketed_.clear();
      issued_spec_.assign(k_.specs_.size(), false);
      // 2. the pipeline.
      for (const parallel::PipeAction& a : schedule)
        a.kind == parallel::PipeAction::Kind::forward ? forward(a.microbatch)
                                                      : backward(a.microbatch);
      // 3. gradient sums (sync_gradients: only the optimizer's on a data-parallel mesh).
      if (!k_.no_shard_) reduce();
      // 4. norm and numerators, the health check.
      world_.all_reduce(null_buf(4, comm::DType::f64))->wait();
      if (sp_.mesh.health.check)
        world_
            .all_gather(null_buf(1, comm::DType::i32),
                        null_buf(static_cast<std::size_t>(world_.size()), comm::DType::i32))
            ->wait();
      // 5. the update (MeshOptimizer::update).
      update();
    }
  }

 private:
  // The optimizer's unit gathers (MeshOptimizer::issue_gather / complete_gather).
  struct Gathers {
    struct Pending {
      std::vector<comm::WorkPtr> works;
    };
    SkeletonRun* run = nullptr;
    Pending issue(int u) {
      Pending p;
      for (const FlatClass& c : run->k_.classes_) {
        if (c.unit != u || run->group_->size() == 1 || c.numel == 0) continue;
        p.works.push_back(
            run->group_->all_gather(null_buf(count_of(run->shard(c)), run->sp_.param_dtype),
                                    null_buf(count_of(run->padded(c)), run->sp_.param_dtype)));
      }
      return p;
    }
    void complete(Pending& p) {
      for (const comm::WorkPtr& w : p.works) w->wait();
      p = Pending{};
    }
    void release(int /*u*/) {}
    int64_t elems(int u) const {
      int64_t n = 0;
      for (const FlatClass& c : run->k_.classes_)
        if (c.unit == u) n += run->padded(c);
      return n;
    }
  };
  using Residency = parallel::mesh_detail::Residency<Gathers>;

  int64_t shard(const FlatClass& c) const {
    return parallel::shard_elems(c.numel, group_->size(), k_.zero_);
  }
  int64_t padded(const FlatClass& c) const { return shard(c) * group_->size(); }
  const LocalParam& spec(std::size_t i) const { return k_.specs_[i]; }
  comm::DType numeric() const { return sp_.grad_dtype; }

  // MeshImpl::begin_uses / use / end_uses on the one chunk of a one-stage pipeline.
  void begin_uses(int mb, bool forward) {
    if (residency_)
      residency_->begin(mb, 0, forward,
                        parallel::mesh_detail::chunk_uses(
                            sp_.model, k_.wrap_of_, {0, sp_.model.layers}, true, true, forward));
  }
  void use() {
    if (residency_) residency_->next();
  }
  void end_uses() {
    if (residency_) residency_->end();
  }

  // mp_block_forward's compute reports for one sequence (tp_block.cpp, cp_attention.cpp,
  // ep_moe.cpp) on one TP and CP rank: the whole sequence, every head.
  void block_forward(int layer) {
    const ref::ModelConfig& m = sp_.model;
    const double s = m.seq_len, h = m.hidden, d = m.head_dim();
    world_.compute(costs::qkv(s, h, m.heads * d, m.kv_heads * d));
    world_.compute(costs::ulysses_forward(attention(), k_.elem_));
    world_.compute(costs::wo(s, m.heads * d, h));
    if (m.is_moe_layer(layer)) {
      world_.compute(costs::moe_router(s, h, m.moe->experts, k_.elem_));
      world_.compute(costs::moe_experts_forward(s * m.moe->top_k, h, m.ffn));
    } else {
      world_.compute(costs::mlp(s, h, m.ffn));
    }
  }
  void block_backward(int layer) {
    const ref::ModelConfig& m = sp_.model;
    const double s = m.seq_len, h = m.hidden, d = m.head_dim();
    if (m.is_moe_layer(layer)) {
      world_.compute(costs::moe_experts_backward(s * m.moe->top_k, h, m.ffn));
      world_.compute(costs::moe_router_backward(s, h, m.moe->experts));
    } else {
      world_.compute(costs::mlp_backward(s, h, m.ffn));
    }
    const bool selective = sp_.train.recompute == ref::Recompute::kSelective;
    if (selective) world_.compute(costs::ulysses_recompute(attention(), k_.elem_));
    world_.compute(costs::ulysses_backward(attention(), !selective, k_.elem_));
    world_.compute(costs::projections_backward(s, h, m.heads * d, m.kv_heads * d));
  }
  costs::UlyssesShape attention() const {
    const ref::ModelConfig& m = sp_.model;
    return {m.seq_len, m.heads, m.kv_heads, m.head_dim()};
  }

  // MeshImpl::forward.
  void forward(int mb) {
    const ref::ModelConfig& m = sp_.model;
    const int mbs = sp_.train.micro_batch;
    begin_uses(mb, true);
    use();  // the embedding
    for (int layer = 0; layer < m.layers; ++layer) {
      use();
      for (int i = 0; i < mbs; ++i) block_forward(layer);
    }
    use();  // the head
    for (int i = 0; i < mbs; ++i)
      world_.compute(costs::vocab_head_forward(m.seq_len, m.hidden, m.vocab, k_.elem_));
    end_uses();
  }

  // MeshImpl::backward.
  void backward(int mb) {
    const ref::ModelConfig& m = sp_.model;
    const int mbs = sp_.train.micro_batch;
    const bool last = mb == microbatches_ - 1;
    const bool bf16 = sp_.train.precision == ref::Precision::kBf16;
    const auto complete = [&](const auto& pick) {
      if (!bf16 && ddp_overlap() && last) issue_bucket(pick, false);
    };
    begin_uses(mb, false);
    use();  // the head
    for (int i = 0; i < mbs; ++i)
      world_.compute(costs::vocab_head_backward(m.seq_len, m.hidden, m.vocab, k_.elem_));
    complete([](const LocalParam& p) {
      return p.name == "final_norm.weight" || p.name == "lm_head.weight";
    });
    for (int layer = m.layers - 1; layer >= 0; --layer) {
      use();
      for (int i = 0; i < mbs; ++i) {
        if (sp_.train.recompute == ref::Recompute::kFull) block_forward(layer);
        block_backward(layer);
      }
      const std::string prefix = "layers." + std::to_string(layer) + ".";
      complete([&](const LocalParam& p) { return p.name.rfind(prefix, 0) == 0; });
    }
    complete([](const LocalParam& p) { return p.name == "embed.weight"; });
    end_uses();
    if (k_.no_shard_) {  // each microbatch's gradient summed (all_reduce_picked, per class)
      for (const bool expert : {false, true}) {
        int64_t n = 0;
        for (const LocalParam& p : k_.specs_)
          if (p.expert == expert) n += ref::numel_of(p.local_shape);
        if (n > 0 && world_.size() > 1) world_.all_reduce(null_buf(count_of(n), numeric()))->wait();
      }
    }
    if (ddp_overlap() && last) issue_bucket([](const LocalParam&) { return true; }, true);
  }

  bool ddp_overlap() const { return sp_.mesh.overlap && k_.zero_ <= 1 && !k_.no_shard_; }

  // MeshImpl::issue_bucket: the picked gradients join the open bucket, which goes once it holds
  // bucket_elems elements (or at the chunk's end: flush).
  template <class Pick>
  void issue_bucket(const Pick& pick, bool flush) {
    for (std::size_t i = 0; i < k_.specs_.size(); ++i) {
      const LocalParam& p = spec(i);
      if (!pick(p) || !bucketed_.insert(p.name).second) continue;
      bucket_.push_back(i);
      bucket_fill_ += count_of(ref::numel_of(p.local_shape));
    }
    if (bucket_.empty() || (!flush && bucket_fill_ < sp_.mesh.bucket_elems)) return;
    issue_reduce();
    bucket_.clear();
    bucket_fill_ = 0;
  }

  // MeshOptimizer::issue_reduce of the open bucket: per class, one all_reduce of its fresh
  // parameters' elements.
  void issue_reduce() {
    if (k_.zero_ >= 2) return;
    for (std::size_t ci = 0; ci < k_.classes_.size(); ++ci) {
      const FlatClass& c = k_.classes_[ci];
      if (c.numel == 0 || group_->size() == 1) continue;
      int64_t n = 0;
      for (const std::size_t i : c.specs) {
        if (issued_spec_[i] || std::find(bucket_.begin(), bucket_.end(), i) == bucket_.end())
          continue;
        issued_spec_[i] = true;
        n += ref::numel_of(spec(i).local_shape);
      }
      if (n > 0) issued_.emplace_back(ci, group_->all_reduce(null_buf(count_of(n), numeric())));
    }
  }

  // MeshOptimizer::reduce.
  void reduce() {
    for (std::size_t ci = 0; ci < k_.classes_.size(); ++ci) {
      const FlatClass& c = k_.classes_[ci];
      if (c.numel == 0) continue;
      if (k_.zero_ >= 2) {
        if (group_->size() > 1)
          group_
              ->reduce_scatter(null_buf(count_of(padded(c)), numeric()),
                               null_buf(count_of(shard(c)), numeric()))
              ->wait();
        if (replicas_ && replicas_->size() > 1)
          replicas_->all_reduce(null_buf(count_of(shard(c)), numeric()))->wait();
        continue;
      }
      if (group_->size() == 1) continue;
      int64_t rest = 0;
      for (const std::size_t i : c.specs)
        if (!issued_spec_[i]) rest += ref::numel_of(spec(i).local_shape);
      if (rest > 0) group_->all_reduce(null_buf(count_of(rest), numeric()))->wait();
      for (auto& [cls, work] : issued_)
        if (cls == ci) work->wait();
    }
    issued_.clear();
  }

  // MeshOptimizer::update: each class's owned range, the updated shards all_gathered (ZeRO-1/2),
  // then one AdamW report.
  void update() {
    int64_t owned = 0;
    const int r = group_->rank();
    for (const FlatClass& c : k_.classes_) {
      const int64_t sh = shard(c);
      owned +=
          k_.zero_ == 0 ? c.numel : std::min(c.numel, (r + 1) * sh) - std::min(c.numel, r * sh);
      if ((k_.zero_ == 1 || k_.zero_ == 2) && group_->size() > 1 && c.numel > 0)
        group_
            ->all_gather(null_buf(count_of(sh), sp_.param_dtype),
                         null_buf(count_of(padded(c)), sp_.param_dtype))
            ->wait();
    }
    world_.compute(costs::adamw(static_cast<double>(owned), sp_.recipe));
  }

  const Skeleton& k_;
  const SkeletonSpec& sp_;
  comm::Communicator& world_;
  comm::Communicator* group_;  // each class's sharding (and summing) group
  std::unique_ptr<comm::Communicator> shard_, replicas_;
  std::unique_ptr<Residency> residency_;
  int microbatches_ = 1;
  std::set<std::string> bucketed_;
  std::vector<std::size_t> bucket_;  // the open bucket: spec indices
  std::size_t bucket_fill_ = 0;
  std::vector<bool> issued_spec_;
  std::vector<std::pair<std::size_t, comm::WorkPtr>> issued_;
};

void Skeleton::run(comm::Communicator& dp) const {
  SkeletonRun(*this, dp).run();
}

}  // namespace shardcheck::harness

// The step skeleton of plan_skeleton.hpp. It follows the data-parallel engine that was
// parallel/engine.cpp (gone: every configuration trains on the mesh engine now; issue 17 moves
// the planner onto it) call for call (the order
// of acquires, prefetches, frees, reductions and waits), because the planner's claim is "this is
// the time of what the engine issues"; where it differs on purpose it says so here:
//   - compute per microbatch counts attention per sequence (n * block_forward_flops(s)); the
//     engine passes the microbatch's total token count as s, which overcounts the s^2 term when
//     micro_batch > 1;
//   - ZeRO-1/2's AdamW compute is issued before the updated-parameter all_gather (the engine issues
//     it after; both are serial on an idle comm stream, so the step time is the same).
#include "harness/plan_skeleton.hpp"

#include <algorithm>
#include <memory>

#include "harness/driver.hpp"
#include "harness/runner.hpp"
#include "parallel/flat.hpp"
#include "parallel/flops.hpp"
#include "parallel/layerwise.hpp"
#include "reference/model.hpp"

namespace shardcheck::harness {

namespace {

comm::DType master_dtype(ref::Precision p) {
  return p == ref::Precision::kF64 ? comm::DType::f64 : comm::DType::f32;
}

comm::Buffer null_buf(std::size_t count, comm::DType t) {
  return comm::Buffer{nullptr, count, t, {}};
}

}  // namespace

SkeletonSpec skeleton_spec(const Scenario& s, const ParallelSpec& p, int dp, int global_batch,
                           const comm::DType* reduce_dtype) {
  ParallelSpec q = p;
  q.mesh.dp = dp;
  SkeletonSpec k;
  k.model = s.model;
  k.recipe = parallel::recipe_of(s.train.precision);
  k.options = data_parallel_view(engine_options(s, q));
  k.param_dtype = s.train.precision == ref::Precision::kBf16 ? comm::DType::bf16
                                                             : master_dtype(s.train.precision);
  k.grad_dtype = reduce_dtype ? *reduce_dtype : master_dtype(s.train.precision);
  k.dp = dp;
  k.micro_batch = s.train.micro_batch;
  k.recompute = s.train.recompute;
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
  using parallel::Strategy;
  const ref::ModelConfig& m = spec_.model;
  const int units = parallel::unit_count(m);
  const int d = spec_.dp;
  parallel::FsdpOptions f = spec_.options.fsdp;
  const Strategy st = spec_.options.strategy;
  if (st == Strategy::zero3)
    f = {.sharding = parallel::ShardingStrategy::full_shard,
         .wrap = parallel::WrapPolicy::block,
         .reshard_after_forward = true,
         .prefetch = 0};
  std::vector<int> all(static_cast<std::size_t>(units));
  for (int u = 0; u < units; ++u) all[static_cast<std::size_t>(u)] = u;
  group_of_.assign(static_cast<std::size_t>(units), 0);
  const auto add = [&](const std::vector<int>& us, int shards, bool own_all) {
    std::vector<std::pair<std::string, ref::Shape>> shapes;
    for (int u : us) {
      group_of_[static_cast<std::size_t>(u)] = static_cast<int>(groups_.size());
      for (auto& e : parallel::unit_shapes(m, u)) shapes.push_back(std::move(e));
    }
    const parallel::FlatLayout l(shapes, shards);
    groups_.push_back({us, l.padded_numel(), l.shard_numel()});
    owned_elems_ += own_all ? l.numel() : l.shard_numel();
  };
  switch (st) {
    case Strategy::ddp:
    case Strategy::zero1: {
      full_buckets_ = true;
      gather_after_update_ = st == Strategy::zero1;
      add(all, d, st == Strategy::ddp);
      const parallel::FlatLayout layout(ref::param_shapes(m), d);
      buckets_ = layout.buckets(spec_.options.bucket_elems);
      for (const parallel::Range& b : buckets_) {
        bucket_units_.emplace_back();
        for (const parallel::Segment& s : layout.segments(b))
          bucket_units_.back().push_back(parallel::unit_of(m, s.param->name));
      }
      break;
    }
    case Strategy::zero2:
      sharded_grads_ = true;
      gather_after_update_ = true;
      add(all, d, false);
      break;
    case Strategy::zero3:
    case Strategy::fsdp: {
      const auto wraps = parallel::wrap_units(m, f.wrap, f.blocks_per_unit);
      if (f.sharding == parallel::ShardingStrategy::no_shard) {
        no_shard_ = true;
        for (const auto& w : wraps) add(w, 1, true);
        break;
      }
      sharded_params_ = sharded_grads_ = true;
      shard_size_ = d;
      if (f.sharding == parallel::ShardingStrategy::hybrid_shard) {
        if (f.shard_group_size < 1 || d % f.shard_group_size != 0)
          throw ScenarioError("$.parallel.fsdp.shard_group_size",
                              std::to_string(f.shard_group_size) + " does not divide the DP size " +
                                  std::to_string(d));
        shard_size_ = f.shard_group_size;
      }
      for (const auto& w : wraps) add(w, shard_size_, false);
      plan_ = parallel::residency_plan(m, f);
      break;
    }
  }
  const double seqs = spec_.micro_batch;
  for (int i = 0; i < m.layers; ++i)
    block_flops_.push_back(seqs * parallel::block_forward_flops(m, i, m.seq_len));
  head_flops_ = seqs * parallel::head_forward_flops(m, m.seq_len);
  for (const char* what : {"forward", "recompute", "backward"})
    for (int i = 0; i < m.layers; ++i)
      names_.push_back(std::string(what) + " " + parallel::unit_label(m, i + 1));
  names_.push_back("forward head");
  names_.push_back("backward head");
  names_.push_back("adamw");
}

std::vector<SplitRule> Skeleton::splits() const {
  if (spec_.options.strategy != parallel::Strategy::fsdp ||
      spec_.options.fsdp.sharding != parallel::ShardingStrategy::hybrid_shard)
    return {};
  const int s = spec_.options.fsdp.shard_group_size;
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
    if (spec_.recompute == ref::Recompute::kFull)
      recompute += parallel::block_forward_flops(spec_.model, i, spec_.model.seq_len);
    if (spec_.recompute == ref::Recompute::kSelective)
      recompute += parallel::attention_core_flops(spec_.model, spec_.model.seq_len);
  }
  return model_flops_per_step() + recompute * static_cast<double>(spec_.local_batch) * spec_.dp;
}

// One rank's execution of the skeleton: the engine's step state (held / in-flight gathers, unit
// readiness, pending reductions, buckets) without any data.
class SkeletonRun {
 public:
  SkeletonRun(const Skeleton& k, comm::Communicator& dp) : k_(k), dp_(dp), shard_(&dp) {}

  void run() {
    const SkeletonSpec& sp = k_.spec_;
    if (!k_.splits().empty()) {
      const int s = sp.options.fsdp.shard_group_size;
      const int r = dp_.rank();
      shard_own_ = dp_.split(r / s, r, {.name = "dp_shard"});
      replicate_ = dp_.split(r % s, r, {.name = "dp_replicate"});
      shard_ = shard_own_.get();
    }
    const int microbatches = sp.local_batch / sp.micro_batch;
    for (int step = 1; step <= sp.steps; ++step) {
      dp_.begin_step(step);
      dp_.all_reduce(null_buf(3, comm::DType::i64))->wait();  // loss denominators
      for (int mb = 0; mb < microbatches; ++mb) microbatch(mb == microbatches - 1);
      if (k_.full_buckets_) {
        issue_ready_buckets(true);
        for (const comm::WorkPtr& w : bucket_work_) w->wait();
        bucket_work_.clear();
      } else if (k_.sharded_grads_) {
        shard_->all_reduce(null_buf(1, comm::DType::f64))->wait();  // squared norm
      }
      dp_.all_reduce(null_buf(2, comm::DType::f64))->wait();  // loss numerators
      if (sp.health_check)
        dp_.all_gather(null_buf(1, comm::DType::i32),
                       null_buf(static_cast<std::size_t>(dp_.size()), comm::DType::i32))
            ->wait();
      const auto owned = static_cast<double>(k_.owned_elems_);
      dp_.compute(
          {k_.names_.back(), parallel::adamw_flops(owned),
           owned * static_cast<double>(sp.recipe.param + sp.recipe.grad + sp.recipe.optimizer())});
      if (k_.gather_after_update_) {
        const Skeleton::Unit& g = k_.groups_.front();
        dp_.all_gather(null_buf(g.shard, sp.param_dtype), null_buf(g.padded, sp.param_dtype))
            ->wait();
      }
    }
  }

 private:
  void microbatch(bool last) {
    const SkeletonSpec& sp = k_.spec_;
    const int layers = sp.model.layers;
    const int head = layers + 1;
    last_ = last;
    acquire_cursor_ = release_cursor_ = 0;
    held_.assign(k_.groups_.size(), false);
    pending_gather_.assign(k_.groups_.size(), nullptr);
    ready_.assign(k_.groups_.size(), 0);
    if (last) {
      unit_done_.assign(static_cast<std::size_t>(head + 1), false);
      next_bucket_ = 0;
    }
    acquire(0);
    release(0);
    for (int i = 0; i < layers; ++i) {
      acquire(i + 1);
      compute(static_cast<std::size_t>(i), k_.block_flops_[static_cast<std::size_t>(i)]);
      release(i + 1);
    }
    acquire(head);
    if (sp.model.tie_embeddings) acquire(0);
    compute(3 * static_cast<std::size_t>(layers), k_.head_flops_);
    compute(3 * static_cast<std::size_t>(layers) + 1, parallel::backward_flops(k_.head_flops_));
    release(head);
    if (sp.model.tie_embeddings) release(0);
    grads_ready(head);
    for (int i = layers - 1; i >= 0; --i) {
      const auto ui = static_cast<std::size_t>(i);
      acquire(i + 1);
      if (sp.recompute == ref::Recompute::kFull)
        compute(static_cast<std::size_t>(layers) + ui, k_.block_flops_[ui]);
      if (sp.recompute == ref::Recompute::kSelective)
        compute(static_cast<std::size_t>(layers) + ui,
                parallel::attention_core_flops(sp.model, sp.model.seq_len) * sp.micro_batch);
      compute(2 * static_cast<std::size_t>(layers) + ui,
              parallel::backward_flops(k_.block_flops_[ui]));
      release(i + 1);
      grads_ready(i + 1);
    }
    grads_ready(0);
    complete_reductions();
  }

  void compute(std::size_t name, double flops) { dp_.compute({k_.names_[name], flops, 0.0}); }

  void issue_gather(int w) {
    const Skeleton::Unit& g = k_.groups_[static_cast<std::size_t>(w)];
    const comm::DType t = k_.spec_.param_dtype;
    pending_gather_[static_cast<std::size_t>(w)] =
        shard_->all_gather(null_buf(g.shard, t), null_buf(g.padded, t));
  }

  void acquire(int unit) {
    if (!k_.sharded_params_) return;
    const int w = k_.group_of_[static_cast<std::size_t>(unit)];
    const std::size_t i = acquire_cursor_++;
    const auto uw = static_cast<std::size_t>(w);
    if (!held_[uw]) {
      if (!pending_gather_[uw]) issue_gather(w);
      pending_gather_[uw]->wait();
      pending_gather_[uw] = nullptr;
      held_[uw] = true;
    }
    for (int p : k_.plan_.prefetch_after(i)) {
      const auto up = static_cast<std::size_t>(p);
      if (!held_[up] && !pending_gather_[up]) issue_gather(p);
    }
  }

  void release(int unit) {
    if (!k_.sharded_params_) return;
    const std::size_t i = release_cursor_++;
    if (k_.plan_.free_after(i))
      held_[static_cast<std::size_t>(k_.group_of_[static_cast<std::size_t>(unit)])] = false;
  }

  void grads_ready(int unit) {
    const SkeletonSpec& sp = k_.spec_;
    if (k_.full_buckets_) {
      if (last_) {
        unit_done_[static_cast<std::size_t>(unit)] = true;
        if (sp.options.overlap) issue_ready_buckets(false);
      }
      return;
    }
    const int w = k_.group_of_[static_cast<std::size_t>(unit)];
    const Skeleton::Unit& g = k_.groups_[static_cast<std::size_t>(w)];
    if (++ready_[static_cast<std::size_t>(w)] < static_cast<int>(g.units.size())) return;
    ready_[static_cast<std::size_t>(w)] = 0;
    const comm::DType t = sp.grad_dtype;
    comm::WorkPtr work = k_.no_shard_
                             ? dp_.all_reduce(null_buf(g.padded, t))
                             : shard_->reduce_scatter(null_buf(g.padded, t), null_buf(g.shard, t));
    pending_reduce_.push_back({w, std::move(work)});
  }

  void complete_reductions() {
    for (auto& [w, work] : pending_reduce_) {
      work->wait();
      if (replicate_)
        replicate_
            ->all_reduce(
                null_buf(k_.groups_[static_cast<std::size_t>(w)].shard, k_.spec_.grad_dtype))
            ->wait();
    }
    pending_reduce_.clear();
  }

  void issue_ready_buckets(bool all) {
    while (next_bucket_ < k_.buckets_.size()) {
      if (!all)
        for (int u : k_.bucket_units_[next_bucket_])
          if (!unit_done_[static_cast<std::size_t>(u)]) return;
      bucket_work_.push_back(
          dp_.all_reduce(null_buf(k_.buckets_[next_bucket_].size(), k_.spec_.grad_dtype)));
      ++next_bucket_;
    }
  }

  const Skeleton& k_;
  comm::Communicator& dp_;
  comm::Communicator* shard_;
  std::unique_ptr<comm::Communicator> shard_own_, replicate_;
  bool last_ = false;
  std::size_t acquire_cursor_ = 0, release_cursor_ = 0;
  std::vector<bool> held_;
  std::vector<comm::WorkPtr> pending_gather_;
  std::vector<int> ready_;
  std::vector<bool> unit_done_;
  std::size_t next_bucket_ = 0;
  std::vector<comm::WorkPtr> bucket_work_;
  std::vector<std::pair<int, comm::WorkPtr>> pending_reduce_;
};

void Skeleton::run(comm::Communicator& dp) const {
  SkeletonRun(*this, dp).run();
}

}  // namespace shardcheck::harness

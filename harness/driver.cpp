// The step driver of driver.hpp: the engine every entry point builds, and the one training loop.
#include "harness/driver.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

namespace shardcheck::harness {

parallel::DataParallelOptions engine_options(const Scenario& s, const ParallelSpec& p) {
  parallel::DataParallelOptions opt;
  opt.strategy = p.fsdp        ? parallel::Strategy::fsdp
                 : p.zero == 0 ? parallel::Strategy::ddp
                 : p.zero == 1 ? parallel::Strategy::zero1
                 : p.zero == 2 ? parallel::Strategy::zero2
                               : parallel::Strategy::zero3;
  opt.bucket_elems = static_cast<std::size_t>(p.bucket_elems);
  if (p.fsdp) {
    using parallel::ShardingStrategy;
    using parallel::WrapPolicy;
    parallel::FsdpOptions& f = opt.fsdp;
    f.sharding = *p.fsdp == "shard_grad_op"  ? ShardingStrategy::shard_grad_op
                 : *p.fsdp == "no_shard"     ? ShardingStrategy::no_shard
                 : *p.fsdp == "hybrid_shard" ? ShardingStrategy::hybrid_shard
                                             : ShardingStrategy::full_shard;
    f.wrap = p.fsdp_wrap == "layer_group"   ? WrapPolicy::layer_group
             : p.fsdp_wrap == "whole_model" ? WrapPolicy::whole_model
                                            : WrapPolicy::block;
    f.blocks_per_unit = p.fsdp_blocks_per_unit;
    f.reshard_after_forward = p.fsdp_reshard_after_forward;
    f.prefetch = p.fsdp_prefetch;
    // PyTorch's HYBRID_SHARD default: shard inside a node, replicate across nodes.
    f.shard_group_size = p.fsdp_shard_group > 0 ? p.fsdp_shard_group
                                                : std::gcd(p.mesh.dp, s.topology.ranks_per_node);
  }
  opt.health.check = true;
  opt.health.policy = s.health.nan_policy == "stop" ? parallel::NonFinitePolicy::stop
                                                    : parallel::NonFinitePolicy::skip_step;
  return opt;
}

std::string strategy_name(const Scenario& s, const ParallelSpec& p) {
  if (model_parallel(p)) return "mesh";
  return std::string(parallel::name_of(engine_options(s, p).strategy));
}

namespace {

// On world rank `rank`: writes a NaN into the first element of every local gradient of the first
// microbatch at each nan_gradient fault's step (before any reduction).
parallel::GradHook nan_injector(const Scenario& s, int rank) {
  std::vector<int> steps;
  for (const FaultSpec& f : s.faults)
    if (f.kind == "nan_gradient" && f.rank == rank) steps.push_back(f.step);
  if (steps.empty()) return {};
  return [steps](int step, int microbatch, const std::string& /*param*/, comm::Buffer grad) {
    if (microbatch != 0 || grad.count == 0 ||
        std::find(steps.begin(), steps.end(), step) == steps.end())
      return;
    if (grad.dtype == comm::DType::f64) static_cast<double*>(grad.data)[0] = std::nan("");
    if (grad.dtype == comm::DType::f32) static_cast<float*>(grad.data)[0] = std::nanf("");
  };
}

}  // namespace

std::unique_ptr<Trainee> build_engine(comm::Communicator& c, const Scenario& s,
                                      const ParallelSpec& p, const BuildOptions& o) {
  parallel::DataParallelOptions opt = engine_options(s, p);
  if (o.inject_faults) opt.grad_hook = nan_injector(s, c.world_rank());
  opt.planted = o.planted;
  return make_trainee(c, s, p, opt);
}

TrainCursor drive(const Scenario& s, const ref::Dataset& ds, Trainee& engine,
                  const DriveOptions& o) {
  ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                  s.seed, s.data.drop_last);
  TrainCursor cursor;
  if (o.restore) {
    cursor = o.restore(engine);
    if (o.restore_sampler) sampler.restore(cursor.sampler);
  }
  if (o.started) o.started(cursor);
  const int last = o.last_step.value_or(s.train.steps);
  for (int k = cursor.step + 1; k <= last; ++k) {
    const std::vector<std::int64_t> ids = sampler.next_global_batch();
    const ref::Batch local = engine.local_batch(ds, ids);
    const auto t0 = std::chrono::steady_clock::now();
    const ref::StepRecord rec = engine.step(local);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cursor.step = k;
    cursor.consumed_samples += s.train.global_batch;
    cursor.consumed_tokens += rec.non_padding_tokens;
    cursor.sampler = sampler.state();
    if (o.after_step) o.after_step({ids, rec, cursor, seconds});
  }
  return cursor;
}

}  // namespace shardcheck::harness

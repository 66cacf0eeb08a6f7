// The step driver of driver.hpp: the engine every entry point builds, and the one training loop.
#include "harness/driver.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

namespace shardcheck::harness {

parallel::MeshOptions engine_options(const Scenario& s, const ParallelSpec& p) {
  parallel::MeshOptions o = parallel::mesh_options(p, s.topology.ranks_per_node);
  o.health.check = true;
  o.health.policy = s.health.nan_policy == "stop" ? parallel::NonFinitePolicy::stop
                                                  : parallel::NonFinitePolicy::skip_step;
  return o;
}

parallel::MeshOptions planning_options(const Scenario& s, const ParallelSpec& p) {
  parallel::MeshOptions o = engine_options(s, p);
  if (s.plan.attention_kernel == "flash") o.attention = parallel::AttentionKernel::flash;
  return o;
}

bool model_parallel(const ParallelSpec& p) {
  return p.model_parallel();
}

std::string strategy_name(const ParallelSpec& p) {
  return model_parallel(p) ? "mesh" : p.strategy_name();
}

std::string unsupported(const Scenario& s, const ParallelSpec& p) {
  try {
    parallel::validate_mesh(s.model, s.train, engine_options(s, p));
  } catch (const parallel::MeshConfigError& e) {
    return e.what();
  }
  return "";
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

std::unique_ptr<parallel::MeshEngine> build_engine(comm::Communicator& c, const Scenario& s,
                                                   const ParallelSpec& p, const BuildOptions& o) {
  parallel::MeshOptions opt = engine_options(s, p);
  if (o.inject_faults) opt.grad_hook = nan_injector(s, c.world_rank());
  opt.planted = o.planted;
  return std::make_unique<parallel::MeshEngine>(c, s.model, s.train, s.seed, std::move(opt));
}

TrainCursor drive(const Scenario& s, const ref::Dataset& ds, parallel::MeshEngine& engine,
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

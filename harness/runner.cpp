// The scenario runner. The reference Trainer and the parallel engines consume the same sampler
// batches; per step, the error is max(|loss - ref| / |ref|, max over tensors of
// max|p - p_ref| / max|p_ref|), over every rank's view of the gathered parameters.
#include "harness/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>

#include "parallel/data_parallel.hpp"
#include "parallel/parity.hpp"
#include "reference/data.hpp"
#include "reference/npy.hpp"
#include "reference/trainer.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

namespace {

struct Trace {
  std::vector<ref::StepRecord> steps;
  std::vector<ref::ParamMap<double>> params;  // after each step
};

Trace reference_run(const Scenario& s, const ref::Dataset& ds, const std::string& dump_dir) {
  ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                  s.seed, s.data.drop_last);
  ref::Trainer trainer(s.model, s.train, s.seed);
  std::optional<ref::TensorDumper> dumper;
  if (!dump_dir.empty()) {
    dumper.emplace(dump_dir);
    trainer.set_observer(
        [&](const std::string& name, const ref::HostArray& a) { dumper->add(name, a); });
  }
  Trace t;
  for (int n = 1; n <= s.train.steps; ++n) {
    t.steps.push_back(trainer.step(ref::gather_batch(ds, sampler.next_global_batch())));
    t.params.push_back(trainer.params());
  }
  if (dumper) dumper->write_index();
  return t;
}

// Why this configuration cannot run yet, or "" when the data-parallel engine covers it.
std::string unsupported(const ParallelSpec& p, const ref::TrainConfig& t) {
  const auto& m = p.mesh;
  if (m.tp > 1 || m.pp > 1 || m.cp > 1 || m.ep > 1)
    return "tensor, pipeline, context and expert parallelism are not built yet (issue 7)";
  (void)t;
  return "";
}

}  // namespace

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
    f.shard_group_size = p.fsdp_shard_group > 0
                             ? p.fsdp_shard_group
                             : std::gcd(p.mesh.dp, s.topology.ranks_per_node);
  }
  return opt;
}

namespace {

ConfigResult run_config(const Scenario& s, const ref::Dataset& ds, const Trace& want,
                        const ParallelSpec& p) {
  ConfigResult r;
  r.config = p.label();
  r.spec = p;
  r.tolerance = tolerance_for(s.train.precision);
  r.detail = unsupported(p, s.train);
  if (!r.detail.empty()) {
    r.supported = false;
    return r;
  }
  const parallel::DataParallelOptions opt = engine_options(s, p);
  r.strategy = std::string(parallel::name_of(opt.strategy));
  const int world = p.mesh.dp;
  std::vector<Trace> got(static_cast<std::size_t>(world));
  r.memory.resize(static_cast<std::size_t>(world));
  const auto t0 = std::chrono::steady_clock::now();
  sim::SimWorld(world).run([&](comm::Communicator& c) {
    parallel::DataParallelEngine engine(c, s.model, s.train, s.seed, opt);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, s.data.drop_last);
    Trace& mine = got[static_cast<std::size_t>(c.rank())];
    for (int n = 1; n <= s.train.steps; ++n) {
      const ref::Batch local =
          parallel::rank_batch(ds, sampler.next_global_batch(), c.rank(), c.size());
      mine.steps.push_back(engine.step(local));
      mine.params.push_back(engine.full_params());
    }
    const comm::MemoryTracker& m = c.memory();
    r.memory[static_cast<std::size_t>(c.rank())] =
        RankMemory{c.world_rank(), m.current(), m.at_peak(), m.peak(), m.peak_phase()};
  });
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double worst = -1;
  for (int k = 0; k < s.train.steps; ++k) {
    const auto uk = static_cast<std::size_t>(k);
    StepParity sp{k + 1, got[0].steps[uk].loss, want.steps[uk].loss, 0};
    for (std::size_t rank = 0; rank < got.size(); ++rank) {
      const double le = parallel::rel_err(got[rank].steps[uk].loss, want.steps[uk].loss);
      if (!(le <= sp.max_rel_err)) sp.max_rel_err = le;
      if (!(le <= worst)) {
        worst = le;
        r.detail = "largest error: rank " + std::to_string(rank) + " step " +
                   std::to_string(k + 1) + " loss";
      }
      for (const auto& e : want.params[uk]) {
        const ref::Tensor<double>* t = got[rank].params[uk].find(e.name);
        const double te = t ? parallel::tensor_rel_err(*t, e.value) : INFINITY;
        if (!(te <= sp.max_rel_err)) sp.max_rel_err = te;
        if (!(te <= worst)) {
          worst = te;
          r.detail = "largest error: rank " + std::to_string(rank) + " step " +
                     std::to_string(k + 1) + " " + e.name;
        }
      }
    }
    r.steps.push_back(sp);
    if (!(sp.max_rel_err <= r.max_rel_err)) r.max_rel_err = sp.max_rel_err;
  }
  r.pass = r.max_rel_err <= r.tolerance;
  return r;
}

}  // namespace

double tolerance_for(ref::Precision p) {
  switch (p) {
    case ref::Precision::kF64:
      return 1e-10;
    case ref::Precision::kF32:
      return 1e-5;
    case ref::Precision::kBf16:
      return 2e-2;
  }
  return 0;
}

bool RunResult::pass() const {
  return !configs.empty() &&
         std::all_of(configs.begin(), configs.end(), [](const ConfigResult& c) { return c.pass; });
}

RunResult run_scenario(const Scenario& s, const RunOptions& o) {
  RunResult out{s, {}};
  const ref::Dataset ds = ref::build_dataset(s.data, s.model, s.seed);
  if (static_cast<int64_t>(ds.samples.size()) < s.train.global_batch)
    throw ScenarioError("$.data.documents",
                        "the corpus packs into " + std::to_string(ds.samples.size()) +
                            " sequences, fewer than train.global_batch (" +
                            std::to_string(s.train.global_batch) + "); add documents");
  const int total = static_cast<int>(s.configs.size());
  if (o.progress) o.progress("reference", 0, total);
  const Trace want = reference_run(s, ds, o.dump_tensors);
  for (const ParallelSpec& p : s.configs) {
    if (o.progress) o.progress(p.label(), static_cast<int>(out.configs.size()) + 1, total);
    out.configs.push_back(run_config(s, ds, want, p));
  }
  return out;
}

}  // namespace shardcheck::harness

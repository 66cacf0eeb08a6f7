// The planner of plan.hpp: evaluation of each configuration on the symmetric clock (optionally
// cross-checked on a SimWorld meta run), the memory ledger, throughput and MFU, scaling curves,
// goodput and the ranking with its reasons. The formulas here are the ones harness/PLANNER.md
// states; keep the two in step.
#include "harness/plan.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "harness/driver.hpp"
#include "harness/plan_skeleton.hpp"
#include "harness/plan_text.hpp"
#include "harness/runner.hpp"
#include "harness/sim_options.hpp"
#include "parallel/mp/mesh_ledger.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/pipeline.hpp"
#include "sim/clock.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

namespace {

using Clock = std::chrono::steady_clock;
using plan_text::fmt;
using plan_text::gib;
using plan_text::kGiB;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The configuration at world size n: n / (its model-parallel ranks) data-parallel ranks.
int dp_at(const ParallelSpec& p, int n) {
  const int mp = p.mesh.tp * p.mesh.pp * p.mesh.cp;
  if (n % mp != 0)
    throw ScenarioError("$.plan.world_sizes",
                        "world size " + std::to_string(n) + " is not a multiple of " + p.label() +
                            "'s model-parallel ranks (" + std::to_string(mp) + ")");
  return n / mp;
}

// Memory of the configuration's fullest rank at DP size dp: the mesh engine's own ledger, for
// every configuration (the skeleton times that engine's step).
parallel::RankLedger ledger_at(const Scenario& s, const ParallelSpec& p, int dp) {
  ParallelSpec q = p;
  q.mesh.dp = dp;
  return parallel::mesh_ledger_fullest(s.model, s.train, planning_options(s, q));
}

// Strong (global batch fixed) and weak (per-rank batch fixed) curves over the plan's world sizes.
void scale(const Scenario& s, const PlanOptions& o, double device, ConfigPlan& c) {
  std::vector<int> sizes = s.plan.world_sizes;
  if (sizes.empty()) sizes.push_back(c.world_size);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const int per_rank = s.train.global_batch / c.spec.mesh.dp;  // per data-parallel rank
  const double tokens_per_seq = s.model.seq_len;
  for (int weak = 0; weak < 2; ++weak) {
    std::vector<ScalePoint>& out = weak ? c.weak : c.strong;
    const ScalePoint* base = nullptr;
    for (int n : sizes) {
      ScalePoint pt;
      pt.world_size = n;
      try {  // the ledger too: a mesh the engine refuses at this size is a point not evaluated
        const int dp = dp_at(c.spec, n);
        pt.global_batch = weak ? per_rank * dp : s.train.global_batch;
        pt.eval = evaluate(s, c.spec, dp, pt.global_batch, o, false, false);
        pt.memory_per_rank_bytes = ledger_at(s, c.spec, dp).row.total();
        pt.valid = true;
      } catch (const ScenarioError& e) {
        pt.why_not = e.what();
      } catch (const std::invalid_argument& e) {
        pt.why_not = e.what();
      }
      if (pt.valid) {
        pt.tokens_per_s = pt.global_batch * tokens_per_seq / pt.eval.step_time_s;
        pt.fits = static_cast<double>(pt.memory_per_rank_bytes) <= device;
      }
      out.push_back(pt);
    }
    for (ScalePoint& pt : out) {
      if (!pt.valid) continue;
      if (base == nullptr) base = &pt;
      pt.efficiency = pt.tokens_per_s /
                      (base->tokens_per_s * pt.world_size / static_cast<double>(base->world_size));
    }
  }
}

// The one-line why of each candidate, once best and fastest are known.
void explain(PlanResult& r) {
  const double dev = r.device_memory_bytes;
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    ConfigPlan& c = r.configs[i];
    const double mem = static_cast<double>(c.memory_per_rank_bytes);
    if (!c.not_built.empty()) {
      c.note = "not built by the engine yet: " + c.not_built;
      continue;
    }
    const std::string exposed = "; communication exposed " +
                                fmt("%.0f", 100.0 * c.eval.exposed_comm_s / c.eval.step_time_s) +
                                "% of the step";
    std::string n;
    const auto ratio = [&](const ConfigPlan& a, const ConfigPlan& b) {
      return fmt("%.2f", a.eval.step_time_s / b.eval.step_time_s) + "x";
    };
    if (static_cast<int>(i) == r.best) {
      n = "fastest that fits (" + gib(mem) + " GiB of " + gib(dev) + ")";
      if (r.fastest >= 0 && r.fastest != r.best) {
        const ConfigPlan& f = r.configs[static_cast<std::size_t>(r.fastest)];
        n += "; " + f.config + " is " + ratio(c, f) + " faster but needs " +
             gib(static_cast<double>(f.memory_per_rank_bytes)) + " GiB";
      }
    } else if (c.fits) {
      n = "fits (" + gib(mem) + " GiB of " + gib(dev) + ") but is " +
          ratio(c, r.configs[static_cast<std::size_t>(r.best)]) + " slower than " +
          r.configs[static_cast<std::size_t>(r.best)].config;
    } else {
      n = "does not fit: needs " + gib(mem) + " GiB of " + gib(dev) + " (" +
          plan_text::memory_parts(c.ledger) + ")";
      if (r.best >= 0) {
        const ConfigPlan& b = r.configs[static_cast<std::size_t>(r.best)];
        if (c.eval.step_time_s < b.eval.step_time_s)
          n += "; would be " + ratio(b, c) + " faster than " + b.config;
      }
    }
    if (c.eval.asymmetric) n += "; groups differ in size or link, times are an upper bound";
    if (c.spec.shards_params())
      n += "; each unit's gradient is reduce-scattered every microbatch during the backward "
           "(PyTorch FSDP's default), only the shards accumulate";
    else if (c.spec.zero_stage() == 2)
      n += "; gradients accumulate in a full local buffer and are reduce-scattered once per step "
           "(Megatron's grad buffer)";
    if (c.spec.mesh.pp > 1)
      n += "; pipeline bubble " + fmt("%.1f", 100.0 * c.bubble_fraction) + "% (formula " +
           fmt("%.1f", 100.0 * c.bubble_formula) + "%)";
    c.note = n + exposed;
  }
}

}  // namespace

Goodput goodput_of(const PlanSpec& f, int world, double step_s, double tokens_per_s) {
  Goodput g;
  const double lambda = world / (f.mtbf_gpu_hours * 3600.0);
  g.failure_rate_per_s = lambda;
  g.job_mtbf_s = 1.0 / lambda;
  const double delta = f.checkpoint_save_s, restart = f.restart_s;
  const auto fraction = [&](double tau) {
    const double cycle = tau + delta;
    return tau / cycle * std::max(0.0, 1.0 - lambda * (cycle / 2.0 + restart));
  };
  // Young's interval sqrt(2 delta / lambda), in whole steps (at least one).
  const double young_s = std::sqrt(2.0 * delta / lambda);
  g.young_interval_steps = std::max(1.0, std::round(young_s / step_s));
  g.fraction_at_young = fraction(g.young_interval_steps * step_s);
  if (f.checkpoint_every_steps == 0) {
    g.note =
        "plan.checkpoint_every_steps is 0: a failure loses everything since the start, so "
        "goodput depends on the run length (not modelled)";
    return g;
  }
  g.valid = true;
  g.interval_s = f.checkpoint_every_steps * step_s;
  g.fraction = fraction(g.interval_s);
  g.effective_tokens_per_s = tokens_per_s * g.fraction;
  if (lambda * (g.interval_s + delta) > 0.1)
    g.note =
        "failures are frequent against the interval (lambda*(tau+delta) > 0.1): the "
        "first-order estimate is optimistic";
  return g;
}

namespace {

// What evaluate() and stage_lower_bounds() time: p's skeleton at dp data-parallel ranks and this
// global batch, its world size, and the scenario's topology at the plan's compute efficiency.
struct TimedSkeleton {
  Skeleton skeleton;
  int world = 1;
  sim::Topology topology;
};

TimedSkeleton timed_skeleton(const Scenario& s, const ParallelSpec& p, int dp, int global_batch,
                             const PlanOptions& o) {
  parallel::TimingSpec spec =
      skeleton_spec(s, p, dp, global_batch, o.reduce_dtype ? &*o.reduce_dtype : nullptr);
  spec.steps = o.steps;
  const int world = dp * p.mesh.tp * p.mesh.pp * p.mesh.cp;
  sim::Topology topo = sim_options(s, world).topology;
  topo.compute_efficiency = o.compute_efficiency;
  return {Skeleton(std::move(spec)), world, topo};
}

// The layouts of k's splits on this world and topology, shared by this thread's clocks of the
// same splits, world, nodes and links (the last few meshes: a search bounds and times many
// settings of each).
std::shared_ptr<sim::SplitMemo> split_memo(const Skeleton& k, int world, const sim::Topology& g) {
  char links[160];
  std::snprintf(links, sizeof links, " world %d nodes of %d links %.17g %.17g %.17g %.17g", world,
                g.ranks_per_node, g.intra_node.bandwidth_gbps, g.intra_node.latency_us,
                g.inter_node.bandwidth_gbps, g.inter_node.latency_us);
  thread_local std::map<std::string, std::shared_ptr<sim::SplitMemo>> memos;
  if (memos.size() > 64) memos.clear();
  std::shared_ptr<sim::SplitMemo>& m = memos[k.split_key() + links];
  if (!m) m = sim::make_split_memo();
  return m;
}

}  // namespace

std::string gemm_model_text(const TopologySpec& t) {
  if (t.sm_count == 0) return "every GEMM at the compute efficiency (topology.device.sm_count 0)";
  return "whole " + std::to_string(t.gemm_tile_m) + " x " + std::to_string(t.gemm_tile_n) +
         " tiles in waves of " + std::to_string(t.sm_count) + " SMs";
}

Representatives representatives(const ParallelSpec& p, int dp) {
  using comm::Axis;
  comm::MeshShape shape = p.mesh;
  shape.dp = dp;
  const comm::DeviceMesh m(shape, p.order);
  Representatives out;
  out.class_of = [m](int r) { return m.coord(r, Axis::pp); };
  out.reps = m.group(0, Axis::pp);  // group rank = pp coordinate
  return out;
}

StepEval evaluate(const Scenario& s, const ParallelSpec& p, int dp, int global_batch,
                  const PlanOptions& o, bool simulate, bool bubble) {
  const auto t0 = Clock::now();
  const TimedSkeleton timed = timed_skeleton(s, p, dp, global_batch, o);
  const Skeleton& k = timed.skeleton;
  const int world = timed.world;
  const sim::Topology& topo = timed.topology;
  StepEval e;
  if (simulate) {
    sim::SimOptions so;
    so.topology = topo;
    so.meta = true;
    so.record_timeline = false;
    sim::SimWorld w(world, so);
    w.run([&](comm::Communicator& c) { k.run(c); });
    e.step_time_s = sim::summarize(w.step_times()).step_time;
  } else if (const Representatives reps = representatives(p, dp); reps.reps.size() > 1) {
    const auto run = [&](const sim::Topology& t) {
      sim::StageWorld w(world, t, k.splits(), reps.class_of, reps.reps);
      const std::shared_ptr<sim::SplitMemo> splits = split_memo(k, world, t);
      w.run([&](sim::SymmetricClock& c) {
        c.share_splits(splits);
        k.run_replaying(c);
      });
      return w;
    };
    const sim::StageWorld w = run(topo);
    e.step_time_s = sim::summarize(w.step_times()).step_time;
    std::vector<double> compute;  // per stage, per step
    for (const std::vector<sim::ClockStep>& steps : w.stage_steps()) {
      double busy = 0, comm = 0;
      std::size_t ops = 0;
      for (const sim::ClockStep& st : steps) {
        busy += st.compute_busy;
        comm += st.comm_busy;
        ops += st.comm_ops;
      }
      const auto n = static_cast<double>(std::max<std::size_t>(1, steps.size()));
      compute.push_back(busy / n);
      if (busy / n > e.compute_s) {  // the busiest stage
        e.compute_s = busy / n;
        e.comm_s = comm / n;
        e.comm_ops = static_cast<std::size_t>(static_cast<double>(ops) / n);
      }
    }
    e.exposed_comm_s = std::max(0.0, e.step_time_s - e.compute_s);
    e.asymmetric = w.asymmetric();
    // The schedule's own bubble: the same step with free communication.
    if (bubble && p.mesh.pp > 1) {
      sim::Topology free = topo;
      for (sim::Link* l : {&free.intra_node, &free.inter_node}) *l = {1e30, 0};
      const double free_step = sim::summarize(run(free).step_times()).step_time;
      double idle = 0;
      for (const double c : compute) idle += 1 - c / free_step;
      e.bubble_fraction = idle / static_cast<double>(compute.size());
    }
  } else {
    sim::SymmetricClock c(world, topo, k.splits());
    c.share_splits(split_memo(k, world, topo));
    k.run_replaying(c);
    const std::vector<sim::ClockStep> steps = c.steps();
    for (const sim::ClockStep& st : steps) {
      e.step_time_s += st.seconds();
      e.compute_s += st.compute_busy;
      e.comm_s += st.comm_busy;
      e.comm_ops += st.comm_ops;
    }
    const auto n = static_cast<double>(std::max<std::size_t>(1, steps.size()));
    e.step_time_s /= n;
    e.compute_s /= n;
    e.comm_s /= n;
    e.comm_ops = static_cast<std::size_t>(static_cast<double>(e.comm_ops) / n);
    e.exposed_comm_s = std::max(0.0, e.step_time_s - e.compute_s);
    e.asymmetric = c.asymmetric();
  }
  e.wall_s = seconds_since(t0);
  return e;
}

namespace {

// The representatives of the distinct stage programs (the first of each): stages that hold the
// same layers' kinds per chunk, the embedding or not, the head or not.
std::vector<int> distinct_stages(const ref::ModelConfig& m, const ParallelSpec& p,
                                 const std::vector<int>& reps) {
  std::set<std::vector<int>> seen;
  std::vector<int> out;
  for (std::size_t stage = 0; stage < reps.size(); ++stage) {
    const parallel::StagePlan plan =
        parallel::stage_plan(m, p.mesh.pp, p.virtual_stages, static_cast<int>(stage));
    std::vector<int> kinds = {plan.has_embed, plan.has_head};
    for (const auto& [first, last] : plan.chunk_layers) {
      kinds.push_back(-1);
      for (int l = first; l < last; ++l) kinds.push_back(m.is_moe_layer(l));
    }
    if (seen.insert(kinds).second) out.push_back(reps[stage]);
  }
  return out;
}

}  // namespace

std::vector<StageLowerBound> stage_lower_bounds(const Scenario& s, const ParallelSpec& p, int dp,
                                                int global_batch, const PlanOptions& o,
                                                bool every_stage) {
  const TimedSkeleton t = timed_skeleton(s, p, dp, global_batch, o);
  const std::shared_ptr<sim::SplitMemo> splits = split_memo(t.skeleton, t.world, t.topology);
  std::vector<int> reps = representatives(p, dp).reps;
  if (!every_stage) reps = distinct_stages(s.model, p, reps);
  std::vector<StageLowerBound> out;
  for (const int rep : reps) {
    sim::SymmetricClock c(t.world, t.topology, t.skeleton.splits(), rep);
    c.list_groups(Skeleton::block_groups());
    c.share_splits(splits);
    c.bound_only();
    t.skeleton.run_replaying(c);
    StageLowerBound b;
    const std::vector<sim::ClockStep> steps = c.steps();
    for (const sim::ClockStep& st : steps) {
      b.forced += st.forced_busy;
      b.listed += st.forced_listed;
    }
    const auto n = static_cast<double>(std::max<std::size_t>(1, steps.size()));
    out.push_back({b.forced / n, b.listed / n});
  }
  return out;
}

double stage_bound(const Scenario& s, const ParallelSpec& p, int global_batch,
                   const PlanOptions& o) {
  const int dp = p.mesh.dp;
  const int mb = s.train.micro_batch;
  const int m = global_batch / dp / mb;
  // Every schedule needs a microbatch per stage; interleaving goes in groups of pp.
  const int m1 = p.mesh.pp;
  if (m <= 2 * m1) {
    double bound = 0;
    for (const StageLowerBound& b : stage_lower_bounds(s, p, dp, global_batch, o))
      bound = std::max(bound, b.forced);
    return bound;
  }
  // ZeRO-3 / FSDP: whether a unit's gather or reduce_scatter waits at once depends on where the
  // schedule puts its microbatch (residency, prefetch, the reduce in flight), so the line goes
  // through the listed bound, which leaves those out.
  const bool sharded = p.shards_params();
  const auto pick = [&](const StageLowerBound& b) { return sharded ? b.listed : b.forced; };
  // The second point: one microbatch more (GPipe, 1F1B), another group of pp (interleaved).
  const int m2 = p.virtual_stages > 1 ? 2 * m1 : m1 + 1;
  const std::vector<StageLowerBound> a = stage_lower_bounds(s, p, dp, dp * mb * m1, o);
  const std::vector<StageLowerBound> b = stage_lower_bounds(s, p, dp, dp * mb * m2, o);
  double bound = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    bound = std::max(
        bound, pick(a[i]) + (pick(b[i]) - pick(a[i])) * static_cast<double>(m - m1) / (m2 - m1));
  return bound;
}

double stage_bound_any_order(const Scenario& s, const ParallelSpec& p, int global_batch,
                             const PlanOptions& o) {
  Scenario best = s;
  TopologySpec& t = best.topology;
  const LinkSpec link{std::max(t.intra_node.bandwidth_gbps, t.inter_node.bandwidth_gbps),
                      std::min(t.intra_node.latency_us, t.inter_node.latency_us)};
  t.intra_node = link;
  t.inter_node = link;
  return stage_bound(best, p, global_batch, o);
}

namespace {

// Strong scaling keeps train.global_batch at every plan.world_sizes entry: each configuration the
// engine builds must split it into whole microbatches over its data-parallel ranks there.
void check_world_sizes(const Scenario& s) {
  for (std::size_t i = 0; i < s.plan.world_sizes.size(); ++i) {
    const int n = s.plan.world_sizes[i];
    for (const ParallelSpec& p : s.configs) {
      const int mp = p.mesh.tp * p.mesh.pp * p.mesh.cp;
      if (n % mp != 0 || !unsupported(s, p).empty()) continue;  // a point "not evaluated"
      const long long dp = n / mp, mb = s.train.micro_batch;
      if (s.train.global_batch % (dp * mb) == 0) continue;
      throw ScenarioError(
          "$.plan.world_sizes[" + std::to_string(i) + "]",
          "world size " + std::to_string(n) + ": configuration " + p.label() + " would have " +
              std::to_string(dp) + " data-parallel ranks, and train.global_batch " +
              std::to_string(s.train.global_batch) + " is not a multiple of " + std::to_string(dp) +
              " x train.micro_batch " + std::to_string(mb) +
              " (strong scaling keeps the global batch); use world sizes whose data-parallel "
              "size divides " +
              std::to_string(s.train.global_batch) + " / " + std::to_string(mb));
    }
  }
}

}  // namespace

PlanResult plan_scenario(const Scenario& s, const PlanOptions& o) {
  if (!(o.compute_efficiency > 0 && o.compute_efficiency <= 1))
    throw ScenarioError("--compute-efficiency", "expected a number in (0, 1]");
  if (o.steps < 1) throw ScenarioError("--steps", "expected at least 1");
  check_world_sizes(s);
  const auto t0 = Clock::now();
  PlanResult r;
  r.scenario = s.name;
  r.description = s.description;
  r.device_memory_bytes = s.topology.memory_gib * kGiB;
  r.compute_efficiency = o.compute_efficiency;
  r.attention_kernel = s.plan.attention_kernel;
  r.moe_routing = s.plan.moe_routing;
  r.bf16_rounding = s.plan.bf16_rounding;
  r.gemm_model = gemm_model_text(s.topology);
  const double peak = s.topology.peak_tflops * 1e12;
  for (const ParallelSpec& p : s.configs) {
    ConfigPlan c;
    c.config = p.label();
    c.spec = p;
    c.world_size = p.mesh.world_size();
    c.not_built = unsupported(s, p);  // every row's memory is the engine's ledger
    if (!c.not_built.empty()) {       // a valid mesh the engine does not build: no ledger to read
      r.configs.push_back(c);
      continue;
    }
    c.placement = placement_of(s, p);
    if (p.mesh.pp > 1)  // each stage's fullest rank, and the fullest of them
      c.stages = parallel::mesh_ledger_stages(s.model, s.train, planning_options(s, p));
    const parallel::RankLedger fullest =
        c.stages.empty() ? ledger_at(s, p, p.mesh.dp) : parallel::fullest_of(c.stages);
    c.ledger = fullest.row;
    c.memory_rank = fullest.rank;
    c.memory_per_rank_bytes = c.ledger.total();
    c.fits = static_cast<double>(c.memory_per_rank_bytes) <= r.device_memory_bytes;
    c.modelled = true;
    const int dp = p.mesh.dp, n = c.world_size;
    c.strategy = p.strategy_name();
    if (const parallel::Fsdp* f = p.fsdp())
      c.strategy += ":" + std::string(parallel::name_of(f->sharding));
    const parallel::TimingSpec spec =
        skeleton_spec(s, p, dp, s.train.global_batch, o.reduce_dtype ? &*o.reduce_dtype : nullptr);
    r.reduce_dtype = std::string(comm::name_of(spec.grad_dtype));
    const Skeleton k(spec);
    c.eval = evaluate(s, p, dp, s.train.global_batch, o);
    c.bubble_fraction = c.eval.bubble_fraction;
    if (p.mesh.pp > 1)
      c.bubble_formula = parallel::bubble_formula(
          p.mesh.pp, s.train.global_batch / dp / s.train.micro_batch, p.virtual_stages);
    c.tokens_per_step = static_cast<double>(s.train.global_batch) * s.model.seq_len;
    c.tokens_per_s = c.tokens_per_step / c.eval.step_time_s;
    c.model_flops_per_step = k.model_flops_per_step();
    c.mfu = c.model_flops_per_step / (c.eval.step_time_s * n * peak);
    c.hfu = k.hardware_flops_per_step() / (c.eval.step_time_s * n * peak);
    c.goodput = goodput_of(s.plan, n, c.eval.step_time_s, c.tokens_per_s);
    scale(s, o, r.device_memory_bytes, c);
    r.configs.push_back(std::move(c));
  }
  // The SimWorld cross-checks last, once the guard has seen what they will run.
  std::vector<SimulateWork> work;
  for (const ConfigPlan& c : r.configs)
    if (c.modelled && o.simulate_ranks >= c.world_size)
      work.push_back({c.config, c.world_size, c.eval.comm_ops, o.steps});
  if (!work.empty() && o.check_simulate) o.check_simulate(work);
  for (ConfigPlan& c : r.configs) {
    if (!c.modelled || o.simulate_ranks < c.world_size) continue;
    c.simulated = evaluate(s, c.spec, c.spec.mesh.dp, s.train.global_batch, o, true);
    c.simulated_rel_diff =
        std::fabs(c.simulated->step_time_s - c.eval.step_time_s) / c.eval.step_time_s;
  }
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    const ConfigPlan& c = r.configs[i];
    if (!c.modelled) continue;
    const auto faster = [&](int j) {
      return j < 0 || c.eval.step_time_s < r.configs[static_cast<std::size_t>(j)].eval.step_time_s;
    };
    if (faster(r.fastest)) r.fastest = static_cast<int>(i);
    if (c.fits && faster(r.best)) r.best = static_cast<int>(i);
  }
  r.scaling_config = r.best >= 0 ? r.best : r.fastest;
  explain(r);
  r.wall_s = seconds_since(t0);
  return r;
}

}  // namespace shardcheck::harness
